#include "harness/core/bytes.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf {

Bytes checked_add(Bytes a, Bytes b, std::string_view what) {
  Bytes r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw InputError(std::string(what), "size overflows 64 bits");
  return r;
}

Bytes checked_sub(Bytes a, Bytes b, std::string_view what) {
  if (b > a) throw InputError(std::string(what), fmt::format("size would be negative ({} - {})", a, b));
  return a - b;
}

Bytes checked_mul(Bytes a, Bytes b, std::string_view what) {
  Bytes r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw InputError(std::string(what), "size overflows 64 bits");
  return r;
}

Bytes checked_round_up(Bytes value, Bytes align, std::string_view what) {
  if (align == 0) return value;
  const Bytes rem = value % align;
  return rem == 0 ? value : checked_add(value, align - rem, what);
}

Bytes scale_bytes(Bytes value, double factor, std::string_view what) {
  if (!std::isfinite(factor) || factor < 0) throw InputError(std::string(what), "factor must be finite and >= 0");
  const long double r = static_cast<long double>(value) * static_cast<long double>(factor);
  if (r >= 18446744073709551616.0L) throw InputError(std::string(what), "size overflows 64 bits");
  return static_cast<Bytes>(r);
}

namespace {

struct Unit {
  std::string_view suffix;
  Bytes scale;
};

// Longest suffixes first so "MiB" is not read as "B". Every unit is binary: "MB" and "M" mean MiB,
// as they do in ComfyUI's and PyTorch's logs (docs/formats.md).
constexpr Unit kUnits[] = {
    {"KiB", KiB}, {"MiB", MiB}, {"GiB", GiB}, {"TiB", GiB * 1024}, {"KB", KiB}, {"MB", MiB},
    {"GB", GiB},  {"TB", GiB * 1024},         {"K", KiB},          {"M", MiB},  {"G", GiB},
    {"T", GiB * 1024},                         {"B", 1},
};

}  // namespace

Bytes parse_size(std::string_view text, std::string_view what) {
  const std::string field(what);
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) throw InputError(field, "empty size");
  if (s.front() == '-') throw InputError(field, fmt::format("size must not be negative: \"{}\"", text));

  size_t num_end = 0;
  while (num_end < s.size() && (std::isdigit(static_cast<unsigned char>(s[num_end])) || s[num_end] == '.')) ++num_end;
  const std::string_view number = s.substr(0, num_end);
  std::string_view unit = s.substr(num_end);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  if (number.empty()) throw InputError(field, fmt::format("not a size: \"{}\" (examples: 24GiB, 400MiB, 1048576)", text));

  Bytes scale = 1;
  if (!unit.empty()) {
    bool found = false;
    for (const Unit& u : kUnits) {
      if (unit == u.suffix) {
        scale = u.scale;
        found = true;
        break;
      }
    }
    if (!found) {
      throw InputError(field, fmt::format("unknown unit \"{}\" in \"{}\" (use B, KiB, MiB, GiB or TiB; KB, MB, GB, TB and K, M, G, T "
                                          "are accepted as the same binary units)",
                                          unit, text));
    }
  }

  if (number.find('.') == std::string_view::npos) {
    Bytes n = 0;
    const auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), n);
    if (ec == std::errc::result_out_of_range) throw InputError(field, fmt::format("size overflows 64 bits: \"{}\"", text));
    if (ec != std::errc() || ptr != number.data() + number.size()) throw InputError(field, fmt::format("not a size: \"{}\"", text));
    return checked_mul(n, scale, field);
  }
  // Fractions ("1.5GiB") are accepted with a unit only and must land on a whole byte.
  if (scale == 1) throw InputError(field, fmt::format("a fractional size needs a unit: \"{}\"", text));
  double v = 0;
  const auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
  if (ec != std::errc() || ptr != number.data() + number.size() || !std::isfinite(v)) {
    throw InputError(field, fmt::format("not a size: \"{}\"", text));
  }
  const long double bytes = static_cast<long double>(v) * static_cast<long double>(scale);
  if (bytes >= 18446744073709551616.0L) throw InputError(field, fmt::format("size overflows 64 bits: \"{}\"", text));
  if (bytes != std::floor(bytes)) throw InputError(field, fmt::format("\"{}\" is not a whole number of bytes", text));
  return static_cast<Bytes>(bytes);
}

double to_mib(Bytes b) { return static_cast<double>(b) / static_cast<double>(MiB); }

std::string format_mib(Bytes b) { return fmt::format("{:.2f} MiB", to_mib(b)); }

std::string format_signed_mib(std::int64_t delta) {
  return fmt::format("{}{:.2f} MiB", delta < 0 ? "-" : "+",
                     static_cast<double>(delta < 0 ? -static_cast<double>(delta) : static_cast<double>(delta)) /
                         static_cast<double>(MiB));
}

std::string format_size(Bytes b) {
  if (b % GiB == 0) return fmt::format("{} GiB", b / GiB);
  if (b >= GiB) return fmt::format("{:.2f} GiB", static_cast<double>(b) / static_cast<double>(GiB));
  if (b % MiB == 0) return fmt::format("{} MiB", b / MiB);
  return format_mib(b);
}

}  // namespace vf

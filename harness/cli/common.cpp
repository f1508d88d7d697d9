#include <charconv>
#include <cmath>
#include <set>
#include <system_error>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/cli/commands.h"
#include "harness/core/error.h"
#include "harness/predictors/external.h"
#include "harness/repro.h"
#include "harness/sim/allocator.h"

namespace vf::cli {

namespace {

// CLI11 (2.1) converts unsigned options with strtoull(text, base 0): "-5" becomes 2^64 - 5, a
// value past 2^64 - 1 becomes 2^64 - 1 (clamped without a word), "010" is octal 8 and "0x10" hex.
// So the validators take decimal digits only, refuse a value beyond 64 bits, and hand CLI11 the
// digits without leading zeros (which it then reads as the decimal they are): they rewrite the
// value, so options take them with ->transform(), not ->check() (which discards the rewrite).
std::string check_decimal_u64(std::string& v, bool at_least_one) {
  const std::string given = v;
  const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
  if (!digits) {
    if (at_least_one) return "must be a whole number of at least 1, got " + given;
    const auto first = v.find_first_not_of(" \t");
    if (first != std::string::npos && v[first] == '-') return "must not be negative, got " + given;
    return "must be a whole number (decimal digits), got " + given;
  }
  const auto nz = v.find_first_not_of('0');
  v = nz == std::string::npos ? "0" : v.substr(nz);
  std::uint64_t parsed = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), parsed);
  if (ec == std::errc::result_out_of_range) return "overflows 64 bits (at most 18446744073709551615), got " + given;
  if (ec != std::errc() || ptr != v.data() + v.size()) return "must be a whole number, got " + given;
  if (at_least_one && parsed == 0) return "must be a whole number of at least 1, got " + given;
  return std::string();
}

}  // namespace

const CLI::Validator kNonNegative([](std::string& v) { return check_decimal_u64(v, false); }, "NONNEGATIVE");

// A count that must be at least 1 (0 would otherwise mean "the default" somewhere downstream).
const CLI::Validator kPositiveCount([](std::string& v) { return check_decimal_u64(v, true); }, "COUNT");

void PolicyFlags::add_to(CLI::App& app, bool with_allocator) {
  app.add_option("--policy", policy,
                 "predictor: comfy:oct2025 | comfy:nov2025 | comfy:dec2025 | comfy:feb2026 | comfy:sep2026 (= comfy:dynamic) | "
                 "exact[:PRESET]; fuzz: a comma-separated list, one drawn per case");
  app.add_option("--reserve", reserve, "override the reserve (e.g. 600MiB)");
  app.add_option("--set", sets, "override a policy constant: key=value (repeatable, each key once)");
  app.add_option("--activations", activations,
                 "what sizes each forward's activations: model (vramfuzz's formula, the default) | estimate (the predictor's "
                 "own budget for them) | capped (the formula, never above that budget) | profile:FILE (measured peaks, "
                 "docs/activations.md); fuzz: models without a profile entry use the formula");
  if (with_allocator) {
    app.add_option("--allocator", allocator, "allocator mode: raw | caching | caching-expandable | async (or native, cudaMallocAsync)");
    app.add_option("--option", options, "allocator option: key=value (repeatable, each key once), e.g. max_split_size_mb=128");
  }
}

std::vector<std::pair<std::string, std::string>> PolicyFlags::overrides() const {
  // Each constant once: `--set reserve=1GiB --set reserve=2GiB` (or --reserve with --set reserve=)
  // is a contradiction to report, not a last-wins to guess at.
  std::vector<std::pair<std::string, std::string>> out;
  if (!reserve.empty()) {
    (void)parse_size(reserve, "--reserve");  // a bad value is reported as "--reserve: ...", not "--reserve.reserve"
    out.emplace_back("reserve", reserve);
  }
  for (const std::string& kv : sets) {
    auto [k, v] = split_kv(kv, "--set");
    for (const auto& [ok, ov] : out) {
      if (ok != k) continue;
      throw InputError("--set " + k, fmt::format("given twice (\"{}\" and \"{}\"{}); keep one", ov, v,
                                                 k == "reserve" && !reserve.empty() ? ", one of them by --reserve" : ""));
    }
    out.emplace_back(std::move(k), std::move(v));
  }
  return out;
}

void PolicyFlags::apply(Scenario& s) const {
  if (!policy.empty()) {
    const auto overrides = s.policy.overrides;
    s.policy = parse_policy(policy, "--policy");
    // --policy replaces the preset; the constants the file overrides stay overridden (they are
    // what the case is about), and the log says which: --set changes one.
    std::string kept;
    for (const auto& [k, v] : overrides) {
      if (k != "exact_reserve" || s.policy.predictor == PredictorKind::exact) kept += fmt::format(" {}={}", k, v);
    }
    if (!kept.empty()) spdlog::warn("--policy {}: keeping the scenario's policy overrides:{} (--set KEY=VALUE changes one)", policy, kept);
    for (const auto& [k, v] : overrides) {
      // exact_reserve means something to `exact` only (a fuzz-import repro carries `bound`):
      // under another predictor the file's own reserve rules, as `reserve` does.
      if (k == "exact_reserve" && s.policy.predictor != PredictorKind::exact) {
        spdlog::warn("--policy {}: the scenario's exact_reserve={} applies to the exact predictor only; dropped", policy, v);
        continue;
      }
      // The file's, not a flag's: one the new predictor does not apply is named as the file's
      // field below.
      apply_policy_override(s.policy, k, v, "--policy", OverrideFrom::file);
    }
  }
  for (const auto& [k, v] : overrides()) apply_policy_override(s.policy, k, v, k == "reserve" && !reserve.empty() ? "--reserve" : "--set");
  require_overrides_applied(s);
  if (!activations.empty()) s.activations = parse_activation_flag(activations, "--activations");
  if (!allocator.empty()) {
    const AllocatorMode m = parse_allocator_mode_field(allocator, "--allocator");
    if (m != s.allocator.mode) s.allocator.options.clear();
    s.allocator.mode = m;
  }
  // A flag replaces the file's value of its option; the same option twice on the command line is
  // an error (docs/allocators.md: "a key given twice ... is an input error").
  std::set<std::string> from_flags;
  for (const std::string& kv : options) {
    auto [k, v] = split_kv(kv, "--option");
    if (!from_flags.insert(k).second) throw InputError("--option " + k, "given twice; keep one value");
    bool replaced = false;
    for (auto& [ok, ov] : s.allocator.options) {
      if (ok == k) {
        ov = v;
        replaced = true;
      }
    }
    if (!replaced) s.allocator.options.emplace_back(k, v);
  }
  // Errors name the flag for options given as flags, the file's field for the others.
  sim::normalize_allocator_config(s.allocator, [&from_flags](std::string_view key) {
    return from_flags.contains(std::string(key)) ? fmt::format("--option {}", key) : fmt::format("allocator.options.{}", key);
  });
}

void reject_empty_values(const CLI::App& app) {
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() == 0 || opt->get_expected_min() == 0) continue;  // not given, or a flag
    for (const std::string& v : opt->results()) {
      if (v.find_first_not_of(" \t") != std::string::npos) continue;
      const std::string name = opt->get_name();
      throw InputError(name, name.rfind("--", 0) == 0 ? "empty value (leave the option out for its default)" : "empty value");
    }
  }
  for (const CLI::App* sub : app.get_subcommands()) reject_empty_values(*sub);
}

std::pair<std::string, std::string> split_kv(const std::string& kv, const std::string& flag) {
  const auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) throw InputError(flag, fmt::format("expected key=value, got \"{}\"", kv));
  return {kv.substr(0, eq), kv.substr(eq + 1)};
}

std::string_view module_tag(const Module& m) {
  if (m.cast_hook) return "";
  if (m.container) return "container";
  return owns_parameters(m) ? "raw" : "buffers";
}

std::string cast_hook_summary(const ModelSpec& m) {
  std::size_t containers = 0, raw = 0, buffers = 0;
  Bytes bytes = 0;
  for (const Module& mod : m.modules) {
    const std::string_view tag = module_tag(mod);
    if (tag.empty()) continue;
    bytes += mod.bytes;
    containers += tag == "container";
    raw += tag == "raw";
    buffers += tag == "buffers";
  }
  if (containers + raw + buffers == 0) return "";
  std::string parts;
  auto part = [&](std::size_t n, std::string_view what) {
    if (n > 0) parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", n, what);
  };
  part(containers, containers == 1 ? "container of raw tensors beside its children" : "containers of raw tensors beside their children");
  part(raw, raw == 1 ? "raw leaf with parameters" : "raw leaves with parameters");
  part(buffers, buffers == 1 ? "leaf of buffers only" : "leaves of buffers only");
  const std::string size = bytes < MiB / 100 ? fmt::format("{} B", bytes) : format_mib(bytes);
  const std::size_t n = containers + raw + buffers;
  return fmt::format("without a cast hook: {} module{}, {} ({})\n", n, n == 1 ? "" : "s", size, parts);
}

std::string option_text(std::string_view name, const std::string& value) {
  return value.empty() ? std::string() : fmt::format(" {} {}", name, shell_quote(value));
}

double parse_duration(const std::string& text, const std::string& flag) {
  if (text.empty()) throw InputError(flag, "empty duration");
  double scale = 1;
  std::string num = text;
  switch (text.back()) {
    case 's': num.pop_back(); break;
    case 'm': scale = 60; num.pop_back(); break;
    case 'h': scale = 3600; num.pop_back(); break;
    default: break;
  }
  double v = 0;
  try {
    std::size_t used = 0;
    v = std::stod(num, &used);
    if (used != num.size()) throw std::invalid_argument("junk");
  } catch (const std::exception&) {
    throw InputError(flag, fmt::format("not a duration: \"{}\" (examples: 60s, 5m, 1h)", text));
  }
  if (!std::isfinite(v) || v <= 0) throw InputError(flag, fmt::format("duration must be positive: \"{}\"", text));
  return v * scale;
}

}  // namespace vf::cli

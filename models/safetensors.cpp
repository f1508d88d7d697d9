#include "models/safetensors.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/core/error.h"
#include "harness/core/json_escape.h"
#include "models/file_read.h"

namespace vf {
namespace {

struct StDtypeInfo {
  StDtype dtype;
  std::string_view name;
  std::uint32_t bits;
  std::optional<Dtype> vf;
};

constexpr std::array<StDtypeInfo, 22> kStDtypes = {{
    {StDtype::BOOL, "BOOL", 8, std::nullopt},
    {StDtype::U8, "U8", 8, std::nullopt},
    {StDtype::I8, "I8", 8, Dtype::int8},
    {StDtype::I16, "I16", 16, std::nullopt},
    {StDtype::U16, "U16", 16, std::nullopt},
    {StDtype::F16, "F16", 16, Dtype::fp16},
    {StDtype::BF16, "BF16", 16, Dtype::bf16},
    {StDtype::I32, "I32", 32, std::nullopt},
    {StDtype::U32, "U32", 32, std::nullopt},
    {StDtype::F32, "F32", 32, Dtype::fp32},
    {StDtype::F64, "F64", 64, std::nullopt},
    {StDtype::I64, "I64", 64, std::nullopt},
    {StDtype::U64, "U64", 64, std::nullopt},
    {StDtype::C64, "C64", 64, std::nullopt},
    {StDtype::F8_E4M3, "F8_E4M3", 8, Dtype::fp8_e4m3fn},
    {StDtype::F8_E5M2, "F8_E5M2", 8, Dtype::fp8_e5m2},
    {StDtype::F8_E8M0, "F8_E8M0", 8, std::nullopt},
    {StDtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8, std::nullopt},
    {StDtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8, std::nullopt},
    {StDtype::F4, "F4", 4, std::nullopt},
    {StDtype::F6_E2M3, "F6_E2M3", 6, std::nullopt},
    {StDtype::F6_E3M2, "F6_E3M2", 6, std::nullopt},
}};

const StDtypeInfo& info(StDtype d) { return kStDtypes[static_cast<std::size_t>(d)]; }

// The text of a JSON value for an error message: short, printable.
std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s.substr(0, 80)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  if (s.size() > 80) out += "...";
  return out + "\"";
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// First byte of `text` that is not well-formed UTF-8 (overlong forms, surrogates and code points
// above U+10FFFF are invalid), or npos.
std::size_t first_invalid_utf8(std::string_view text) {
  std::size_t i = 0;
  const std::size_t n = text.size();
  auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  auto cont = [&](std::size_t k) { return k < n && (byte(k) & 0xC0) == 0x80; };
  while (i < n) {
    const unsigned char c = byte(i);
    if (c < 0x80) {
      ++i;
    } else if (c >= 0xC2 && c <= 0xDF) {
      if (!cont(i + 1)) return i;
      i += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      if (!cont(i + 1) || !cont(i + 2)) return i;
      const unsigned char c1 = byte(i + 1);
      if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0)) return i;  // overlong / surrogate
      i += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return i;
      const unsigned char c1 = byte(i + 1);
      if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90)) return i;  // overlong / > U+10FFFF
      i += 4;
    } else {
      return i;
    }
  }
  return std::string_view::npos;
}

// A JSON reader over the header text that knows the file offset of every byte, so each error
// names the byte it is about. It reads exactly the shapes the formats use (objects of known
// members); anything else is skipped with a depth limit, never recursed into without bound.
class Cursor {
 public:
  Cursor(std::string_view text, std::uint64_t base, std::string_view origin) : t_(text), base_(base), origin_(origin) {}

  std::uint64_t offset() const { return base_ + pos_; }
  std::uint64_t offset_of(std::size_t pos) const { return base_ + pos; }
  std::size_t pos() const { return pos_; }

  [[noreturn]] void fail_at(std::uint64_t file_offset, const std::string& message) const {
    throw InputError(std::string(origin_), at_byte(file_offset, message));
  }
  [[noreturn]] void fail(const std::string& message) const { fail_at(offset(), message); }

  void ws() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\t' || t_[pos_] == '\n' || t_[pos_] == '\r')) ++pos_;
  }
  bool at_end() const { return pos_ >= t_.size(); }
  bool next_is_number() {
    ws();
    return pos_ < t_.size() && (t_[pos_] == '-' || (t_[pos_] >= '0' && t_[pos_] <= '9'));
  }
  // Skips whitespace and reports whether the next character is `c` (without consuming it).
  bool next_is(char c) {
    ws();
    return pos_ < t_.size() && t_[pos_] == c;
  }
  void expect(char c, std::string_view where) {
    ws();
    if (pos_ >= t_.size()) fail(fmt::format("the header ends where {} expects '{}'", where, c));
    if (t_[pos_] != c) fail(fmt::format("expected '{}' {}, found {}", c, where, describe_here()));
    ++pos_;
  }

  // The members of a JSON object whose '{' was just consumed: `member(key, key_offset)` runs with
  // the cursor after the ':' and consumes the value. Then ',' or the closing '}'.
  template <class Member>
  void members(std::string_view key_what, std::string_view after_key, std::string_view close_where, Member&& member) {
    if (next_is('}')) {
      ++pos_;
      return;
    }
    while (true) {
      ws();
      const std::uint64_t key_at = offset();
      std::string key = string(key_what);
      expect(':', after_key);
      member(std::move(key), key_at);
      if (next_is(',')) {
        ++pos_;
        continue;
      }
      expect('}', close_where);
      return;
    }
  }
  // The elements of a JSON array whose '[' was just consumed: `element()` consumes each.
  template <class Element>
  void elements(std::string_view close_where, Element&& element) {
    if (next_is(']')) {
      ++pos_;
      return;
    }
    while (true) {
      element();
      if (next_is(',')) {
        ++pos_;
        continue;
      }
      expect(']', close_where);
      return;
    }
  }

  std::string describe_here() const {
    if (pos_ >= t_.size()) return "the end of the header";
    const auto u = static_cast<unsigned char>(t_[pos_]);
    if (u >= 0x20 && u < 0x7f) return fmt::format("'{}'", t_[pos_]);
    return fmt::format("byte 0x{:02x}", u);
  }

  // A JSON string; returns its UTF-8 value.
  std::string string(std::string_view what) {
    ws();
    if (pos_ >= t_.size() || t_[pos_] != '"') fail(fmt::format("expected a string for {}, found {}", what, describe_here()));
    const std::size_t start = pos_++;
    std::string out;
    while (true) {
      if (pos_ >= t_.size()) fail_at(offset_of(start), fmt::format("unterminated string ({})", what));
      const char c = t_[pos_];
      const auto u = static_cast<unsigned char>(c);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (u < 0x20) fail(fmt::format("control character 0x{:02x} inside a string ({})", u, what));
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= t_.size()) fail_at(offset_of(start), fmt::format("unterminated string ({})", what));
      const char e = t_[pos_ + 1];
      pos_ += 2;
      if (const char c2 = json_short_escape(e); c2 != '\0') {
        out += c2;
        continue;
      }
      switch (e) {
        case 'u': append_code_point(out, what); break;
        default: fail_at(offset() - 2, fmt::format("invalid escape '\\{}' in a string ({})", e, what));
      }
    }
  }

  // A non-negative JSON integer that fits 64 bits (no sign, fraction or exponent).
  std::uint64_t u64(std::string_view what) {
    ws();
    const std::uint64_t at = offset();
    if (pos_ < t_.size() && t_[pos_] == '-') fail(fmt::format("{} must not be negative", what));
    if (pos_ >= t_.size() || t_[pos_] < '0' || t_[pos_] > '9') {
      fail(fmt::format("expected a non-negative integer for {}, found {}", what, describe_here()));
    }
    if (t_[pos_] == '0' && pos_ + 1 < t_.size() && t_[pos_ + 1] >= '0' && t_[pos_ + 1] <= '9') {
      fail(fmt::format("invalid number for {}: leading zero", what));
    }
    std::uint64_t v = 0;
    bool overflow = false;
    while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') {
      const auto d = static_cast<std::uint64_t>(t_[pos_] - '0');
      if (__builtin_mul_overflow(v, std::uint64_t{10}, &v) || __builtin_add_overflow(v, d, &v)) overflow = true;
      ++pos_;
    }
    if (pos_ < t_.size() && (t_[pos_] == '.' || t_[pos_] == 'e' || t_[pos_] == 'E')) {
      fail_at(at, fmt::format("{} must be an integer", what));
    }
    if (overflow) fail_at(at, fmt::format("{} does not fit in 64 bits", what));
    return v;
  }

  // Skips any JSON value (for members the reader does not use), nesting at most `kMaxDepth`.
  void skip_value(std::string_view what, int depth = 0) {
    ws();
    if (depth > kMaxDepth) fail(fmt::format("{} nests deeper than {} levels", what, kMaxDepth));
    if (pos_ >= t_.size()) fail(fmt::format("the header ends where {} expects a value", what));
    const char c = t_[pos_];
    if (c == '"') {
      (void)string(what);
    } else if (c == '{') {
      ++pos_;
      members(what, "after an object key", "to close an object", [&](std::string, std::uint64_t) { skip_value(what, depth + 1); });
    } else if (c == '[') {
      ++pos_;
      elements("to close an array", [&] { skip_value(what, depth + 1); });
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      skip_number(what);
    } else if (t_.substr(pos_, 4) == "true" || t_.substr(pos_, 4) == "null") {
      pos_ += 4;
    } else if (t_.substr(pos_, 5) == "false") {
      pos_ += 5;
    } else {
      fail(fmt::format("expected a JSON value for {}, found {}", what, describe_here()));
    }
  }

  // A JSON number of any form, as a double (for total_size, which some writers emit as a float).
  std::optional<std::uint64_t> number_as_u64(std::string_view what) {
    ws();
    const std::size_t start = pos_;
    skip_number(what);
    const std::string text(t_.substr(start, pos_ - start));
    if (text.find_first_of(".eE-") == std::string::npos) {
      pos_ = start;
      return u64(what);
    }
    return std::nullopt;
  }

 private:
  static constexpr int kMaxDepth = 64;

  void skip_number(std::string_view what) {
    const std::size_t start = pos_;
    if (pos_ < t_.size() && t_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const std::size_t d = pos_;
      while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') ++pos_;
      return pos_ - d;
    };
    const std::size_t int_start = pos_;
    const std::size_t n = digits();
    if (n == 0 || (n > 1 && t_[int_start] == '0')) fail_at(offset_of(start), fmt::format("invalid number for {}", what));
    if (pos_ < t_.size() && t_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) fail_at(offset_of(start), fmt::format("invalid number for {}", what));
    }
    if (pos_ < t_.size() && (t_[pos_] == 'e' || t_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < t_.size() && (t_[pos_] == '+' || t_[pos_] == '-')) ++pos_;
      if (digits() == 0) fail_at(offset_of(start), fmt::format("invalid number for {}", what));
    }
  }

  unsigned hex4(std::string_view what) {
    if (pos_ + 4 > t_.size()) fail(fmt::format("truncated \\u escape ({})", what));
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = t_[pos_ + static_cast<std::size_t>(k)];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
      else fail(fmt::format("invalid \\u escape ({})", what));
    }
    pos_ += 4;
    return v;
  }

  void append_code_point(std::string& out, std::string_view what) {
    const std::uint64_t at = offset() - 2;
    unsigned cp = hex4(what);
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(at, fmt::format("lone low surrogate in a \\u escape ({})", what));
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (t_.substr(pos_, 2) != "\\u") fail_at(at, fmt::format("lone high surrogate in a \\u escape ({})", what));
      pos_ += 2;
      const unsigned lo = hex4(what);
      if (lo < 0xDC00 || lo > 0xDFFF) fail_at(at, fmt::format("invalid surrogate pair in a \\u escape ({})", what));
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string_view t_;
  std::uint64_t base_;
  std::string_view origin_;
  std::size_t pos_ = 0;
};

// Where each member of a tensor entry was found, for the validation messages.
struct EntryOffsets {
  std::uint64_t shape = 0;
  std::uint64_t offsets = 0;
};

StTensor parse_tensor_entry(Cursor& c, std::string name, std::uint64_t name_offset, EntryOffsets& where) {
  const std::string what = fmt::format("tensor {}", quoted(name));
  StTensor t;
  t.name = std::move(name);
  t.entry_offset = name_offset;
  c.ws();
  const std::uint64_t open = c.offset();
  c.expect('{', fmt::format("for {}", what));
  bool have_dtype = false, have_shape = false, have_offsets = false;
  std::set<std::string> seen;
  const auto read_member = [&](const std::string& key, std::uint64_t key_at) {
    if (!seen.insert(key).second) c.fail_at(key_at, fmt::format("{}: duplicate member {}", what, quoted(key)));
    c.ws();
    if (key == "dtype") {
      const std::uint64_t at = c.offset();
      const std::string d = c.string(fmt::format("the dtype of {}", what));
      const auto parsed = parse_st_dtype(d);
      if (!parsed) {
        c.fail_at(at, fmt::format("{}: unknown dtype {} (safetensors dtypes: BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, "
                                  "F64, I64, U64, C64, F8_E4M3, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F4, F6_E2M3, F6_E3M2)",
                                  what, quoted(d)));
      }
      t.dtype = *parsed;
      have_dtype = true;
    } else if (key == "shape") {
      where.shape = c.offset();
      c.expect('[', fmt::format("for the shape of {}", what));
      c.elements(fmt::format("to close the shape of {}", what),
                 [&] { t.shape.push_back(c.u64(fmt::format("a dimension of {}", what))); });
      have_shape = true;
    } else if (key == "data_offsets") {
      where.offsets = c.offset();
      c.expect('[', fmt::format("for the data_offsets of {}", what));
      t.begin = c.u64(fmt::format("the data_offsets of {}", what));
      c.expect(',', fmt::format("in the data_offsets of {} (two numbers: [begin, end])", what));
      t.end = c.u64(fmt::format("the data_offsets of {}", what));
      c.expect(']', fmt::format("after the two data_offsets of {}", what));
      have_offsets = true;
    } else {
      // The reference reader ignores members it does not know; so do we.
      c.skip_value(fmt::format("member {} of {}", quoted(key), what));
    }
  };
  c.members(fmt::format("a member of {}", what), "after an object key", fmt::format("to close {}", what), read_member);
  for (auto [have, member] : {std::pair{have_dtype, "dtype"}, std::pair{have_shape, "shape"}, std::pair{have_offsets, "data_offsets"}}) {
    if (!have) c.fail_at(open, fmt::format("{} has no \"{}\"", what, member));
  }
  return t;
}

void parse_metadata(Cursor& c, StHeader& h) {
  c.ws();
  h.metadata_offset = c.offset();
  c.expect('{', "for __metadata__ (an object of string: string)");
  std::set<std::string> seen;
  c.members("a __metadata__ key", "after an object key", "to close __metadata__", [&](std::string key, std::uint64_t key_at) {
    if (!seen.insert(key).second) c.fail_at(key_at, fmt::format("__metadata__: duplicate key {}", quoted(key)));
    c.ws();
    if (!c.next_is('"')) c.fail(fmt::format("__metadata__ {}: values must be strings, found {}", quoted(key), c.describe_here()));
    h.metadata_value_offsets.push_back(c.offset());
    std::string value = c.string("a __metadata__ value");
    h.metadata.emplace_back(std::move(key), std::move(value));
  });
}

// The reference reader's checks on the parsed entries: shape x element size without overflow,
// sub-byte tensors ending on a byte boundary, end - begin equal to that size, and the tensors
// covering the data section exactly once sorted by offset.
void validate(const Cursor& c, const StHeader& h, const std::vector<EntryOffsets>& where) {
  const std::uint64_t data_len = h.file_size - h.data_start;
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const StTensor& t = h.tensors[i];
    const std::string what = fmt::format("tensor {}", quoted(t.name));
    std::uint64_t numel = 1;
    for (std::uint64_t d : t.shape) {
      if (__builtin_mul_overflow(numel, d, &numel)) {
        c.fail_at(where[i].shape, fmt::format("{}: shape {} has more elements than fit in 64 bits", what, shape_text(t.shape)));
      }
    }
    std::uint64_t bits = 0;
    if (__builtin_mul_overflow(numel, std::uint64_t{st_dtype_bits(t.dtype)}, &bits)) {
      c.fail_at(where[i].shape, fmt::format("{}: shape {} of {} is more bytes than fit in 64 bits", what, shape_text(t.shape),
                                            st_dtype_name(t.dtype)));
    }
    if (bits % 8 != 0) {
      c.fail_at(where[i].shape, fmt::format("{}: {} elements of {} ({} bits each) do not end on a byte boundary", what, numel,
                                            st_dtype_name(t.dtype), st_dtype_bits(t.dtype)));
    }
    if (t.end < t.begin) {
      c.fail_at(where[i].offsets, fmt::format("{}: data_offsets [{}, {}] end before they begin", what, t.begin, t.end));
    }
    if (t.end - t.begin != bits / 8) {
      c.fail_at(where[i].offsets, fmt::format("{}: data_offsets [{}, {}] hold {} bytes, but shape {} of {} is {} bytes", what,
                                              t.begin, t.end, t.end - t.begin, shape_text(t.shape), st_dtype_name(t.dtype), bits / 8));
    }
  }
  std::vector<std::size_t> order(h.tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const StTensor& x = h.tensors[a];
    const StTensor& y = h.tensors[b];
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  std::uint64_t covered = 0;
  const StTensor* prev = nullptr;
  for (std::size_t i : order) {
    const StTensor& t = h.tensors[i];
    if (t.begin < covered) {
      c.fail_at(where[i].offsets, fmt::format("tensor {}: data_offsets [{}, {}] overlap tensor {}, which ends at data byte {}",
                                              quoted(t.name), t.begin, t.end, quoted(prev->name), covered));
    }
    if (t.begin > covered) {
      c.fail_at(where[i].offsets, fmt::format("tensor {}: data_offsets [{}, {}] leave a hole of {} bytes after {} (data bytes {}..{} "
                                              "belong to no tensor)",
                                              quoted(t.name), t.begin, t.end, t.begin - covered,
                                              prev ? "tensor " + quoted(prev->name) : std::string("the start of the data section"),
                                              covered, t.begin));
    }
    covered = t.end;
    prev = &t;
  }
  if (covered > data_len) {
    const std::size_t last = order.back();
    c.fail_at(where[last].offsets, fmt::format("tensor {}: data_offsets [{}, {}] run past the end of the file: the data section "
                                               "is {} bytes (file bytes {}..{})",
                                               quoted(h.tensors[last].name), h.tensors[last].begin, h.tensors[last].end, data_len,
                                               h.data_start, h.file_size));
  }
  if (covered < data_len) {
    c.fail_at(h.data_start + covered, fmt::format("the data section has {} bytes after the last tensor that belong to no tensor "
                                                  "(the tensors cover {} of its {} bytes)",
                                                  data_len - covered, covered, data_len));
  }
}

}  // namespace

std::string_view st_dtype_name(StDtype d) { return info(d).name; }
std::uint32_t st_dtype_bits(StDtype d) { return info(d).bits; }

std::optional<StDtype> parse_st_dtype(std::string_view name) {
  for (const StDtypeInfo& i : kStDtypes) {
    if (i.name == name) return i.dtype;
  }
  return std::nullopt;
}

std::optional<Dtype> st_dtype_to_vf(StDtype d) { return info(d).vf; }

const std::string* StHeader::find_metadata(std::string_view key) const {
  for (const auto& [k, v] : metadata) {
    if (k == key) return &v;
  }
  return nullptr;
}

StHeader parse_safetensors_header(std::span<const std::uint8_t> prefix, std::uint64_t file_size, std::string_view origin) {
  const std::string where(origin);
  if (prefix.size() > file_size) prefix = prefix.first(static_cast<std::size_t>(file_size));
  if (file_size < 8) {
    throw InputError(where, at_byte(0, fmt::format("the file is {} bytes, too short for the 8-byte header length", file_size)));
  }
  if (prefix.size() < 8) throw InputError(where, at_byte(prefix.size(), "the header length could not be read"));
  StHeader h;
  h.file_size = file_size;
  for (int i = 7; i >= 0; --i) h.header_len = (h.header_len << 8) | prefix[static_cast<std::size_t>(i)];
  if (h.header_len > kSafetensorsMaxHeader) {
    throw InputError(where, at_byte(0, fmt::format("header length {} is over the {}-byte limit", h.header_len, kSafetensorsMaxHeader)));
  }
  if (h.header_len > file_size - 8) {
    throw InputError(where, at_byte(8, fmt::format("header length {} is longer than the file ({} bytes)", h.header_len, file_size)));
  }
  h.data_start = 8 + h.header_len;
  if (prefix.size() < h.data_start) throw InputError(where, at_byte(prefix.size(), "the header could not be read in full"));
  if (h.header_len == 0) throw InputError(where, at_byte(8, "the header is empty (header length 0)"));

  const std::string_view text(reinterpret_cast<const char*>(prefix.data()) + 8, static_cast<std::size_t>(h.header_len));
  if (const std::size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    throw InputError(where, at_byte(8 + bad, fmt::format("the header is not valid UTF-8 (byte 0x{:02x})", static_cast<unsigned char>(text[bad]))));
  }
  if (text.front() != '{') {
    throw InputError(where, at_byte(8, fmt::format("the header must start with '{{', found byte 0x{:02x}", static_cast<unsigned char>(text.front()))));
  }
  Cursor c(text, 8, origin);
  c.expect('{', "");
  std::set<std::string, std::less<>> names;
  std::vector<EntryOffsets> offsets;
  bool have_metadata = false;
  c.members("a tensor name", "after a tensor name", "to close the header object", [&](std::string name, std::uint64_t name_at) {
    if (name == "__metadata__") {
      if (have_metadata) c.fail_at(name_at, "duplicate key \"__metadata__\"");
      have_metadata = true;
      parse_metadata(c, h);
    } else {
      if (names.count(name) != 0) c.fail_at(name_at, fmt::format("duplicate tensor name {}", quoted(name)));
      names.insert(name);
      EntryOffsets eo;
      h.tensors.push_back(parse_tensor_entry(c, std::move(name), name_at, eo));
      offsets.push_back(eo);
    }
  });
  c.ws();
  if (!c.at_end()) c.fail(fmt::format("unexpected {} after the header object", c.describe_here()));
  validate(c, h, offsets);
  return h;
}

StHeader read_safetensors_header(const std::string& path) {
  const HeaderFile f(path);
  const std::vector<std::uint8_t> len = f.prefix(8);
  std::uint64_t n = 0;
  if (len.size() == 8) {
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[static_cast<std::size_t>(i)];
  }
  // Read the header only when its length is plausible; otherwise the parser reports why not.
  if (len.size() < 8 || n > kSafetensorsMaxHeader || n > f.size() - 8) return parse_safetensors_header(len, f.size(), path);
  const std::vector<std::uint8_t> head = f.prefix(8 + n);
  return parse_safetensors_header(head, f.size(), path);
}

StIndex parse_safetensors_index(std::string_view text, std::string_view origin) {
  if (const std::size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    throw InputError(std::string(origin), at_byte(bad, "not valid UTF-8"));
  }
  Cursor c(text, 0, origin);
  StIndex idx;
  bool have_map = false;
  c.expect('{', "at the start of the index");
  std::set<std::string> top;
  c.members("a key of the index", "after an object key", "to close the index object", [&](const std::string& key, std::uint64_t key_at) {
    if (!top.insert(key).second) c.fail_at(key_at, fmt::format("duplicate key {}", quoted(key)));
    if (key == "weight_map") {
      have_map = true;
      c.expect('{', "for weight_map (an object of tensor name: shard file)");
      std::set<std::string> names;
      c.members("a tensor name in weight_map", "after an object key", "to close weight_map", [&](std::string name, std::uint64_t at) {
        if (!names.insert(name).second) c.fail_at(at, fmt::format("weight_map: duplicate tensor name {}", quoted(name)));
        c.ws();
        const std::uint64_t file_at = c.offset();
        std::string file = c.string(fmt::format("the shard of {}", quoted(name)));
        if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
          c.fail_at(file_at, fmt::format("weight_map {}: shard {} must be a plain file name next to the index", quoted(name), quoted(file)));
        }
        idx.weight_map.emplace_back(std::move(name), std::move(file));
        idx.offsets.push_back(at);
      });
    } else if (key == "metadata") {
      c.expect('{', "for metadata");
      std::set<std::string> keys;
      c.members("a metadata key", "after an object key", "to close metadata", [&](const std::string& mk, std::uint64_t at) {
        if (!keys.insert(mk).second) c.fail_at(at, fmt::format("metadata: duplicate key {}", quoted(mk)));
        if (mk == "total_size" && c.next_is_number()) idx.total_size = c.number_as_u64("metadata.total_size");
        else c.skip_value(fmt::format("metadata {}", quoted(mk)));
      });
    } else {
      c.skip_value(fmt::format("member {}", quoted(key)));
    }
  });
  c.ws();
  if (!c.at_end()) c.fail(fmt::format("unexpected {} after the index object", c.describe_here()));
  if (!have_map) throw InputError(std::string(origin), at_byte(0, "the index has no \"weight_map\""));
  return idx;
}

}  // namespace vf

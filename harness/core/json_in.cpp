#include "harness/core/json_in.h"

#include <charconv>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/core/json_escape.h"

namespace vf {

JsonIn::JsonIn(const nlohmann::json& j, std::string path) : j_(&j) {
  auto root = std::make_shared<Link>();
  root->root = std::move(path);
  self_ = std::move(root);
}

void JsonIn::fail(const std::string& message) const { throw InputError(path(), message); }

std::string JsonIn::type_name() const {
  if (j_->is_null()) return "null";
  if (j_->is_boolean()) return "a boolean";
  if (j_->is_number_unsigned() || j_->is_number_integer()) return fmt::format("integer {}", j_->dump());
  if (j_->is_number()) return fmt::format("number {}", j_->dump());
  if (j_->is_string()) return fmt::format("string {}", json_excerpt(*j_));
  if (j_->is_array()) return "an array";
  return "an object";
}

namespace {

// A key as a path shows it: cut to its first 48 bytes when longer (a hostile file's key can be
// megabytes, and every message that names the field would repeat it).
std::string path_key(std::string_view key) {
  constexpr std::size_t kMax = 48;
  if (key.size() <= kMax) return std::string(key);
  std::size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(key[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
  return fmt::format("{}...({} bytes)", key.substr(0, cut), key.size());
}

}  // namespace

const std::shared_ptr<const JsonIn::Link>& JsonIn::link() const {
  if (!self_) {
    auto l = std::make_shared<Link>();
    l->up = up_;
    l->key = key_;
    l->index = index_;
    l->is_index = is_index_;
    self_ = std::move(l);
  }
  return self_;
}

void JsonIn::render(const Link* l, std::string& out) {
  if (!l->up) {
    out += l->root;
    return;
  }
  render(l->up.get(), out);
  if (l->is_index) {
    out += fmt::format("[{}]", l->index);
  } else {
    if (!out.empty()) out += '.';
    out += path_key(l->key);
  }
}

std::string JsonIn::path() const {
  std::string out;
  if (self_) {
    render(self_.get(), out);
    return out;
  }
  const Link step{up_, {}, key_, index_, is_index_};
  render(&step, out);
  return out;
}

std::string JsonIn::child(std::string_view key) const {
  std::string p = path();
  return p.empty() ? path_key(key) : fmt::format("{}.{}", p, path_key(key));
}

void JsonIn::expect_object(std::initializer_list<std::string_view> allowed_keys) const {
  if (!j_->is_object()) fail("expected an object, got " + type_name());
  for (auto it = j_->begin(); it != j_->end(); ++it) {
    bool known = false;
    for (std::string_view k : allowed_keys) known = known || it.key() == k;
    if (!known) {
      std::string list;
      for (std::string_view k : allowed_keys) list += (list.empty() ? "" : ", ") + std::string(k);
      throw InputError(child(it.key()), fmt::format("unknown field (expected one of: {})", list));
    }
  }
}

bool JsonIn::has(std::string_view key) const { return j_->is_object() && j_->contains(key); }

JsonIn JsonIn::at(std::string_view key) const {
  if (!j_->is_object()) fail("expected an object, got " + type_name());
  auto it = j_->find(key);
  if (it == j_->end()) throw InputError(child(key), "required field is missing");
  return JsonIn(*it, link(), it.key(), 0, false);
}

std::optional<JsonIn> JsonIn::opt(std::string_view key) const {
  if (!j_->is_object()) fail("expected an object, got " + type_name());
  auto it = j_->find(key);
  if (it == j_->end()) return std::nullopt;
  // null is not "the default": a generated file with `"allocator": null` would otherwise run as
  // raw without a word. No field of our formats gives null a meaning on input.
  if (it->is_null()) throw InputError(child(key), "null is not allowed (leave the field out for its default)");
  return JsonIn(*it, link(), it.key(), 0, false);
}

void JsonIn::expect_array() const {
  if (!j_->is_array()) fail("expected an array, got " + type_name());
}

std::size_t JsonIn::size() const {
  expect_array();
  return j_->size();
}

JsonIn JsonIn::at(std::size_t i) const {
  expect_array();
  return JsonIn((*j_)[i], link(), {}, i, true);
}

std::string JsonIn::str() const {
  if (!j_->is_string()) fail("expected a string, got " + type_name());
  return j_->get<std::string>();
}

bool JsonIn::boolean() const {
  if (!j_->is_boolean()) fail("expected true or false, got " + type_name());
  return j_->get<bool>();
}

double JsonIn::number() const {
  if (!j_->is_number()) fail("expected a number, got " + type_name());
  const double v = j_->get<double>();
  if (!std::isfinite(v)) fail("expected a finite number");
  return v;
}

std::uint64_t JsonIn::u64() const {
  if (j_->is_number_unsigned()) return j_->get<std::uint64_t>();
  if (j_->is_number_integer()) {
    // Documents built in code hold signed integers (and text "-0" parses as one): only a value
    // below zero is negative.
    const std::int64_t v = j_->get<std::int64_t>();
    if (v >= 0) return static_cast<std::uint64_t>(v);
    fail(fmt::format("must not be negative, got {}", v));
  }
  if (j_->is_number_float()) {
    const double v = j_->get<double>();
    // nlohmann reads integers beyond 2^64 as floats: that is an overflow, not a fraction.
    if (v >= 18446744073709551616.0) fail(fmt::format("value overflows 64 bits: {}", j_->dump()));
    if (v < 0) fail(fmt::format("must not be negative, got {}", j_->dump()));
    fail(fmt::format("expected a whole number, got {}", j_->dump()));
  }
  fail("expected a non-negative integer, got " + type_name());
}

std::uint64_t JsonIn::u64_in(std::uint64_t lo, std::uint64_t hi) const {
  const std::uint64_t v = u64();
  if (v < lo || v > hi) fail(fmt::format("must be between {} and {}, got {}", lo, hi, v));
  return v;
}

std::uint32_t JsonIn::u32_in(std::uint32_t lo, std::uint32_t hi) const {
  return static_cast<std::uint32_t>(u64_in(lo, hi));
}

double JsonIn::number_in(double lo, double hi) const {
  const double v = number();
  if (v < lo || v > hi) fail(fmt::format("must be between {} and {}, got {}", lo, hi, v));
  return v;
}

Bytes JsonIn::bytes() const {
  if (j_->is_string()) return parse_size(j_->get<std::string>(), path());
  if (j_->is_number()) return u64();
  fail("expected a size (bytes, or a string like \"24GiB\"), got " + type_name());
}

std::string JsonIn::scalar_text() const {
  if (j_->is_string()) return j_->get<std::string>();
  if (j_->is_boolean()) return j_->get<bool>() ? "true" : "false";
  if (j_->is_number()) return j_->dump();
  fail("expected a string, number or boolean, got " + type_name());
}

std::string JsonTooDeep::describe(const std::string& path, std::size_t byte) {
  // The path of the 65th level is mostly "[0][0]...": its start says where the nesting began.
  constexpr std::size_t kShown = 64;
  const std::string shown = path.size() <= kShown + 16 ? path : path.substr(0, kShown) + "...";
  return fmt::format("arrays and objects nested deeper than {} levels at byte {}{}", kMaxJsonDepth, byte,
                     path.empty() ? "" : fmt::format(" (at {})", shown));
}

std::string json_excerpt(const nlohmann::json& v) {
  using nlohmann::json;
  if (v.is_array()) return fmt::format("an array of {} element{}", v.size(), v.size() == 1 ? "" : "s");
  if (v.is_object()) return fmt::format("an object with {} key{}", v.size(), v.size() == 1 ? "" : "s");
  if (v.is_string()) {
    constexpr std::size_t kMax = 48;
    const std::string& text = v.get_ref<const std::string&>();
    if (text.size() <= kMax) return v.dump(-1, ' ', false, json::error_handler_t::replace);
    std::size_t cut = kMax;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
    return fmt::format("{}... ({} bytes)", json(text.substr(0, cut)).dump(-1, ' ', false, json::error_handler_t::replace),
                       text.size());
  }
  return v.dump();  // a number, a boolean or null: short
}

namespace {

// The 1-based offset of the first bracket that opens level kMaxJsonDepth + 1, brackets inside
// strings not counted (0: none). Asked only once the parser has refused that bracket, so the text
// before it is valid JSON and the count is exact.
std::size_t too_deep_offset(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i + 1;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return 0;
}

// Builds the document from the parser's SAX events, as nlohmann's own DOM builder does, and
// knows for each open array or object the element or key it is at. A key given twice is found in
// the object being built (no second copy of the keys), and the path of a key is built from the
// frames only when an error names it, so a frame costs the same at any depth and the whole read is
// linear in the text. (nlohmann's callback parser, which this replaces, rescans the parent array
// at every object's end: quadratic in an array of objects, 67% of a 100,000-module scenario's
// read.) Depth is capped at kMaxJsonDepth.
class UniqueDomBuilder {
 public:
  using json = nlohmann::json;

  UniqueDomBuilder(json& root, std::string_view text) : root_(root), text_(text) {}

  bool null() { return add(json(nullptr)); }
  bool boolean(bool v) { return add(json(v)); }
  bool number_integer(json::number_integer_t v) { return add(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return add(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t& /*text*/) { return add(json(v)); }
  bool string(json::string_t& v) { return add(json(std::move(v))); }
  bool binary(json::binary_t& v) { return add(json::binary(std::move(v))); }

  bool start_object(std::size_t /*elements*/) { return open(json::value_t::object); }
  bool start_array(std::size_t /*elements*/) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(json::string_t& k) {
    Frame& f = stack_.back();
    auto& object = f.container->get_ref<json::object_t&>();
    const auto [it, inserted] = object.emplace(std::move(k), nullptr);
    f.key = &it->first;
    if (!inserted) throw JsonDuplicateKey(path());
    slot_ = &it->second;
    return true;
  }

  // Syntax errors and number overflows: nlohmann's own exception, of its own type.
  template <class Exception>
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/, const Exception& ex) {
    throw ex;
  }

 private:
  struct Frame {
    json* container;
    const std::string* key = nullptr;  // objects: the current key
    std::size_t index = 0;             // arrays: the current element
  };

  // Puts a value where the parser is: the root, the next element of the open array, or the
  // member of the open object whose key came last.
  json* put(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json* parent = stack_.back().container;
    if (parent->is_array()) {
      auto& array = parent->get_ref<json::array_t&>();
      array.push_back(std::move(v));
      return &array.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  bool add(json&& v) {
    put(std::move(v));
    next_element();
    return true;
  }
  bool open(json::value_t type) {
    if (stack_.size() >= static_cast<std::size_t>(kMaxJsonDepth)) throw JsonTooDeep(path(), too_deep_offset(text_));
    json* container = put(json(type));
    stack_.push_back(Frame{container});
    return true;
  }
  bool close() {
    stack_.pop_back();
    next_element();
    return true;
  }
  // A value (scalar or closed container) ended: in an array, the next one has the next index.
  void next_element() {
    if (!stack_.empty() && !stack_.back().container->is_object()) ++stack_.back().index;
  }
  // Where the parser is: each open object's current key, each open array's current element.
  std::string path() const {
    std::string out;
    for (const Frame& f : stack_) {
      if (f.container->is_object()) {
        if (f.key != nullptr) out += (out.empty() ? "" : ".") + path_key(*f.key);
      } else {
        out += fmt::format("[{}]", f.index);
      }
    }
    return out;
  }

  json& root_;
  std::string_view text_;
  std::vector<Frame> stack_;
  json* slot_ = nullptr;  // the member the next value of the open object goes to
};

}  // namespace

namespace {

// The common case of parse_json_unique, about twice as fast as nlohmann's lexer: a strict
// recursive descent straight into the document. It takes only what it is sure of and gives up
// (nullopt) on everything else: any syntax error, a duplicate key, nesting past kMaxJsonDepth, a
// number outside int64/uint64/finite double, a string with a byte >= 0x80 or a \u escape, a
// byte-order mark. parse_json_unique then parses the same text with nlohmann, whose document
// and errors (with their byte offsets) are the reference: the fast path never words an error.
class FastJson {
 public:
  explicit FastJson(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  std::optional<nlohmann::json> document() {
    nlohmann::json root;
    skip_space();
    if (!value(root, 0)) return std::nullopt;
    skip_space();
    if (p_ != end_) return std::nullopt;
    return root;
  }

 private:
  using json = nlohmann::json;

  void skip_space() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  bool literal(std::string_view word) {
    if (static_cast<std::size_t>(end_ - p_) < word.size() || std::memcmp(p_, word.data(), word.size()) != 0) return false;
    p_ += word.size();
    return true;
  }

  bool value(json& out, int depth) {
    if (p_ == end_) return false;
    switch (*p_) {
      case '{': return object(out, depth + 1);
      case '[': return array(out, depth + 1);
      case '"': {
        std::string s;
        if (!string(s)) return false;
        out = std::move(s);
        return true;
      }
      case 't': out = true; return literal("true");
      case 'f': out = false; return literal("false");
      case 'n': out = nullptr; return literal("null");
      default: return number(out);
    }
  }

  bool object(json& out, int depth) {
    if (depth > kMaxJsonDepth) return false;
    ++p_;  // {
    out = json::object();
    auto& members = out.get_ref<json::object_t&>();
    skip_space();
    if (p_ != end_ && *p_ == '}') {
      ++p_;
      return true;
    }
    for (;;) {
      skip_space();
      if (p_ == end_ || *p_ != '"') return false;
      std::string key;
      if (!string(key)) return false;
      skip_space();
      if (p_ == end_ || *p_ != ':') return false;
      ++p_;
      skip_space();
      const auto [it, inserted] = members.emplace(std::move(key), nullptr);
      if (!inserted || !value(it->second, depth)) return false;
      skip_space();
      if (p_ == end_) return false;
      if (*p_ == '}') {
        ++p_;
        return true;
      }
      if (*p_++ != ',') return false;
    }
  }

  bool array(json& out, int depth) {
    if (depth > kMaxJsonDepth) return false;
    ++p_;  // [
    out = json::array();
    auto& elements = out.get_ref<json::array_t&>();
    skip_space();
    if (p_ != end_ && *p_ == ']') {
      ++p_;
      return true;
    }
    for (;;) {
      skip_space();
      if (!value(elements.emplace_back(), depth)) return false;
      skip_space();
      if (p_ == end_) return false;
      if (*p_ == ']') {
        ++p_;
        return true;
      }
      if (*p_++ != ',') return false;
    }
  }

  // At the opening quote. Printable ASCII and the two-character escapes only.
  bool string(std::string& out) {
    ++p_;
    const char* run = p_;
    for (;;) {
      while (p_ != end_) {
        const auto c = static_cast<unsigned char>(*p_);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++p_;
      }
      if (p_ == end_) return false;
      out.append(run, static_cast<std::size_t>(p_ - run));
      const char c = *p_++;
      if (c == '"') return true;
      if (c != '\\' || p_ == end_) return false;  // a control byte, a byte >= 0x80
      const char e = json_short_escape(*p_++);
      if (e == '\0') return false;  // \u (surrogates, UTF-8) and anything invalid: nlohmann's
      out += e;
      run = p_;
    }
  }

  // JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?. An integer is an unsigned or
  // (negative) signed one where it fits, as nlohmann makes it; every other number a double.
  bool number(json& out) {
    const char* start = p_;
    const bool negative = p_ != end_ && *p_ == '-';
    if (negative) ++p_;
    const auto digit = [this] { return p_ != end_ && *p_ >= '0' && *p_ <= '9'; };
    if (!digit()) return false;
    if (*p_ == '0') {
      ++p_;
    } else {
      while (digit()) ++p_;
    }
    bool integral = true;
    if (p_ != end_ && *p_ == '.') {
      integral = false;
      ++p_;
      if (!digit()) return false;
      while (digit()) ++p_;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      integral = false;
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digit()) return false;
      while (digit()) ++p_;
    }
    if (integral) {
      if (negative) {
        std::int64_t v = 0;
        const auto r = std::from_chars(start, p_, v);
        if (r.ec != std::errc() || r.ptr != p_) return false;  // beyond int64: nlohmann makes it a double
        out = v;
      } else {
        std::uint64_t v = 0;
        const auto r = std::from_chars(start, p_, v);
        if (r.ec != std::errc() || r.ptr != p_) return false;
        out = v;
      }
      return true;
    }
    double v = 0;
    const auto r = std::from_chars(start, p_, v);
    if (r.ec != std::errc() || r.ptr != p_ || !std::isfinite(v)) return false;  // underflow, overflow: nlohmann's
    out = v;
    return true;
  }

  const char* p_;
  const char* end_;
};

}  // namespace

std::optional<nlohmann::json> parse_json_fast(std::string_view text) { return FastJson(text).document(); }

nlohmann::json parse_json_unique(std::string_view text) {
  if (std::optional<nlohmann::json> fast = parse_json_fast(text)) return std::move(*fast);
  nlohmann::json root;
  UniqueDomBuilder builder(root, text);
  nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
  return root;
}

nlohmann::json parse_json_text(std::string_view text, std::string_view origin) {
  try {
    return parse_json_unique(text);
  } catch (const JsonDuplicateKey& e) {
    throw InputError(e.path(), fmt::format("key given twice in one object (in {}; keep one)", origin));
  } catch (const JsonTooDeep& e) {
    throw InputError(std::string(origin), e.what());
  } catch (const nlohmann::json::parse_error& e) {

    // e.byte is 1-based position of the failure; e.what() carries nlohmann's diagnosis.
    std::string what = e.what();
    const auto pos = what.find("; ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    throw InputError(std::string(origin), fmt::format("invalid JSON at byte {}: {}", e.byte, what));
  } catch (const nlohmann::json::out_of_range& e) {
    // A number too large for a double ("number overflow parsing '1e999'", error 406): nlohmann
    // names the literal, not its position, so find the literal in the text.
    std::string what = e.what();
    const auto pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    const auto q1 = what.find('\'');
    const auto q2 = q1 == std::string::npos ? q1 : what.find('\'', q1 + 1);
    const auto at = q2 == std::string::npos ? std::string_view::npos : text.find(what.substr(q1 + 1, q2 - q1 - 1));
    if (at == std::string_view::npos) throw InputError(std::string(origin), fmt::format("invalid JSON: {}", what));
    throw InputError(std::string(origin), fmt::format("invalid JSON at byte {}: {}", at + 1, what));
  }
}

std::string read_text_file(const std::string& path) {
  // A directory opens like a file on Linux and reads as nothing: say what it is instead of
  // "invalid JSON at byte 1" (or, for a reader that takes any bytes, an empty input).
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path, "is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(path, "cannot read file");
  return ss.str();
}

void write_file_atomic(const std::string& path, std::string_view content) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  if (ec) throw InfraError(fmt::format("cannot create directory {}: {}", target.parent_path().string(), ec.message()));
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InfraError(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
  const char* p = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw InfraError(fmt::format("cannot write {}: {}", tmp, std::strerror(err)));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw InfraError(fmt::format("cannot flush {}: {}", tmp, std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw InfraError(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(err)));
  }
}

}  // namespace vf

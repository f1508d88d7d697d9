#include "harness/core/json_doc.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/core/json_escape.h"
#include "harness/core/json_in.h"

namespace vf {

double JsonDoc::real(Index n) const { return std::bit_cast<double>(nodes_[n].bits); }

std::optional<JsonDoc::Index> JsonDoc::find(Index n, std::string_view k) const {
  const Node& o = nodes_[n];
  const Member* first = members_.data() + o.bits;
  const Member* last = first + o.size;
  const auto key_of = [this](const Member& m) { return std::string_view(text_.data() + m.key_offset, m.key_size); };
  if (o.size <= 8) {
    for (const Member* m = first; m != last; ++m) {
      if (key_of(*m) == k) return m->value;
    }
    return std::nullopt;
  }
  const Member* it = std::lower_bound(first, last, k, [&](const Member& m, std::string_view v) { return key_of(m) < v; });
  if (it != last && key_of(*it) == k) return it->value;
  return std::nullopt;
}

// Strict recursive descent straight into the arrays. It declines (returns false) rather than
// words anything: the caller hands declined text to nlohmann, whose errors are the reference.
class JsonDoc::Parser {
 public:
  Parser(JsonDoc& d, std::string_view text) : d_(d), begin_(text.data()), p_(text.data()), end_(text.data() + text.size()) {}

  bool document() {
    d_.text_.assign(begin_, end_);
    // A scenario's modules take about a node per 11 bytes of text: a guess that saves most
    // regrowths without reserving far more than a document of long strings needs.
    d_.nodes_.reserve(static_cast<std::size_t>(end_ - begin_) / 12 + 1);
    d_.ups_.reserve(d_.nodes_.capacity());
    skip_space();
    if (!value(kNoParent, 0, 0)) return false;
    skip_space();
    return p_ == end_;
  }

 private:
  void skip_space() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool literal(std::string_view word) {
    if (static_cast<std::size_t>(end_ - p_) < word.size() || std::memcmp(p_, word.data(), word.size()) != 0) return false;
    p_ += word.size();
    return true;
  }
  Index add(Type t, Index parent, std::uint32_t slot) {
    const auto n = static_cast<Index>(d_.nodes_.size());
    d_.nodes_.push_back(Node{t, 0, 0});
    d_.ups_.push_back(Up{parent, slot});
    return n;
  }

  bool value(Index parent, std::uint32_t slot, int depth) {
    if (p_ == end_) return false;
    if (d_.nodes_.size() >= std::numeric_limits<Index>::max() - 1) return false;  // nlohmann's, past 4 G values
    switch (*p_) {
      case '{': return object(add(Type::object, parent, slot), depth + 1);
      case '[': return array(add(Type::array, parent, slot), depth + 1);
      case '"': {
        const Index n = add(Type::string, parent, slot);
        std::uint64_t offset = 0;
        std::uint32_t size = 0;
        if (!string(offset, size)) return false;
        d_.nodes_[n].bits = offset;
        d_.nodes_[n].size = size;
        return true;
      }
      case 't': d_.nodes_[add(Type::boolean, parent, slot)].bits = 1; return literal("true");
      case 'f': add(Type::boolean, parent, slot); return literal("false");
      case 'n': add(Type::null, parent, slot); return literal("null");
      default: return number(add(Type::null, parent, slot));
    }
  }

  bool array(Index self, int depth) {
    if (depth > kMaxJsonDepth) return false;
    ++p_;  // [
    const std::size_t mark = kids_.size();
    skip_space();
    if (p_ != end_ && *p_ == ']') {
      ++p_;
      return close_array(self, mark);
    }
    for (;;) {
      skip_space();
      const auto child = static_cast<Index>(d_.nodes_.size());
      if (!value(self, static_cast<std::uint32_t>(kids_.size() - mark), depth)) return false;
      kids_.push_back(child);
      skip_space();
      if (p_ == end_) return false;
      if (*p_ == ']') {
        ++p_;
        return close_array(self, mark);
      }
      if (*p_++ != ',') return false;
    }
  }
  bool close_array(Index self, std::size_t mark) {
    const std::size_t count = kids_.size() - mark;
    if (count > std::numeric_limits<std::uint32_t>::max()) return false;
    d_.nodes_[self].bits = d_.elements_.size();
    d_.nodes_[self].size = static_cast<std::uint32_t>(count);
    d_.elements_.insert(d_.elements_.end(), kids_.begin() + static_cast<std::ptrdiff_t>(mark), kids_.end());
    kids_.resize(mark);
    return true;
  }

  bool object(Index self, int depth) {
    if (depth > kMaxJsonDepth) return false;
    ++p_;  // {
    const std::size_t mark = pairs_.size();
    skip_space();
    if (p_ != end_ && *p_ == '}') {
      ++p_;
      return close_object(self, mark);
    }
    for (;;) {
      skip_space();
      if (p_ == end_ || *p_ != '"') return false;
      Member m{};
      if (!string(m.key_offset, m.key_size)) return false;
      skip_space();
      if (p_ == end_ || *p_ != ':') return false;
      ++p_;
      skip_space();
      m.value = static_cast<Index>(d_.nodes_.size());
      if (!value(self, 0, depth)) return false;  // its slot is set once the members are sorted
      pairs_.push_back(m);
      skip_space();
      if (p_ == end_) return false;
      if (*p_ == '}') {
        ++p_;
        return close_object(self, mark);
      }
      if (*p_++ != ',') return false;
    }
  }
  bool close_object(Index self, std::size_t mark) {
    // By index: an object with no members may sit at the start of an empty vector (no data).
    const std::size_t count = pairs_.size() - mark;
    Member* first = pairs_.data() + mark;
    const char* text = d_.text_.data();
    const auto key_of = [text](const Member& m) { return std::string_view(text + m.key_offset, m.key_size); };
    const auto less = [&](const Member& a, const Member& b) { return key_of(a) < key_of(b); };
    if (count <= 16) {
      for (std::size_t i = 1; i < count; ++i) {  // insertion sort: most objects have a few keys
        for (std::size_t k = i; k > 0 && less(first[k], first[k - 1]); --k) std::swap(first[k], first[k - 1]);
      }
    } else {
      std::sort(first, first + count, less);
    }
    for (std::size_t i = 1; i < count; ++i) {
      if (key_of(first[i - 1]) == key_of(first[i])) return false;  // a key given twice: nlohmann's path words it
    }
    if (count > std::numeric_limits<std::uint32_t>::max()) return false;
    d_.nodes_[self].bits = d_.members_.size();
    d_.nodes_[self].size = static_cast<std::uint32_t>(count);
    for (std::size_t i = 0; i < count; ++i) d_.ups_[first[i].value].slot = static_cast<std::uint32_t>(i);
    d_.members_.insert(d_.members_.end(), pairs_.begin() + static_cast<std::ptrdiff_t>(mark), pairs_.end());
    pairs_.resize(mark);
    return true;
  }

  // At the opening quote. Printable ASCII and the two-character escapes only. A string without
  // escapes is where it stands in the text; one with escapes is unescaped past the text's end.
  bool string(std::uint64_t& offset, std::uint32_t& size) {
    ++p_;
    const char* start = p_;
    while (p_ != end_) {
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
      ++p_;
    }
    if (p_ == end_) return false;
    if (*p_ == '"') {
      if (static_cast<std::size_t>(p_ - start) > std::numeric_limits<std::uint32_t>::max()) return false;
      offset = static_cast<std::uint64_t>(start - begin_);
      size = static_cast<std::uint32_t>(p_ - start);
      ++p_;
      return true;
    }
    unescaped_.assign(start, p_);
    const char* run = p_;
    for (;;) {
      while (p_ != end_) {
        const auto c = static_cast<unsigned char>(*p_);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++p_;
      }
      if (p_ == end_) return false;
      unescaped_.append(run, static_cast<std::size_t>(p_ - run));
      const char c = *p_++;
      if (c == '"') break;
      if (c != '\\' || p_ == end_) return false;  // a control byte, a byte >= 0x80
      const char e = json_short_escape(*p_++);
      if (e == '\0') return false;  // \u (surrogates, UTF-8) and anything invalid: nlohmann's
      unescaped_ += e;
      run = p_;
    }
    if (unescaped_.size() > std::numeric_limits<std::uint32_t>::max()) return false;
    offset = d_.text_.size();
    size = static_cast<std::uint32_t>(unescaped_.size());
    d_.text_.insert(d_.text_.end(), unescaped_.begin(), unescaped_.end());
    return true;
  }

  // JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?. An integer is an unsigned or
  // (negative) signed one, as nlohmann makes it; one beyond 64 bits is declined (nlohmann makes it
  // a double); every other number is a finite double.
  bool number(Index self) {
    const char* start = p_;
    const bool negative = *p_ == '-';
    if (negative) ++p_;
    const auto digit = [this] { return p_ != end_ && *p_ >= '0' && *p_ <= '9'; };
    if (!digit()) return false;
    const char* digits = p_;
    if (*p_ == '0') {
      ++p_;
    } else {
      while (digit()) ++p_;
    }
    const char* digits_end = p_;
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
    Node& n = d_.nodes_[self];
    if (integral) {
      std::uint64_t v = 0;
      for (const char* q = digits; q != digits_end; ++q) {
        const auto dv = static_cast<std::uint64_t>(*q - '0');
        if (v > (std::numeric_limits<std::uint64_t>::max() - dv) / 10) return false;
        v = v * 10 + dv;
      }
      if (!negative) {
        n.type = Type::unsigned_integer;
        n.bits = v;
        return true;
      }
      if (v > std::uint64_t{1} << 63) return false;
      n.type = Type::signed_integer;
      n.bits = ~v + 1;  // -v, two's complement (-0 is a signed 0, as nlohmann reads it)
      return true;
    }
    double v = 0;
    const auto [end, ec] = std::from_chars(start, p_, v);
    if (ec != std::errc() || end != p_ || !std::isfinite(v)) return false;  // overflow, underflow: nlohmann's
    n.type = Type::real;
    n.bits = std::bit_cast<std::uint64_t>(v);
    return true;
  }

  JsonDoc& d_;
  const char* begin_;
  const char* p_;
  const char* end_;
  std::vector<Index> kids_;     // the elements of the open arrays, innermost last
  std::vector<Member> pairs_;   // the members of the open objects, innermost last
  std::string unescaped_;
};

std::shared_ptr<const JsonDoc> JsonDoc::parse(std::string_view text) {
  auto d = std::make_shared<JsonDoc>();
  if (!Parser(*d, text).document()) return nullptr;
  return d;
}

class JsonDoc::Converter {
 public:
  explicit Converter(JsonDoc& d) : d_(d) {}

  Index add(const nlohmann::json& j, Index parent, std::uint32_t slot) {
    const auto self = static_cast<Index>(d_.nodes_.size());
    d_.nodes_.push_back(Node{});
    d_.ups_.push_back(Up{parent, slot});
    Node n{};
    switch (j.type()) {
      case nlohmann::json::value_t::null:
      case nlohmann::json::value_t::discarded: n.type = Type::null; break;
      case nlohmann::json::value_t::boolean:
        n.type = Type::boolean;
        n.bits = j.get<bool>() ? 1 : 0;
        break;
      case nlohmann::json::value_t::number_unsigned:
        n.type = Type::unsigned_integer;
        n.bits = j.get<std::uint64_t>();
        break;
      case nlohmann::json::value_t::number_integer:
        n.type = Type::signed_integer;
        n.bits = static_cast<std::uint64_t>(j.get<std::int64_t>());
        break;
      case nlohmann::json::value_t::number_float:
        n.type = Type::real;
        n.bits = std::bit_cast<std::uint64_t>(j.get<double>());
        break;
      case nlohmann::json::value_t::string: {
        n.type = Type::string;
        const std::string& s = j.get_ref<const std::string&>();
        n.bits = append(s);
        n.size = static_cast<std::uint32_t>(s.size());
        break;
      }
      case nlohmann::json::value_t::binary: {  // never read from text; as the bytes it holds
        n.type = Type::array;
        std::vector<Index> kids;
        for (const std::uint8_t b : j.get_binary()) {
          kids.push_back(static_cast<Index>(d_.nodes_.size()));
          d_.nodes_.push_back(Node{Type::unsigned_integer, 0, b});
          d_.ups_.push_back(Up{self, static_cast<std::uint32_t>(kids.size() - 1)});
        }
        n.bits = d_.elements_.size();
        n.size = static_cast<std::uint32_t>(kids.size());
        d_.elements_.insert(d_.elements_.end(), kids.begin(), kids.end());
        break;
      }
      case nlohmann::json::value_t::array: {
        n.type = Type::array;
        std::vector<Index> kids;
        kids.reserve(j.size());
        std::uint32_t i = 0;
        for (const nlohmann::json& e : j) kids.push_back(add(e, self, i++));
        n.bits = d_.elements_.size();
        n.size = static_cast<std::uint32_t>(kids.size());
        d_.elements_.insert(d_.elements_.end(), kids.begin(), kids.end());
        break;
      }
      case nlohmann::json::value_t::object: {
        n.type = Type::object;
        std::vector<Member> members;
        members.reserve(j.size());
        std::uint32_t i = 0;
        for (auto it = j.begin(); it != j.end(); ++it) {  // a std::map: in key order already
          Member m{};
          m.key_offset = append(it.key());
          m.key_size = static_cast<std::uint32_t>(it.key().size());
          m.value = add(*it, self, i++);
          members.push_back(m);
        }
        n.bits = d_.members_.size();
        n.size = static_cast<std::uint32_t>(members.size());
        d_.members_.insert(d_.members_.end(), members.begin(), members.end());
        break;
      }
    }
    d_.nodes_[self] = n;
    return self;
  }

 private:
  std::uint64_t append(std::string_view s) {
    // A size is 32 bits: a longer string (a file of over 4 GiB) is refused, never cut.
    if (s.size() > std::numeric_limits<std::uint32_t>::max()) {
      throw InputError("", fmt::format("a JSON string of {} bytes (more than 4 GiB) is not read", s.size()));
    }
    const std::uint64_t at = d_.text_.size();
    d_.text_.insert(d_.text_.end(), s.begin(), s.end());
    return at;
  }
  JsonDoc& d_;
};

std::shared_ptr<const JsonDoc> JsonDoc::from_json(const nlohmann::json& j) {
  auto d = std::make_shared<JsonDoc>();
  Converter(*d).add(j, kNoParent, 0);
  return d;
}

nlohmann::json JsonDoc::to_json(Index n) const {
  switch (type(n)) {
    case Type::null: return nullptr;
    case Type::boolean: return boolean(n);
    case Type::unsigned_integer: return unsigned_value(n);
    case Type::signed_integer: return signed_value(n);
    case Type::real: return real(n);
    case Type::string: return std::string(string(n));
    case Type::array: {
      nlohmann::json a = nlohmann::json::array();
      for (std::uint32_t i = 0; i < size(n); ++i) a.push_back(to_json(element(n, i)));
      return a;
    }
    case Type::object: {
      nlohmann::json o = nlohmann::json::object();
      for (std::uint32_t i = 0; i < size(n); ++i) o[std::string(key(n, i))] = to_json(value(n, i));
      return o;
    }
  }
  return nullptr;
}

}  // namespace vf

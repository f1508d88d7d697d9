// A parsed JSON document held in a few flat arrays: one node per value, one entry per array
// element or object member, and the text the strings point into. Reading a scenario of a million
// modules (or a predictor request per shrink candidate) through nlohmann's document cost a heap
// block per value and per key, and freeing them was a quarter of the read; this costs a handful
// of vector growths whatever the size.
//
// It is what JsonIn reads (json_in.h): every reader of user input walks one. A document is
// immutable once built, and shared (shared_ptr) by the JsonIn values that point into it.
//
// Objects keep their members sorted by key (byte order, as nlohmann's std::map does), so members
// are visited, and the first unknown key is named, in the same order as before.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace vf {

class JsonDoc {
 public:
  using Index = std::uint32_t;
  static constexpr Index kNoParent = ~Index{0};

  enum class Type : std::uint8_t { null, boolean, unsigned_integer, signed_integer, real, string, array, object };

  // The document of `text` where the fast parser is sure of it: strict JSON with ASCII strings
  // and the two-character escapes, nesting at most kMaxJsonDepth, no key twice in one object,
  // integers within 64 bits and finite doubles. nullptr for anything else (an error, a \u escape,
  // a byte >= 0x80 inside a string, a number at the edge of its type): parse_json_doc then lets
  // nlohmann parse the text, which words the error or accepts what this declined.
  static std::shared_ptr<const JsonDoc> parse(std::string_view text);
  // The same values as `j` (objects in key order). For documents built in code, and for text
  // the fast parser declined.
  static std::shared_ptr<const JsonDoc> from_json(const nlohmann::json& j);

  Index root() const { return 0; }
  Type type(Index n) const { return nodes_[n].type; }
  bool boolean(Index n) const { return nodes_[n].bits != 0; }
  std::uint64_t unsigned_value(Index n) const { return nodes_[n].bits; }
  std::int64_t signed_value(Index n) const { return static_cast<std::int64_t>(nodes_[n].bits); }
  double real(Index n) const;
  // Valid while the document lives.
  std::string_view string(Index n) const { return {text_.data() + nodes_[n].bits, nodes_[n].size}; }
  // Elements of an array, members of an object.
  std::uint32_t size(Index n) const { return nodes_[n].size; }
  Index element(Index n, std::size_t i) const { return elements_[nodes_[n].bits + i]; }
  std::string_view key(Index n, std::size_t i) const {
    const Member& m = members_[nodes_[n].bits + i];
    return {text_.data() + m.key_offset, m.key_size};
  }
  Index value(Index n, std::size_t i) const { return members_[nodes_[n].bits + i].value; }
  std::optional<Index> find(Index n, std::string_view key) const;

  // Where a value sits: its container (kNoParent for the root) and its index there (the element's,
  // or the member's in key order).
  Index parent(Index n) const { return ups_[n].parent; }
  std::uint32_t slot(Index n) const { return ups_[n].slot; }

  // The value as nlohmann's document (for the few places that hand a value on as JSON).
  nlohmann::json to_json(Index n) const;

 private:
  struct Node {
    Type type = Type::null;
    std::uint32_t size = 0;   // string bytes, array elements, object members
    std::uint64_t bits = 0;   // the boolean, the integer (two's complement), the double's bits,
                              // the string's offset in text_, the first element or member
  };
  struct Member {
    std::uint64_t key_offset;
    std::uint32_t key_size;
    Index value;
  };
  struct Up {
    Index parent;
    std::uint32_t slot;
  };
  class Parser;
  class Converter;

  std::vector<char> text_;  // the text (strings without escapes point here), then the unescaped strings
  std::vector<Node> nodes_;
  std::vector<Up> ups_;
  std::vector<Index> elements_;
  std::vector<Member> members_;
};

}  // namespace vf

// Names indexed in one flat open-addressing table of (index + 1, hash) slots, 8 bytes each; the
// names live elsewhere and are read through `name_of(index)`. A node per name (std::unordered_map
// or _set) was a sixth of reading a million modules and freeing its nodes another tenth; a slot
// that held the name's view was four times the size for the same probes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace vf {

// NameOf: std::string_view(std::uint32_t index), valid for every index added so far.
template <class NameOf>
class FlatNameIndex {
 public:
  FlatNameIndex(NameOf name_of, std::size_t expected) : name_of_(std::move(name_of)) {
    std::size_t cap = 16;
    while (cap < 2 * expected) cap *= 2;
    slots_.resize(cap);
  }
  // The index of the name equal to `name`, if one was added.
  std::optional<std::uint32_t> find(std::string_view name) const {
    const Slot& s = slots_[probe(name, hash(name))];
    if (s.index == 0) return std::nullopt;
    return s.index - 1;
  }
  // Adds index i, whose name is `name`, unless an equal name was added before (one probe for
  // both): true if it was added. name_of(i) is not read, so i may be added to the names after.
  bool add_if_absent(std::uint32_t i, std::string_view name) {
    if (2 * (count_ + 1) > slots_.size()) grow();
    const std::uint64_t h = hash(name);
    Slot& s = slots_[probe(name, h)];
    if (s.index != 0) return false;
    s = Slot{i + 1, static_cast<std::uint32_t>(h)};
    ++count_;
    return true;
  }
  // Adds index i, whose name is not in the table yet.
  void add(std::uint32_t i) {
    if (2 * (count_ + 1) > slots_.size()) grow();
    const std::string_view name = name_of_(i);
    const std::uint64_t h = hash(name);
    slots_[probe(name, h)] = Slot{i + 1, static_cast<std::uint32_t>(h)};
    ++count_;
  }

 private:
  struct Slot {
    std::uint32_t index = 0;  // index + 1; 0: empty
    std::uint32_t hash = 0;   // the name's hash, low bits (a cheap mismatch before the names)
  };
  static std::uint64_t hash(std::string_view name) { return std::hash<std::string_view>{}(name); }
  // The slot holding `name`, or the empty slot where it would go (the table is never full).
  std::size_t probe(std::string_view name, std::uint64_t h) const {
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.index == 0 || (s.hash == static_cast<std::uint32_t>(h) && name_of_(s.index - 1) == name)) return i;
    }
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    const std::size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.index == 0) continue;
      std::size_t i = hash(name_of_(s.index - 1)) & mask;
      while (slots_[i].index != 0) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }
  NameOf name_of_;
  std::vector<Slot> slots_;
  std::size_t count_ = 0;
};

}  // namespace vf

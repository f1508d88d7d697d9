// The free holes of the simulated device's small pages, in the driver's best-fit order: the
// smallest hole that holds a request, and among holes of one size the one that has been a hole
// longest (device.h, as recorded on an H200).
//
// Holes are 512 B multiples below 2 MiB, so there are 4,095 sizes: each size keeps its holes in
// a doubly linked list in the order they were made, and a two-level bitmap marks the sizes that
// have any. Every hole is made younger than all others (a new page's rest, a split hole's rest,
// a free merged with its neighbours), so appending keeps each list oldest first: the best fit is
// the front of the first non-empty list at or above the request (two bit scans), and adding or
// removing a hole is O(1). The FreeIndex this replaces kept (size, age) in sorted chunks, and its
// binary searches were a cache miss per probe once a 1,000,000-module model left 200,000 holes:
// raw's best fit cost twice as much per module at 1,000,000 modules as at 10,000.
#pragma once

#include <array>
#include <bit>
#include <cassert>
#include <cstdint>
#include <vector>

namespace vf::sim {

class HoleIndex {
 public:
  using Id = std::uint32_t;
  static constexpr Id kNone = 0xffffffffu;
  static constexpr std::uint32_t kUnit = 512;                 // cudaMalloc's granularity
  static constexpr std::uint32_t kSizes = (2u << 20) / kUnit;  // 4,096 classes; holes use 1..4,095

  // The hole's bounds are kept here alone (the page lists only its holes' ids), so a placement
  // reads and writes this node and no page record.
  struct Hole {
    std::uint64_t addr = 0;  // the hole's device address
    std::uint32_t page = 0;  // the small page's slot
    std::uint32_t size = 0;  // a multiple of kUnit, below 2 MiB (0 once retired)
    Id prev = kNone;         // in its size's list (free nodes: next is the free list)
    Id next = kNone;
  };
  static_assert(sizeof(Hole) == 24);

  HoleIndex() {
    head_.fill(kNone);
    tail_.fill(kNone);
  }

  // Adds a hole, the youngest of all; returns its id (valid until it is removed, or retired and
  // released).
  Id add(std::uint32_t page, std::uint64_t addr, std::uint32_t size) {
    assert(size > 0 && size < kSizes * kUnit && size % kUnit == 0);  // class 0 or 4,096 would break the lists
    Id id;
    if (free_ != kNone) {
      id = free_;
      free_ = nodes_[id].next;
    } else {
      id = static_cast<Id>(nodes_.size());
      nodes_.emplace_back();
    }
    nodes_[id].page = page;
    link(id, addr, size);
    ++count_;
    return id;
  }

  void remove(Id id) {
    retire(id);
    release(id);
  }

  // Takes the hole `id` out of the best-fit order but keeps its node and its address, with size
  // 0: the device leaves it in its page's list as the marker of the buffer that filled the hole
  // exactly, so that placement need not read the page's list. release() frees the node.
  void retire(Id id) {
    assert(nodes_[id].size != 0);  // a hole in the order, not a marker already
    unlink(id);
    nodes_[id].size = 0;
    --count_;
  }
  void release(Id id) {
    assert(nodes_[id].size == 0);  // retired: in no size's list
    nodes_[id].next = free_;
    free_ = id;
  }

  // The hole `id` now has these bounds in the same page, and is the youngest of all: what a
  // remove and an add would do (a split hole's rest, a free merged into a neighbour), in place.
  void move(Id id, std::uint64_t addr, std::uint32_t size) {
    assert(size > 0 && size < kSizes * kUnit && size % kUnit == 0);
    unlink(id);
    link(id, addr, size);
  }

  // The smallest hole of at least `size` bytes (a multiple of kUnit), the oldest of its size;
  // kNone when no hole is that large.
  Id best_fit(std::uint32_t size) const {
    const std::uint32_t c = size / kUnit;
    if (c >= kSizes) return kNone;
    const std::uint32_t w = c / 64;
    if (const std::uint64_t bits = words_[w] & (~std::uint64_t{0} << (c % 64)); bits != 0) {
      return head_[w * 64 + static_cast<std::uint32_t>(std::countr_zero(bits))];
    }
    if (w + 1 >= 64) return kNone;
    const std::uint64_t above = summary_ & (~std::uint64_t{0} << (w + 1));
    if (above == 0) return kNone;
    const auto w2 = static_cast<std::uint32_t>(std::countr_zero(above));
    return head_[w2 * 64 + static_cast<std::uint32_t>(std::countr_zero(words_[w2]))];
  }

  const Hole& operator[](Id id) const { return nodes_[id]; }
  std::size_t size() const { return count_; }

 private:
  // Appends `id` to its size's list, the youngest.
  void link(Id id, std::uint64_t addr, std::uint32_t size) {
    const std::uint32_t c = size / kUnit;
    Hole& h = nodes_[id];
    h.addr = addr;
    h.size = size;
    h.prev = tail_[c];
    h.next = kNone;
    if (tail_[c] != kNone) {
      nodes_[tail_[c]].next = id;
    } else {
      head_[c] = id;
      words_[c / 64] |= std::uint64_t{1} << (c % 64);
      summary_ |= std::uint64_t{1} << (c / 64);
    }
    tail_[c] = id;
  }

  // Takes `id` out of its size's list.
  void unlink(Id id) {
    const Hole& h = nodes_[id];
    const std::uint32_t c = h.size / kUnit;
    if (h.prev != kNone) nodes_[h.prev].next = h.next;
    else head_[c] = h.next;
    if (h.next != kNone) nodes_[h.next].prev = h.prev;
    else tail_[c] = h.prev;
    if (head_[c] == kNone) {
      words_[c / 64] &= ~(std::uint64_t{1} << (c % 64));
      if (words_[c / 64] == 0) summary_ &= ~(std::uint64_t{1} << (c / 64));
    }
  }

  static_assert(kSizes == 64 * 64, "two levels of 64-bit words");
  std::vector<Hole> nodes_;
  Id free_ = kNone;  // removed and released nodes, linked through next
  // Filled in the constructor, not from a constexpr array: an initializer of 8,192 constants is
  // 8,192 stores that gcc's dead-store pass walks in every function that makes an index (94 s to
  // compile the index's test at -O2), where fill is one memset each.
  std::array<Id, kSizes> head_;
  std::array<Id, kSizes> tail_;
  std::array<std::uint64_t, 64> words_{};
  std::uint64_t summary_ = 0;
  std::size_t count_ = 0;
};

}  // namespace vf::sim

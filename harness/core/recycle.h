// Storage recycling for the per-case tables that grow with the model: a program's ops and buffers,
// an allocator's per-buffer tables. A 1,000,000-module text encoder lowers to 10 M ops (240 MiB)
// and 3 M buffers; glibc maps allocations that large afresh each time and gives them back on free,
// so every case faulted hundreds of MiB of pages in again (recycled, lowering a 1,000,000-module
// case went from 189 to 108 ns per module).
//
// `recycle_keep(v)`, called where a large table dies, keeps its storage (emptied) in a spare of
// the calling thread; `recycle_reserve(v, n)`, called where the next table is sized, takes the
// spare when it holds `n` elements. Each thread keeps at most one spare per element type, the
// largest it has kept, and frees a spare too small for a reservation before making that
// reservation, so no spare is held beside a new table of its type. What a thread holds between
// cases is therefore at most its largest table of each recycled type (a program's ops and
// buffers, each allocator model's per-buffer tables) until the thread ends: after a
// 1,000,000-module case, a few hundred MiB that the next large case reuses. Tables under
// kRecycleMin elements are left to the heap, which reuses their memory anyway.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <vector>

namespace vf {

inline constexpr std::size_t kRecycleMin = std::size_t{1} << 16;

namespace detail {
// The spare lives as long as its thread. A table destroyed after it (one held by a static, or by
// another thread-local object destroyed later) finds `gone` set and is left to the heap: the
// flag is trivially destructible, so it is readable until the thread ends.
template <class T>
struct Spare {
  std::vector<T> storage;
  static bool& gone() {
    thread_local bool flag = false;
    return flag;
  }
  ~Spare() { gone() = true; }
};
template <class T>
std::vector<T>* recycle_spare() {
  if (Spare<T>::gone()) return nullptr;
  thread_local Spare<T> spare;
  return &spare.storage;
}
}  // namespace detail

// Keeps `v`'s storage for a later recycle_reserve on this thread when it is large and larger than
// the spare (`v` is then left empty; otherwise it is untouched).
template <class T>
void recycle_keep(std::vector<T>& v) noexcept {
  if (v.capacity() < kRecycleMin) return;
  std::vector<T>* spare = detail::recycle_spare<T>();
  if (!spare || v.capacity() <= spare->capacity()) return;
  v.clear();
  spare->swap(v);  // the smaller spare now in `v` is freed with it
}

// `v.reserve(want)`, with the spare's storage when it holds `want` elements.
template <class T>
void recycle_reserve(std::vector<T>& v, std::size_t want) {
  std::vector<T>* spare = want >= kRecycleMin && v.capacity() < want ? detail::recycle_spare<T>() : nullptr;
  if (spare && spare->capacity() >= want) {
    std::vector<T> taken;
    taken.swap(*spare);
    taken.clear();
    taken.insert(taken.end(), std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
    v.swap(taken);
  } else if (spare) {
    *spare = std::vector<T>();  // too small for this table: do not hold it beside a new one
  }
  v.reserve(want);
}

namespace detail {
template <class T>
std::size_t cover_target(const std::vector<T>& v, std::size_t key) {
  std::size_t target = std::max(key + 1, std::max<std::size_t>(2 * v.size(), 64));
  if (key < v.capacity()) target = std::min(target, v.capacity());  // the key is in the reservation
  return target;
}
// New entries as T{}: value-initialised in place, so gcc stores T's default member initialisers
// directly. Copying a `fill` into each entry instead rebuilt the 24-byte value on the stack from
// its parts and reloaded it on every entry, a store-forwarding stall apiece (3 % of an async
// campaign's time in this fill).
template <class T>
[[gnu::noinline]] void grow_to_cover(std::vector<T>& v, std::size_t key) {
  v.resize(cover_target(v, key));
}
template <class T>
[[gnu::noinline]] void grow_to_cover(std::vector<T>& v, std::size_t key, const T& fill) {
  const T value = fill;  // a local: `fill` could alias the table
  v.resize(cover_target(v, key), value);
}
}  // namespace detail

// Makes `v[key]` an element of a per-key table whose new entries are T{} (or `fill`: not live). A
// program's keys are its buffers, each first seen one after another, so growing to key + 1 filled
// one entry per malloc, a memset call each. The size now doubles (from 64, at least to key + 1)
// within the capacity that reserve_keys gave: a few fills a case, none past twice the largest key
// (a recycled table's capacity can be a far larger case's), and no reallocation inside the
// reservation.
// The check is inline (every malloc makes it), the growth out of line.
template <class T>
void cover_key(std::vector<T>& v, std::size_t key) {
  if (key >= v.size()) detail::grow_to_cover(v, key);
}
template <class T>
void cover_key(std::vector<T>& v, std::size_t key, const T& fill) {
  if (key >= v.size()) detail::grow_to_cover(v, key, fill);
}

}  // namespace vf

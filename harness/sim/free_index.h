// The free blocks of one caching-allocator pool, ordered by (stream, size, address) exactly
// like PyTorch's free lists, so "best fit" is the first entry at or after (stream, size).
//
// It is a std::set<(stream, size, address)> in behaviour, built for millions of updates per
// second without heap churn: per stream ("lane"), sizes fall into bins, eight per power of two
// (TLSF-style), a bitmap marks the non-empty bins, and each bin is a small vector sorted by
// (size, address). Finding the best fit is a binary search in one bin or a bit scan to the next
// non-empty bin; bins keep their capacity, so steady-state inserts do not allocate.
//
// A bin that outgrows kChunk entries is split into sorted chunks of at most kChunk, the first
// held in the bin itself: a million free blocks of a few hundred sizes (a 1,000,000-module
// model's weights) put 100,000 entries in one bin, and shifting them on every insert and erase
// made a 1,000,000-module run spend half its time in memmove. Chunks bound that shift; a search
// is a binary search over the chunks' last entries, then in one chunk.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "harness/core/bytes.h"
#include "harness/core/scalar_load.h"

namespace vf::sim {

class FreeIndex {
 public:
  using StreamId = std::uint32_t;
  using DeviceAddr = std::uint64_t;

  struct Entry {
    Bytes size;
    DeviceAddr addr;
    std::uint32_t block;
  };

  FreeIndex() = default;
  ~FreeIndex() { recycle_lanes(); }
  FreeIndex(const FreeIndex&) = default;
  FreeIndex& operator=(const FreeIndex&) = default;
  // A moved-from index is empty: its lane table must not point into lanes it no longer has.
  FreeIndex(FreeIndex&& o) noexcept
      : lanes_(std::move(o.lanes_)), direct_(o.direct_), count_(o.count_), total_bytes_(o.total_bytes_) {
    o.clear_after_move();
  }
  FreeIndex& operator=(FreeIndex&& o) noexcept {
    if (this != &o) {
      recycle_lanes();
      lanes_ = std::move(o.lanes_);
      direct_ = o.direct_;
      count_ = o.count_;
      total_bytes_ = o.total_bytes_;
      o.clear_after_move();
    }
    return *this;
  }

  // A position in one stream's order; invalidated by any insert or erase. 16 bytes: one of 13
  // was copied in overlapping moves that stalled store-to-load forwarding in the async pool's
  // best fit, so `valid` is a word, not a bool.
  struct Cursor {
    std::uint16_t lane = 0;
    std::uint16_t bin = 0;
    std::uint32_t chunk = 0;
    std::uint32_t pos = 0;
    std::uint32_t valid = 0;
  };

  [[gnu::always_inline]] void insert(StreamId stream, Bytes size, DeviceAddr addr, std::uint32_t block) {
    Lane& lane = lane_for(stream);
    const std::uint32_t b = bin_of(size);
    put(lane.bins[b], Entry{size, addr, block}, lane.held);
    mark(lane, b);
    add_totals(lane, size, 1);
  }

  // Erases the entry (stream, size, addr), which must be present.
  void erase(StreamId stream, Bytes size, DeviceAddr addr) { erase_at(find(stream, size, addr)); }

  // Erases the entry a cursor points at (no search).
  [[gnu::always_inline]] void erase_at(Cursor c) {
    Lane& lane = lanes_[c.lane];
    Bin& bin = lane.bins[c.bin];
    const Bytes size = bin.chunk(c.chunk)[c.pos].size;
    take(bin, c.chunk, c.pos);
    if (bin.first.empty()) unmark(lane, c.bin);
    add_totals(lane, 0 - size, -1);
  }

  // Replaces the entry (stream, old_size, old_addr), which must be present, by (size, addr) of
  // the same block (kept): in place when both fall in one chunk (the usual case when a free range
  // loses its front to a tensor), else an erase and an insert.
  void replace(StreamId stream, Bytes old_size, DeviceAddr old_addr, Bytes size, DeviceAddr addr) {
    replace_at(find(stream, old_size, old_addr), size, addr);
  }

  // The same for the entry a cursor points at (no search for it).
  void replace_at(Cursor c, Bytes size, DeviceAddr addr) { replace_at(c, size, addr, at(c).block); }

  // The same, and the entry now names `block` (a merge whose survivor is not the block that
  // held the entry).
  [[gnu::always_inline]] void replace_at(Cursor c, Bytes size, DeviceAddr addr, std::uint32_t block) {
    Lane& lane = lanes_[c.lane];
    Bin& old_bin = lane.bins[c.bin];
    std::vector<Entry>& chunk = old_bin.chunk(c.chunk);
    const auto at = chunk.begin() + c.pos;
    const Entry e{size, addr, block};
    lane.bytes = lane.bytes - at->size + size;
    total_bytes_ = total_bytes_ - at->size + size;
    const std::uint32_t b = bin_of(size);
    // Within one chunk, when the new key still sorts inside it: the entry moves down when it
    // sorts before its old place, else up.
    if (c.bin == b && (!old_bin.split() || (!before(e, chunk.front()) && !before(chunk.back(), e)))) {
      if (before(e, *at)) {
        const auto pos = std::lower_bound(chunk.begin(), at, e, before);
        std::move_backward(pos, at, at + 1);
        *pos = e;
      } else {
        const auto pos = std::lower_bound(at + 1, chunk.end(), e, before);
        std::move(at + 1, pos, at);
        *(pos - 1) = e;
      }
      old_bin.refresh(c.chunk);
      return;
    }
    take(old_bin, c.chunk, c.pos);
    if (old_bin.first.empty()) unmark(lane, c.bin);
    put(lane.bins[b], e, lane.held);
    mark(lane, b);
  }

  // The entry (stream, size, addr), which must be present.
  [[gnu::always_inline]] Cursor find(StreamId stream, Bytes size, DeviceAddr addr) const {
    const std::uint32_t l = find_lane(stream);
    const std::uint32_t b = bin_of(size);
    const Bin& bin = lanes_[l].bins[b];
    const Entry key{size, addr, 0};
    const std::uint32_t k = bin.chunk_for(key);
    const std::vector<Entry>& chunk = bin.chunk(k);
    return cursor(l, b, k, static_cast<std::uint32_t>(std::lower_bound(chunk.begin(), chunk.end(), key, before) - chunk.begin()));
  }

  // The smallest entry of `stream` with size >= `size` (lowest address among equals).
  [[gnu::always_inline]] Cursor lower_bound(StreamId stream, Bytes size) const {
    const std::uint32_t l = find_lane(stream);
    if (l == kNoLane) return {};
    const Lane& lane = lanes_[l];
    if (lane.count == 0) return {};
    const std::uint32_t b = bin_of(size);
    const Bin& bin = lane.bins[b];
    const Entry key{size, 0, 0};
    const std::uint32_t k = bin.chunk_for(key);
    if (k < bin.chunks()) {
      const std::vector<Entry>& chunk = bin.chunk(k);
      const auto it = std::lower_bound(chunk.begin(), chunk.end(), key, before);
      return cursor(l, b, k, static_cast<std::uint32_t>(it - chunk.begin()));
    }
    return first_from(l, b + 1);
  }

  // The largest entry of `stream`.
  Cursor last(StreamId stream) const {
    const std::uint32_t l = find_lane(stream);
    if (l == kNoLane) return {};
    return last_upto(l, kBins - 1);
  }

  Cursor next(Cursor c) const {
    const Bin& bin = lanes_[c.lane].bins[c.bin];
    if (c.pos + 1 < bin.chunk(c.chunk).size()) return cursor(c.lane, c.bin, c.chunk, c.pos + 1);
    if (c.chunk + 1 < bin.chunks()) return cursor(c.lane, c.bin, c.chunk + 1, 0);
    return first_from(c.lane, c.bin + 1u);
  }

  const Entry& at(Cursor c) const { return lanes_[c.lane].bins[c.bin].chunk(c.chunk)[c.pos]; }

  std::size_t size() const { return count_; }
  // The bytes of every entry, and of one stream's.
  Bytes total_bytes() const { return total_bytes_; }
  Bytes bytes(StreamId stream) const {
    const std::uint32_t l = find_lane(stream);
    return l == kNoLane ? 0 : lanes_[l].bytes;
  }

  // The entries of one stream.
  std::size_t count(StreamId stream) const {
    const std::uint32_t l = find_lane(stream);
    return l == kNoLane ? 0 : lanes_[l].count;
  }

  // Calls f(entry) for every entry, stream by stream (in order of first use), each in order.
  template <class F>
  void for_each(F&& f) const {
    for (const Lane& lane : lanes_) for_each_in(lane, f);
  }

  // The same for every stream but `skip`.
  template <class F>
  void for_each_except(StreamId skip, F&& f) const {
    for (const Lane& lane : lanes_) {
      if (lane.stream != skip) for_each_in(lane, f);
    }
  }

  // The bytes of the entries with lo <= size < hi in every stream but `skip` (bins below lo's
  // and above hi's are not visited).
  Bytes bytes_in(StreamId skip, Bytes lo, Bytes hi) const {
    if (lo >= hi) return 0;
    const std::uint32_t first = bin_of(lo);
    const std::uint32_t last = bin_of(hi - 1);
    Bytes sum = 0;
    auto add = [&](const Entry& e) {
      if (e.size >= lo && e.size < hi) sum += e.size;
    };
    for (const Lane& lane : lanes_) {
      if (lane.stream == skip || lane.count == 0) continue;
      for (std::uint32_t b = first; b <= last; ++b) {
        if (((lane.nonempty[b / 64] >> (b % 64)) & 1) == 0) continue;
        lane.bins[b].each(add);
      }
    }
    return sum;
  }

  // Appends every entry's block (all streams) to `out`.
  void collect(std::vector<std::uint32_t>& out) const {
    for_each([&](const Entry& e) { out.push_back(e.block); });
  }

 private:
  // Eight bins per power of two: the top bit picks the octave, the next three bits the bin.
  // Sizes below 16 B share bin 0 (the caching allocator never has blocks below 512 B).
  static constexpr std::uint32_t kBins = 61 * 8;
  static constexpr std::uint32_t kWords = (kBins + 63) / 64;
  static_assert(kWords <= 32, "Lane::words has a bit per word");
  static_assert(kBins <= 0xffff, "Cursor::bin is 16 bits");
  static constexpr std::uint32_t kNoLane = 0xffffffffu;
  // A chunk of a bin holds at most this many entries (3 KiB shifted at most per update).
  static constexpr std::size_t kChunk = 128;
  // Below this many entries an unsplit bin inserts by shifting from the back, without a search.
  static constexpr std::size_t kShort = 16;

  static std::uint32_t bin_of(Bytes size) {
    if (size < 16) return 0;
    const auto top = static_cast<std::uint32_t>(std::bit_width(size) - 1);  // >= 4
    return (top - 3) * 8 + static_cast<std::uint32_t>((size >> (top - 3)) & 7) - 8;
  }

  // (size, address) order, without a branch: in a bin's handful of entries the sizes tie or not
  // at random (the two-way test cost a caching malloc+free pair 0.2 mispredicts in callgrind's
  // branch model).
  static bool before(const Entry& a, const Entry& b) {
    return (a.size < b.size) | ((a.size == b.size) & (a.addr < b.addr));
  }

  // One bin: sorted chunks, each non-empty, every entry of one before every entry of the next;
  // the first chunk is held here, the others behind a pointer that only a split bin allocates
  // (a lane has 488 bins, built and freed with every allocator: they stay 32 bytes). Empty:
  // `first` is empty and there are no other chunks. A split bin keeps each chunk's last entry in
  // one array, so finding a chunk is a binary search in it: one of 800 chunks was ten probes,
  // each through a chunk's vector to its last entry, two cache misses apiece in a large model.
  struct Split {
    std::vector<std::vector<Entry>> chunks;  // chunks 1..
    std::vector<Entry> lasts;                // while split: lasts[k] is chunk k's last entry (k from 0)
  };
  struct Bin {
    std::vector<Entry> first;
    std::unique_ptr<Split> rest;  // chunks 1..: present exactly while the bin is split

    Bin() = default;
    Bin(Bin&&) noexcept = default;
    Bin& operator=(Bin&&) noexcept = default;
    Bin(const Bin& o) : first(o.first), rest(o.rest ? std::make_unique<Split>(*o.rest) : nullptr) {}
    Bin& operator=(const Bin& o) {
      if (this != &o) *this = Bin(o);
      return *this;
    }
    ~Bin() = default;

    bool split() const { return rest != nullptr; }
    std::uint32_t chunks() const { return first.empty() ? 0 : 1 + (rest ? static_cast<std::uint32_t>(rest->chunks.size()) : 0); }
    std::vector<Entry>& chunk(std::uint32_t k) { return k == 0 ? first : rest->chunks[k - 1]; }
    const std::vector<Entry>& chunk(std::uint32_t k) const { return k == 0 ? first : rest->chunks[k - 1]; }
    // After chunk k (non-empty) changed: its last entry, where the bin is split.
    void refresh(std::uint32_t k) {
      if (split()) rest->lasts[k] = chunk(k).back();
    }
    // The first chunk whose last entry is not before `key` (chunks() if none).
    std::uint32_t chunk_for(const Entry& key) const {
      if (!split()) return first.empty() || before(first.back(), key) ? chunks() : 0;
      return static_cast<std::uint32_t>(std::lower_bound(rest->lasts.begin(), rest->lasts.end(), key, before) - rest->lasts.begin());
    }
    template <class F>
    void each(F& f) const {
      for (const Entry& e : first) f(e);
      if (!rest) return;
      for (const std::vector<Entry>& c : rest->chunks) {
        for (const Entry& e : c) f(e);
      }
    }
  };

  // Inserts `e` in order, splitting a chunk that outgrows kChunk.
  // Most bins hold a handful of entries and have room for one more: shift from the back in one
  // pass, inline; the rest (a search, a grown vector, a split) out of line.
  // `held` counts the entries of storage the lane's vectors have grown to (Lane::held).
  // `e` is taken by value, and the out-of-line path gets its fields: an entry whose address
  // escapes is kept on the stack, written field by field and copied out as one 16-byte load, which
  // cannot be forwarded from those stores (a stall on every replace and insert; about a third of
  // replace_at's time in an async campaign).
  static void put(Bin& bin, Entry e, std::size_t& held) {
    std::vector<Entry>& v = bin.first;
    if (bin.rest || v.size() >= kShort || v.size() == v.capacity()) {
      put_general(bin, e.size, e.addr, e.block, held);
      return;
    }
    shift_in(v, e);
  }

  // Appends `e` to a short sorted vector and shifts it down to its place.
  static void shift_in(std::vector<Entry>& v, Entry e) {
    v.push_back(e);
    Entry* p = v.data();
    std::size_t i = v.size() - 1;
    for (; i > 0 && before(e, p[i - 1]); --i) p[i] = p[i - 1];
    p[i] = e;
  }

  [[gnu::noinline]] static void put_general(Bin& bin, Bytes size, DeviceAddr addr, std::uint32_t block, std::size_t& held) {
    const Entry e{size, addr, block};
    if (!bin.rest && bin.first.size() < kShort) {  // short, but its vector must grow
      const std::size_t had = bin.first.capacity();
      shift_in(bin.first, e);
      held += bin.first.capacity() - had;
      return;
    }
    std::uint32_t k = bin.chunk_for(e);
    if (k == bin.chunks()) k = k == 0 ? 0 : k - 1;  // after every entry: the last chunk
    std::vector<Entry>& chunk = bin.chunk(k);
    const std::size_t had = chunk.capacity();
    chunk.insert(std::lower_bound(chunk.begin(), chunk.end(), e, before), e);
    held += chunk.capacity() - had;
    if (chunk.size() <= kChunk) {
      bin.refresh(k);
      return;
    }
    std::vector<Entry> upper(chunk.begin() + static_cast<std::ptrdiff_t>(chunk.size() / 2), chunk.end());
    chunk.resize(chunk.size() / 2);
    const bool was_split = bin.split();
    if (!was_split) bin.rest = std::make_unique<Split>();
    bin.rest->chunks.insert(bin.rest->chunks.begin() + k, std::move(upper));  // chunk k + 1
    std::vector<Entry>& lasts = bin.rest->lasts;
    if (!was_split) {
      lasts.assign({bin.chunk(0).back(), bin.chunk(1).back()});
    } else {
      lasts[k] = bin.chunk(k).back();
      lasts.insert(lasts.begin() + k + 1, bin.chunk(k + 1).back());
    }
  }

  // Erases entry `pos` of chunk `k`; a chunk left empty goes (the next becomes the first).
  static void take(Bin& bin, std::uint32_t k, std::uint32_t pos) {
    if (!bin.rest) {
      std::vector<Entry>& v = bin.first;
      Entry* p = v.data();
      // Shifted entry by entry: an empty asm on the index keeps gcc from making the loop a call
      // to memmove, whose dispatch costs more than the entry or two a short bin moves (about one
      // call in three malloc+free pairs).
      for (std::size_t i = pos + 1; i < v.size(); ++i) {
        p[i - 1] = p[i];
        asm("" : "+r"(i));
      }
      v.pop_back();
      return;
    }
    take_split(bin, k, pos);
  }

  [[gnu::noinline]] static void take_split(Bin& bin, std::uint32_t k, std::uint32_t pos) {
    std::vector<Entry>& chunk = bin.chunk(k);
    chunk.erase(chunk.begin() + pos);
    if (!chunk.empty()) {
      bin.refresh(k);
      return;
    }
    if (!bin.split()) return;
    Split& rest = *bin.rest;
    if (k == 0) {
      bin.first.swap(rest.chunks.front());
      rest.chunks.erase(rest.chunks.begin());
    } else {
      rest.chunks.erase(rest.chunks.begin() + (k - 1));
    }
    rest.lasts.erase(rest.lasts.begin() + k);
    if (rest.chunks.empty()) bin.rest.reset();  // one chunk again
  }

  static Cursor cursor(std::uint32_t l, std::uint32_t b, std::uint32_t k, std::uint32_t pos) {
    return Cursor{static_cast<std::uint16_t>(l), static_cast<std::uint16_t>(b), k, pos, 1};
  }

  struct Lane {
    StreamId stream = 0;
    std::vector<Bin> bins = std::vector<Bin>(kBins);
    std::array<std::uint64_t, kWords> nonempty{};
    std::uint32_t words = 0;  // bit w: nonempty[w] != 0 (a search past a bin jumps to the next word)
    Bytes bytes = 0;
    std::size_t count = 0;
    // Entries of storage its bins' vectors grew to (a split bin's chunks included, never taken
    // back off): what a recycled lane would keep.
    std::size_t held = 0;
  };

  // The byte and entry totals of a lane and of the index after an insert (+size, +1) or an erase
  // (0 - size, -1: unsigned, so wrapping). One field at a time: gcc otherwise adds to each pair
  // (bytes, count) with one 16-byte load and store, and replace_at has just stored the bytes
  // alone, which such a load cannot be forwarded from (core/scalar_load.h).
  [[gnu::always_inline]] void add_totals(Lane& lane, Bytes bytes, std::int64_t entries) {
    lane.bytes = scalar_load(lane.bytes) + bytes;
    lane.count += static_cast<std::size_t>(entries);
    total_bytes_ = scalar_load(total_bytes_) + bytes;
    count_ += static_cast<std::size_t>(entries);
  }

  // Lanes outlive their index in a pool of the thread's, emptied, for the next index to take:
  // an allocator model is built for every case, and a lane is 488 bins (16 KiB to zero) whose
  // vectors grew entry by entry again in every case, then freed one by one with it. A lane is
  // kept when its storage is small (kPoolHeld entries: a large model's lane goes back to the
  // heap), up to kPoolLanes per thread: at most about 1.8 MiB held between cases.
  static constexpr std::size_t kPoolLanes = 16;
  static constexpr std::size_t kPoolHeld = 4096;
  struct LanePool {
    std::vector<Lane> lanes;
    // Set when the thread's pool is destroyed: an index destroyed after it (held by a static,
    // or by another thread-local destroyed later) frees its lanes instead.
    static bool& gone() {
      thread_local bool flag = false;
      return flag;
    }
    ~LanePool() { gone() = true; }
  };
  static std::vector<Lane>* lane_pool() {
    if (LanePool::gone()) return nullptr;
    thread_local LanePool pool;
    return &pool.lanes;
  }
  // Empties the lanes into the pool (those it keeps).
  void recycle_lanes() noexcept {
    if (lanes_.empty()) return;
    std::vector<Lane>* pool = lane_pool();
    if (!pool) return;
    for (Lane& lane : lanes_) {
      if (pool->size() >= kPoolLanes || lane.held > kPoolHeld) continue;
      if (pool->capacity() == 0) {
        try {
          pool->reserve(kPoolLanes);
        } catch (...) {
          return;  // no room for the pool: the lanes go back to the heap
        }
      }
      // Only a non-empty bin holds entries or chunks.
      for (std::uint32_t w = 0; w < kWords; ++w) {
        for (std::uint64_t bits = lane.nonempty[w]; bits != 0; bits &= bits - 1) {
          Bin& bin = lane.bins[w * 64 + static_cast<std::uint32_t>(std::countr_zero(bits))];
          bin.first.clear();
          bin.rest.reset();
        }
      }
      lane.stream = 0;
      lane.nonempty = {};
      lane.words = 0;
      lane.bytes = 0;
      lane.count = 0;
      pool->push_back(std::move(lane));  // within the reservation: no throw
    }
  }

  static void mark(Lane& lane, std::uint32_t b) {
    lane.nonempty[b / 64] |= std::uint64_t{1} << (b % 64);
    lane.words |= std::uint32_t{1} << (b / 64);
  }
  static void unmark(Lane& lane, std::uint32_t b) {
    lane.nonempty[b / 64] &= ~(std::uint64_t{1} << (b % 64));
    if (lane.nonempty[b / 64] == 0) lane.words &= ~(std::uint32_t{1} << (b / 64));
  }

  template <class F>
  static void for_each_in(const Lane& lane, F& f) {
    for (std::uint32_t w = 0; w < kWords; ++w) {
      for (std::uint64_t bits = lane.nonempty[w]; bits != 0; bits &= bits - 1) {
        lane.bins[w * 64 + static_cast<std::uint32_t>(std::countr_zero(bits))].each(f);
      }
    }
  }

  // Stream ids below kDirect and the top 16 ids (the async pool's "any stream" and "unifier"
  // owners) find their lane through a table; others by a scan of the lanes.
  static constexpr std::uint32_t kDirect = 256;
  static constexpr StreamId kTopIds = 0xfffffff0u;
  static std::uint32_t direct_slot(StreamId stream) {
    if (stream < kDirect) return stream;
    if (stream >= kTopIds) return kDirect + (stream - kTopIds);
    return kNoLane;
  }

  std::uint32_t find_lane(StreamId stream) const {
    const std::uint32_t d = direct_slot(stream);
    if (d != kNoLane) return direct_[d] - 1;  // 0 (no lane) becomes kNoLane
    for (std::uint32_t i = 0; i < lanes_.size(); ++i) {
      if (lanes_[i].stream == stream) return i;
    }
    return kNoLane;
  }

  Lane& lane_for(StreamId stream) {
    const std::uint32_t i = find_lane(stream);
    if (i != kNoLane) return lanes_[i];
    if (lanes_.size() > 0xffff) throw std::length_error("FreeIndex: more than 65,536 streams");
    std::vector<Lane>* pool = lane_pool();
    if (pool && !pool->empty()) {
      lanes_.push_back(std::move(pool->back()));  // emptied by recycle_lanes
      pool->pop_back();
    } else {
      lanes_.emplace_back();
    }
    lanes_.back().stream = stream;
    const std::uint32_t d = direct_slot(stream);
    if (d != kNoLane) direct_[d] = static_cast<std::uint32_t>(lanes_.size());
    return lanes_.back();
  }

  // First entry in bins >= `from` of lane `l`: the rest of `from`'s word, then the first
  // non-empty word after it.
  Cursor first_from(std::uint32_t l, std::uint32_t from) const {
    if (from >= kBins) return {};
    const Lane& lane = lanes_[l];
    std::uint32_t w = from / 64;
    std::uint64_t bits = lane.nonempty[w] & (~std::uint64_t{0} << (from % 64));
    if (bits == 0) {
      const std::uint32_t later = w + 1 < 32 ? lane.words & (~std::uint32_t{0} << (w + 1)) : 0;
      if (later == 0) return {};
      w = static_cast<std::uint32_t>(std::countr_zero(later));
      bits = lane.nonempty[w];
    }
    return cursor(l, w * 64 + static_cast<std::uint32_t>(std::countr_zero(bits)), 0, 0);
  }

  // Last entry in bins <= `upto` of lane `l`.
  Cursor last_upto(std::uint32_t l, std::uint32_t upto) const {
    const Lane& lane = lanes_[l];
    for (std::uint32_t w = upto / 64 + 1; w-- > 0;) {
      std::uint64_t bits = lane.nonempty[w];
      if (w == upto / 64 && upto % 64 != 63) bits &= (std::uint64_t{1} << (upto % 64 + 1)) - 1;
      if (bits != 0) {
        const std::uint32_t b = w * 64 + 63 - static_cast<std::uint32_t>(std::countl_zero(bits));
        const Bin& bin = lane.bins[b];
        const std::uint32_t k = bin.chunks() - 1;
        return cursor(l, b, k, static_cast<std::uint32_t>(bin.chunk(k).size() - 1));
      }
    }
    return {};
  }

  void clear_after_move() {
    lanes_.clear();
    direct_ = {};
    count_ = 0;
    total_bytes_ = 0;
  }

  std::vector<Lane> lanes_;  // one per stream seen, in order of first use
  std::array<std::uint32_t, kDirect + 16> direct_{};  // lane index + 1 by direct_slot; 0: none yet
  std::size_t count_ = 0;
  Bytes total_bytes_ = 0;
};

}  // namespace vf::sim

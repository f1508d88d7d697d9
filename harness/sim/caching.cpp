// The shared model of PyTorch's caching allocator and its native (cudaMalloc) device layer.
// The expandable device layer is in caching_expandable.cpp. Rules: cuda-allocators.md §1.
#include "harness/sim/caching.h"

#include <cmath>

#include <algorithm>
#include <bit>
#include <cassert>

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf::sim {

// ---- Size rules ------------------------------------------------------------------------------

std::size_t roundup_interval(Bytes size) {
  // Intervals start at 1 MiB = 2^20: sizes below it share entry 0, sizes from 32 GiB entry 15.
  constexpr int kFirstLog2 = 20;
  const int log2 = std::bit_width(size) - 1;
  const std::size_t index = log2 > kFirstLog2 ? static_cast<std::size_t>(log2 - kFirstLog2) : 0;
  return std::min(index, kRoundupIntervals - 1);
}

namespace {

// Rounds up to the next of `divisions` equal steps between the power of two at or below `size`
// and the next power of two; exact powers of two stay as they are. 4 divisions of [1 MiB, 2 MiB)
// are 1, 1.25, 1.5 and 1.75 MiB, so 1.1 MiB becomes 1.25 MiB.
Bytes round_to_division(Bytes size, Bytes divisions) {
  if (std::has_single_bit(size)) return size;
  const Bytes floor = std::bit_floor(size);
  const Bytes step = floor >> (std::bit_width(divisions) - 1);  // floor / divisions
  if (step == 0) return floor << 1;
  return round_up(size, step);
}

}  // namespace

Bytes round_size(Bytes size, const RoundupDivisions& divisions) {
  if (size < kMinBlockSize) return kMinBlockSize;
  const Bytes d = divisions[roundup_interval(size)];
  // PyTorch applies the divisions only when each step would be larger than 512 B, i.e. for
  // sizes above 512 x divisions; smaller sizes keep plain 512 B rounding.
  if (d > 1 && size > kMinBlockSize * d) return round_to_division(size, d);
  return round_up(size, kMinBlockSize);
}

Bytes allocation_size(Bytes rounded, Bytes large_segment_size) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return large_segment_size;
  return round_up(rounded, kRoundLarge);
}

// ---- Construction and bookkeeping --------------------------------------------------------------

CachingAllocator::CachingAllocator(DeviceLayer& device, const CachingOptions& options)
    : device_(device), options_(options) {
  small_.small = true;
  large_.small = false;
  any_divisions_ = std::any_of(options_.roundup_divisions.begin(), options_.roundup_divisions.end(),
                               [](std::uint32_t d) { return d > 1; });
  // set_per_process_memory_fraction: the limit is f x the device's total memory, rounded to the
  // nearest byte (PyTorch 2026: std::round; earlier versions truncated), and it is compared with
  // *reserved* memory (segments), not with allocated bytes. f = 1 sets no limit.
  if (options_.memory_fraction < 1.0) {
    allowed_ = static_cast<Bytes>(std::round(options_.memory_fraction * static_cast<double>(device.spec().total)));
  }
}

CachingAllocator::~CachingAllocator() {
  recycle_keep(keys_);
  recycle_keep(blocks_);
}

void CachingAllocator::reserve_keys(std::size_t keys) {
  recycle_reserve(keys_, keys);
  // A program's blocks at once are usually far fewer than its buffers: a small program's table
  // grows as it runs (reserving one per buffer made every flux2-dev case under dynamic VRAM
  // allocate and free half a megabyte of blocks it never touched).
  if (keys >= kRecycleMin) recycle_reserve(blocks_, keys);
}

CachingAllocator::Index CachingAllocator::new_block() {
  Index i;
  if (!spare_blocks_.empty()) {
    i = spare_blocks_.back();
    spare_blocks_.pop_back();
    blocks_[i] = Block{};
  } else {
    i = static_cast<Index>(blocks_.size());
    blocks_.emplace_back();
  }
  return i;
}

void CachingAllocator::recycle_block(Index b) { spare_blocks_.push_back(b); }

CachingAllocator::Index CachingAllocator::new_segment_slot() {
  if (!spare_segments_.empty()) {
    const Index i = spare_segments_.back();
    spare_segments_.pop_back();
    segments_[i] = Segment{};
    return i;
  }
  segments_.emplace_back();
  return static_cast<Index>(segments_.size() - 1);
}

void CachingAllocator::erase_free(Index bi) {
  const Block& b = blocks_[bi];
  pool_of(b).blocks.erase(b.stream, b.size, b.addr);
}

void CachingAllocator::insert_unmapped(Index bi) {
  Block& b = blocks_[bi];
  unmapped_nodes_.insert(pool_of(b).unmapped, UnmappedKey{b.stream, b.addr, bi});
  b.state = State::unmapped;
}

void CachingAllocator::erase_unmapped(Index bi) {
  const Block& b = blocks_[bi];
  UnmappedSet& set = pool_of(b).unmapped;
  const auto it = set.find(UnmappedKey{b.stream, b.addr, bi});
  assert(it != set.end() && it->block == bi);
  unmapped_nodes_.erase(set, it);
}

// ---- malloc ----------------------------------------------------------------------------------

bool CachingAllocator::malloc(BlockKey key, Bytes size, StreamId stream) {
  if (key < keys_.size() && keys_[key] != kNone) {
    throw InfraError(fmt::format("caching allocator: block {} allocated twice", key));
  }
  cover_key(keys_, key, kNone);

  // An empty tensor has no storage: PyTorch's allocate() never calls the allocator for it.
  if (size == 0) {
    keys_[key] = kZeroSized;
    return true;
  }
  // allocate() refuses 1 EiB and more (`size < one_exa_bytes`) before the allocator runs: no
  // events are processed and the allocator's OOM count does not move.
  if (size >= kMaxRequest) {
    last_failure_ = Failure::device;
    record_oom(size, size, size, stream);
    return false;
  }

  // Every malloc that reaches the allocator first reclaims blocks whose cross-stream events have
  // completed (§1.9).
  ++malloc_count_;
  if (!pending_.empty()) process_events();

  // Without a roundup_power2_divisions table, round_size is plain 512 B rounding.
  const Bytes rounded = any_divisions_ ? round_size(size, options_.roundup_divisions)
                                       : std::max(kMinBlockSize, round_up(size, kMinBlockSize));
  Pool& pool = rounded <= kSmallSize ? small_ : large_;
  const Bytes alloc_size = allocation_size(rounded, options_.large_segment_size);

  // §1.6: cache lookup, then a new segment, then the failure ladder.
  FreeIndex::Cursor cached;
  Bytes found_size = 0;
  DeviceAddr found_addr = 0;
  Index b = get_free_block(pool, stream, rounded, cached, found_size, found_addr);
  if (b == kNone) {
    if (gc_enabled()) garbage_collect_cached_blocks();
    b = alloc_block(pool, stream, rounded, alloc_size);
    // Rung 1 (max_split_size_mb set): free cached oversize blocks of this stream, retry.
    if (b == kNone && release_available_cached_blocks(pool, stream, rounded)) {
      b = alloc_block(pool, stream, rounded, alloc_size);
    }
    // Rung 2: wait for every outstanding event, release every fully free segment (both pools,
    // all streams; expandable: unmap every free page), retry once.
    if (b == kNone) {
      release_cached_blocks();
      ++stats_.num_alloc_retries;
      b = alloc_block(pool, stream, rounded, alloc_size);
    }
    if (b != kNone) {
      found_size = blocks_[b].size;
      found_addr = blocks_[b].addr;
    }
  }
  if (b == kNone) {
    record_oom(size, rounded, alloc_size, stream);
    return false;
  }
  keys_[key] = hand_out(b, pool, found_size, found_addr, rounded, size, key, cached);
  return true;
}

// Best fit: the smallest cached block on the same stream that holds `size`.
// This and hand_out are inlined into malloc, their one caller: the register saves of their calls
// were a tenth of a pair's instructions.
[[gnu::always_inline]] inline CachingAllocator::Index CachingAllocator::get_free_block(
    Pool& pool, StreamId stream, Bytes size, FreeIndex::Cursor& at, Bytes& found_size, DeviceAddr& found_addr) {
  if (gc_enabled()) ++pool.lookups;  // GC ages blocks by the lookups made since they were cached
  FreeIndex::Cursor it = pool.blocks.lower_bound(stream, size);
  if (!it.valid) return kNone;

  if (options_.expandable_segments) {
    // A block at the end of a segment can grow into the unmapped VA after it, so for best fit
    // PyTorch compares what each candidate could expand to and skips ahead to a larger block
    // whose expandable size is smaller (keeping the growable tail for bigger requests).
    for (FreeIndex::Cursor next = pool.blocks.next(it);
         next.valid && expandable_size(pool.blocks.at(next).block) < expandable_size(pool.blocks.at(it).block);
         next = pool.blocks.next(next)) {
      it = next;
    }
  }

  // Oversize rules (§1.4), inert unless max_split_size_mb is set: a request below max_split
  // may not take an oversize block; an oversize request may take a block only if it wastes
  // less than max_non_split_rounding_mb.
  const FreeIndex::Entry& e = pool.blocks.at(it);
  if (size < options_.max_split_size && e.size >= options_.max_split_size) return kNone;
  if (size >= options_.max_split_size && e.size >= size + options_.max_non_split_rounding) return kNone;

  at = it;  // hand_out erases it, or keeps a split's remainder in its place, without a search
  found_size = e.size;
  found_addr = e.addr;
  return e.block;
}

CachingAllocator::Index CachingAllocator::alloc_block(Pool& pool, StreamId stream, Bytes rounded,
                                                      Bytes alloc_size) {
  // The memory fraction is checked before the device is touched. PyTorch compares the segment
  // size a native miss would ask for (alloc_size), in expandable mode too.
  if (allowed_ && stats_.reserved.current + alloc_size > *allowed_) {
    last_failure_ = Failure::fraction;
    return kNone;
  }
  return options_.expandable_segments ? map_expandable(pool, stream, rounded)
                                      : new_segment(pool, stream, alloc_size);
}

bool CachingAllocator::should_split(Bytes block_size, bool small, Bytes size) const {
  const Bytes remaining = block_size - size;
  // Small pool and expandable segments: any remainder of at least one 512 B block is kept.
  if (small || options_.expandable_segments) return remaining >= kMinBlockSize;
  // Large pool: split only below max_split and only if more than 1 MiB would be left; otherwise
  // the whole block is handed out and the slack counts as allocated.
  return size < options_.max_split_size && remaining > kSmallSize;
}

[[gnu::always_inline]] inline CachingAllocator::Index CachingAllocator::hand_out(
    Index found, Pool& pool, Bytes found_size, DeviceAddr found_addr, Bytes rounded, Bytes requested, BlockKey key,
    FreeIndex::Cursor cached) {
  const bool tracks_split = !options_.expandable_segments;  // PyTorch excludes expandable here
  const bool already_split = is_split(blocks_[found]);
  Index out = found;
  if (should_split(found_size, pool.small, rounded)) {
    // The front `rounded` bytes become the allocation; the found block keeps the rest, free.
    out = new_block();
    Block& a = blocks_[out];
    Block& rest = blocks_[found];
    a.addr = found_addr;
    a.size = rounded;
    a.segment = rest.segment;
    a.stream = rest.stream;
    a.small = rest.small;
    a.prev = rest.prev;
    if (a.prev != kNone) blocks_[a.prev].next = out;
    a.next = found;
    rest.prev = out;
    // The remainder's size and address from the entry's, in registers on their way to the index.
    const Bytes rest_size = found_size - rounded;
    const DeviceAddr rest_addr = found_addr + rounded;
    rest.addr = rest_addr;
    rest.size = rest_size;
    insert_free(found, pool, rest_size, rest_addr, cached);  // it keeps the found block's entry, if it had one
    if (tracks_split) {
      if (already_split) {
        stats_.inactive_split.sub(rounded);  // a free piece of a split segment shrank
      } else {
        stats_.inactive_split.add(rest_size);  // an unsplit block just became split
      }
    }
  } else {
    if (cached.valid) pool.blocks.erase_at(cached);
    if (already_split && tracks_split) stats_.inactive_split.sub(found_size);  // a free piece became active whole
  }

  Block& a = blocks_[out];
  a.state = State::allocated;
  a.requested = requested;
  a.key = key;
  stats_.allocated.add(a.size);
  stats_.active.add(a.size);
  stats_.requested.add(requested);
  return out;
}

// ---- free ------------------------------------------------------------------------------------

void CachingAllocator::free(BlockKey key) {
  if (key >= keys_.size() || keys_[key] == kNone) {
    throw InfraError(fmt::format("caching allocator: free of unknown block {}", key));
  }
  const Index bi = keys_[key];
  keys_[key] = kNone;
  if (bi == kZeroSized) return;

  Block& b = blocks_[bi];
  stats_.allocated.sub(b.size);  // allocated drops now; active and requested when it is cached
  if (b.uses != kNone) {
    // One event per stream that used the block, recorded now; the block stays out of the cache
    // ("active_awaiting_free") until a later malloc sees all of them complete.
    const std::uint64_t ready =
        options_.event_lag_mallocs ? malloc_count_ + *options_.event_lag_mallocs + 1 : kNever;
    std::vector<StreamId>& uses = uses_[b.uses];
    for (std::size_t i = 0; i < uses.size(); ++i) {
      ++b.event_count;
      pending_.push_back(PendingEvent{bi, ready});
    }
    uses.clear();
    spare_uses_.push_back(b.uses);
    b.uses = kNone;
    b.state = State::awaiting_events;
    awaiting_bytes_ += b.size;
    return;
  }
  free_block(bi);
}

// Returns a block to its pool's cache, merged with free neighbours of the same segment.
inline void CachingAllocator::free_block(Index bi) {
  const Bytes original = blocks_[bi].size;
  const Bytes requested = blocks_[bi].requested;
  Bytes subsumed = 0;
  const Index prev = blocks_[bi].prev;
  const Index next = blocks_[bi].next;
  const bool prev_free = prev != kNone && blocks_[prev].state == State::free;
  const bool next_free = next != kNone && blocks_[next].state == State::free;
  // The merged block takes over a free neighbour's index entry (moved in place when it stays in
  // its chunk) instead of erasing it and inserting anew: the next's entry goes first when both
  // are free, since an erase moves the prev's.
  if (prev_free && next_free) subsumed += try_merge(bi, next);
  const Index heir = prev_free ? prev : next_free ? next : kNone;
  if (heir != kNone) {
    const Block& h = blocks_[heir];
    const FreeIndex::Cursor entry = pool_of(h).blocks.find(h.stream, h.size, h.addr);
    subsumed += absorb(bi, heir);
    insert_free(bi, entry);
  } else {
    insert_free(bi);
  }
  if (!options_.expandable_segments) {
    stats_.inactive_split.sub(subsumed);
    if (is_split(blocks_[bi])) stats_.inactive_split.add(blocks_[bi].size);
  }
  stats_.active.sub(original);
  stats_.requested.sub(requested);
}

// Merges free `src` into `dst` (its neighbour); returns the bytes absorbed (0 if src is busy).
Bytes CachingAllocator::try_merge(Index dst, Index src) {
  if (src == kNone || blocks_[src].state != State::free) return 0;
  erase_free(src);
  return absorb(dst, src);
}

void CachingAllocator::record_stream(BlockKey key, StreamId stream) {
  if (key >= keys_.size() || keys_[key] == kNone) {
    throw InfraError(fmt::format("caching allocator: record_stream of unknown block {}", key));
  }
  if (keys_[key] == kZeroSized) return;
  Block& b = blocks_[keys_[key]];
  if (stream == b.stream) return;  // uses on the allocation stream need no event
  if (b.uses == kNone) {
    if (spare_uses_.empty()) {
      b.uses = static_cast<Index>(uses_.size());
      uses_.emplace_back();
    } else {
      b.uses = spare_uses_.back();
      spare_uses_.pop_back();
    }
  }
  std::vector<StreamId>& uses = uses_[b.uses];
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
}

// ---- Events: when is another stream's work "done"? ------------------------------------------
// The sim has no clock. An event recorded at free time completes when (a) the device is
// synchronized (synchronize(), empty_cache(), the OOM ladder's sync), or (b) with the
// `sim_event_lag` option, once that many later mallocs have gone by. Completed events are
// noticed, as in PyTorch, only by the next malloc's process_events (or by empty_cache).

void CachingAllocator::process_events() {
  // Events are queued in recording order with non-decreasing ready_at, so the queue is drained
  // from the front (PyTorch keeps one queue per stream; one queue gives the same order here).
  while (!pending_.empty() && pending_.front().ready_at <= malloc_count_) {
    const Index b = pending_.front().block;
    pending_.pop_front();
    event_done(b);
  }
}

// A malloc on `stream` reuses only its own stream's cached blocks (PyTorch keys the free lists
// by stream); blocks cached for other streams and blocks still waiting for other streams'
// events are reserved memory it cannot have (until an OOM's release frees whole segments).
Bytes CachingAllocator::held_for_other_streams(StreamId stream, Bytes request) const {
  if (request == 0 || request >= kMaxRequest) {
    Bytes held = awaiting_bytes_;
    for (const Pool* pool : {&large_, &small_}) held += pool->blocks.total_bytes() - pool->blocks.bytes(stream);
    return held;
  }
  // What get_free_block would have taken for this request: a block of the request's pool of at
  // least its rounded size, within the oversize rules (a request below max_split never takes an
  // oversize block; an oversize one only a block that wastes less than max_non_split_rounding).
  const Bytes rounded = round_size(request, options_.roundup_divisions);
  const bool small = rounded <= kSmallSize;
  const Bytes hi = rounded < options_.max_split_size ? options_.max_split_size
                   : rounded > kUnlimited - options_.max_non_split_rounding ? kUnlimited
                                                                            : rounded + options_.max_non_split_rounding;
  const Pool& pool = small ? small_ : large_;
  Bytes held = 0;
  if (options_.expandable_segments) {
    // A free block at the end of its segment can grow into the unmapped VA after it: it could
    // have held what fits in its expandable size.
    pool.blocks.for_each_except(stream, [&](const FreeIndex::Entry& e) {
      if (e.size < hi && (e.size >= rounded || expandable_size(e.block) >= rounded)) held += e.size;
    });
  } else {
    held = pool.blocks.bytes_in(stream, rounded, hi);
  }
  // Blocks still waiting for other streams' events, whichever stream freed them (each once,
  // however many of its events are pending).
  if (awaiting_bytes_ > 0) {
    std::vector<Index> waiting;
    for (const PendingEvent& e : pending_) {
      const Block& b = blocks_[e.block];
      if (b.small == small && b.size >= rounded && b.size < hi) waiting.push_back(e.block);
    }
    std::sort(waiting.begin(), waiting.end());
    waiting.erase(std::unique(waiting.begin(), waiting.end()), waiting.end());
    for (const Index b : waiting) held += blocks_[b].size;
  }
  return held;
}

// One of the block's pending events completed; with the last, the block returns to the cache.
void CachingAllocator::event_done(Index b) {
  if (--blocks_[b].event_count != 0) return;
  awaiting_bytes_ -= blocks_[b].size;
  free_block(b);
}

void CachingAllocator::synchronize() {
  // The device is idle: every recorded event has completed. The blocks return to the cache
  // when the next malloc (or empty_cache) looks at the events, exactly as in PyTorch.
  for (PendingEvent& e : pending_) e.ready_at = 0;
}

void CachingAllocator::synchronize_and_free_events() {
  while (!pending_.empty()) {
    const Index b = pending_.front().block;
    pending_.pop_front();
    event_done(b);
  }
}

// ---- Giving memory back ----------------------------------------------------------------------

void CachingAllocator::empty_cache() { release_cached_blocks(); }

void CachingAllocator::release_cached_blocks() {
  synchronize_and_free_events();
  if (options_.expandable_segments) {
    release_pool_expandable(large_);
    release_pool_expandable(small_);
  } else {
    release_pool_native(large_);
    release_pool_native(small_);
  }
}

// Rung 1 of the ladder, only with max_split_size_mb: free the smallest cached oversize block of
// this stream that is at least max(request, max_split); if there is none, free oversize blocks
// largest first until that much is freed. Expandable blocks are never released this way.
bool CachingAllocator::release_available_cached_blocks(Pool& pool, StreamId stream, Bytes rounded) {
  if (options_.max_split_size == kUnlimited || options_.expandable_segments) return false;
  const Bytes target = std::max(rounded, options_.max_split_size);
  const FreeIndex::Cursor fit = pool.blocks.lower_bound(stream, target);
  if (fit.valid) {
    release_block(pool.blocks.at(fit).block);
    return true;
  }
  Bytes released = 0;
  for (FreeIndex::Cursor c = pool.blocks.last(stream);
       c.valid && released < target && pool.blocks.at(c).size >= options_.max_split_size; c = pool.blocks.last(stream)) {
    released += pool.blocks.at(c).size;
    release_block(pool.blocks.at(c).block);
  }
  return released >= target;
}

// garbage_collection_threshold (§1.7): when reserved exceeds threshold x allowed, free unsplit
// cached large-pool blocks whose age (pool lookups since they were cached) is at least the mean
// age, repeating until the excess is reclaimed or nothing old enough is left.
void CachingAllocator::garbage_collect_cached_blocks() {
  // Expandable blocks are never released by GC (and a free expandable block is never unsplit).
  if (options_.expandable_segments) return;
  const Bytes threshold =
      static_cast<Bytes>(options_.garbage_collection_threshold * static_cast<double>(*allowed_));
  if (stats_.reserved.current <= threshold) return;
  const Bytes target = stats_.reserved.current - threshold;

  std::uint64_t total_age = 0;
  std::uint64_t count = 0;
  scratch_.clear();
  large_.blocks.collect(scratch_);
  for (const Index bi : scratch_) {
    const Block& b = blocks_[bi];
    if (!is_split(b)) {
      total_age += large_.lookups - b.gc_base;
      ++count;
    }
  }
  Bytes reclaimed = 0;
  bool freed = true;
  while (reclaimed < target && freed && count > 0) {
    const double age_threshold = static_cast<double>(total_age) / static_cast<double>(count);
    freed = false;
    scratch_.clear();
    large_.blocks.collect(scratch_);
    for (const Index bi : scratch_) {
      const Block& b = blocks_[bi];
      const std::uint64_t age = large_.lookups - b.gc_base;
      if (!is_split(b) && static_cast<double>(age) >= age_threshold) {
        freed = true;
        reclaimed += b.size;
        total_age -= age;
        --count;
        release_block(bi);
      }
    }
  }
}

// ---- Native device layer: one cudaMalloc per segment -----------------------------------------

CachingAllocator::Index CachingAllocator::new_segment(Pool& pool, StreamId stream, Bytes alloc_size) {
  const auto a = device_.segment_malloc(alloc_size);
  if (!a) {
    last_failure_ = Failure::device;
    return kNone;
  }
  const Index s = new_segment_slot();
  segments_[s].live = true;
  segments_[s].alloc = *a;
  const Index bi = new_block();
  Block& b = blocks_[bi];
  b.addr = a->addr;
  b.size = alloc_size;
  b.segment = s;
  b.stream = stream;
  b.small = pool.small;
  stats_.reserved.add(alloc_size);
  ++stats_.num_device_alloc;
  return bi;  // not in the free set: the caller hands it out
}

// cudaFree of a whole, free segment.
void CachingAllocator::release_block(Index bi) {
  Block& b = blocks_[bi];
  erase_free(bi);
  Segment& seg = segments_[b.segment];
  device_.segment_free(seg.alloc);
  seg.live = false;
  spare_segments_.push_back(b.segment);
  stats_.reserved.sub(b.size);
  ++stats_.num_device_free;
  recycle_block(bi);
}

// Frees every cached block that is a whole segment; split segments stay (§1.5).
void CachingAllocator::release_pool_native(Pool& pool) {
  scratch_.clear();
  pool.blocks.collect(scratch_);
  for (const Index bi : scratch_) {
    if (!is_split(blocks_[bi])) release_block(bi);
  }
}

// ---- Stats and introspection ------------------------------------------------------------------

void CachingAllocator::record_oom(Bytes size, Bytes rounded, Bytes alloc_size, StreamId stream) {
  if (size < kMaxRequest) ++stats_.num_ooms;  // the 1 EiB refusal happens before the allocator
  OomInfo info;
  info.request = size;
  info.device_free = device_.free_bytes();
  info.reserved = stats_.reserved.current;
  info.allocated = stats_.allocated.current;
  std::string why;
  if (size >= kMaxRequest) {
    why = "1 EiB or more is refused before the allocator runs (PyTorch: \"Tried to allocate more than 1EB memory\")";
  } else if (last_failure_ == Failure::fraction) {
    why = fmt::format("per_process_memory_fraction: reserved {} + new segment {} > allowed {}",
                      format_mib(stats_.reserved.current), format_mib(alloc_size), format_mib(*allowed_));
  } else if (options_.expandable_segments) {
    why = fmt::format("mapping pages for {} failed with {} free on the device", format_mib(rounded),
                      format_mib(device_.free_bytes()));
  } else {
    why = fmt::format("cudaMalloc({}) failed with {} free on the device", format_mib(alloc_size),
                      format_mib(device_.free_bytes()));
  }
  info.detail = fmt::format(
      "{}: tried to allocate {} (rounded {}) on stream {} after the retry ladder; {}; {} reserved but "
      "unallocated",
      allocator_mode_name(mode()), format_mib(size), format_mib(rounded), stream, why,
      format_mib(stats_.reserved.current - stats_.allocated.current));
  last_oom_ = std::move(info);
}

void CachingAllocator::reset_peak_stats() {
  stats_.reset_peaks();
}

void CachingAllocator::live_blocks(std::vector<BlockView>& out) const {
  for (BlockKey k = 0; k < keys_.size(); ++k) {
    const Index bi = keys_[k];
    if (bi == kNone || bi == kZeroSized) continue;
    const Block& b = blocks_[bi];
    out.push_back(BlockView{k, b.addr, b.size, b.requested, b.stream});
  }
}

std::optional<DeviceAddr> CachingAllocator::address(BlockKey key) const {
  if (key >= keys_.size() || keys_[key] == kNone || keys_[key] == kZeroSized) return std::nullopt;
  return blocks_[keys_[key]].addr;
}

std::size_t CachingAllocator::segment_count() const {
  return static_cast<std::size_t>(
      std::count_if(segments_.begin(), segments_.end(), [](const Segment& s) { return s.live; }));
}

}  // namespace vf::sim

// The cudaMallocAsync pool model. Rules: cuda-allocators.md §2, §3.1, §7.5; modelling choices
// the sources leave open are marked UNVERIFIED here and in docs/allocators.md.
#include "harness/sim/async_pool.h"

#include <algorithm>
#include <iterator>
#include <tuple>

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf::sim {

namespace {

// PyTorch refuses requests of 1 EB and more before calling CUDA.
constexpr Bytes kMaxAsyncRequest = Bytes{1} << 60;
constexpr std::uint32_t kNoSlot = ~std::uint32_t{0};

}  // namespace

AsyncPoolAllocator::AsyncPoolAllocator(SimDevice& device, const AsyncOptions& options, std::uint64_t seed)
    : device_(device), options_(options), rng_state_(seed) {
  if (options_.memory_fraction < 1.0) {
    limit_ = static_cast<Bytes>(options_.memory_fraction * static_cast<double>(device.spec().total));
  }
  const Bytes g = options_.pool_granularity;
  const Bytes arena = round_up(std::max(device.spec().total, g), g) * kAsyncArenaFactor;
  base_ = round_up(device_.reserve_address_range(arena + g), g);  // chunk-aligned start
  Range all;
  all.start = base_;
  all.size = arena;
  all.kind = Kind::unmapped;
  insert_range(all);
}

// ---- Range bookkeeping -----------------------------------------------------------------------

AsyncPoolAllocator::Open::iterator AsyncPoolAllocator::insert_range(const Range& r) {
  auto it = open_nodes_.insert(open_, Open::value_type{r.end(), r});
  std::uint32_t slot = 0;
  if (!spare_slots_.empty()) {
    slot = spare_slots_.back();
    spare_slots_.pop_back();
    slots_[slot] = it;
  } else {
    slot = static_cast<std::uint32_t>(slots_.size());
    slots_.push_back(it);
  }
  it->second.slot = slot;
  if (r.kind == Kind::free) sizes_.insert(r.owner, r.size, r.start, slot);
  return it;
}

AsyncPoolAllocator::Open::iterator AsyncPoolAllocator::erase_range(Open::iterator it) {
  if (it->second.kind == Kind::free) sizes_.erase(it->second.owner, it->second.size, it->second.start);
  spare_slots_.push_back(it->second.slot);
  auto next = std::next(it);
  open_nodes_.erase(open_, it);
  return next;
}

// The open range that starts exactly at `addr`, or end().
AsyncPoolAllocator::Open::iterator AsyncPoolAllocator::starting_at(DeviceAddr addr) {
  const auto it = open_.upper_bound(addr);  // the first range ending after addr: the one holding it
  return it != open_.end() && it->second.start == addr ? it : open_.end();
}

// Moves a range's start up to `start` (it loses its front); its end, the key, stays.
void AsyncPoolAllocator::resize_front(Open::iterator it, DeviceAddr start) {
  Range& r = it->second;
  if (r.kind == Kind::free) sizes_.replace(r.owner, r.size, r.start, r.end() - start, start);
  r.size = r.end() - start;
  r.start = start;
}

void AsyncPoolAllocator::set_owner(Open::iterator it, StreamId owner, std::uint64_t tick, bool opportunistic) {
  Range& r = it->second;
  sizes_.erase(r.owner, r.size, r.start);
  r.owner = owner;
  r.free_tick = tick;
  r.opportunistic = opportunistic;
  sizes_.insert(owner, r.size, r.start, r.slot);
}

// Adds `r`, which covers address space no open range covers, merged with its neighbours when no
// tensor lies between and they are of one class: unmapped with unmapped, free with free of the
// same owner. UNVERIFIED modelling choice: free memory of different owners stays apart (each
// keeps its own reuse rule); merged frees of one owner keep the later free tick and are
// opportunistic only if all were. Merging into the range above keeps that range's node and key.
AsyncPoolAllocator::Open::iterator AsyncPoolAllocator::place(Range r) {
  auto one_class = [](const Range& a, const Range& b) {
    return a.kind == b.kind && (a.kind == Kind::unmapped || a.owner == b.owner);
  };
  const auto next = open_.upper_bound(r.start);  // the first range above r
  if (next != open_.begin()) {
    const auto prev = std::prev(next);
    if (prev->first == r.start && one_class(prev->second, r)) {
      const Range& l = prev->second;
      r.start = l.start;
      r.size += l.size;
      r.free_tick = std::max(r.free_tick, l.free_tick);
      r.opportunistic = r.opportunistic && l.opportunistic;
      erase_range(prev);
    }
  }
  if (next != open_.end() && next->second.start == r.end() && one_class(r, next->second)) {
    Range& u = next->second;
    if (u.kind == Kind::free) sizes_.replace(u.owner, u.size, u.start, u.size + r.size, r.start);
    u.start = r.start;
    u.size += r.size;
    u.free_tick = std::max(u.free_tick, r.free_tick);
    u.opportunistic = u.opportunistic && r.opportunistic;
    return next;
  }
  return insert_range(r);
}

// Merges an open range with its neighbours as place() does.
AsyncPoolAllocator::Open::iterator AsyncPoolAllocator::coalesce(Open::iterator it) {
  const Range r = it->second;
  erase_range(it);
  return place(r);
}

void AsyncPoolAllocator::ensure_stream(StreamId s) {
  if (s >= kMaxAsyncStreams) {
    throw InfraError(fmt::format("async pool: stream id {} is out of range (0..{})", s, kMaxAsyncStreams - 1));
  }
  if (s < ticks_.size()) return;
  const std::size_t n = static_cast<std::size_t>(s) + 1;
  ticks_.resize(n, 0);
  for (auto& row : seen_) row.resize(n, 0);
  seen_.resize(n, std::vector<std::uint64_t>(n, 0));
}

// `waiter` now runs after everything `target` has issued, and after everything target itself
// was ordered after (event edges are transitive).
void AsyncPoolAllocator::order_after(StreamId waiter, StreamId target) {
  std::vector<std::uint64_t>& w = seen_[waiter];
  const std::vector<std::uint64_t>& t = seen_[target];
  for (std::size_t s = 0; s < t.size(); ++s) w[s] = std::max(w[s], t[s]);
  w[target] = std::max(w[target], ticks_[target]);
}

// A splitmix64 step: the opportunistic coin, seeded per allocator, so a trace replays exactly.
bool AsyncPoolAllocator::coin() {
  const double p = options_.opportunistic_probability;
  if (p <= 0) return false;
  if (p >= 1) return true;
  rng_state_ += 0x9e3779b97f4a7c15ull;
  std::uint64_t z = rng_state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53 < p;
}

// ---- Who may reuse a free range --------------------------------------------------------------

bool AsyncPoolAllocator::usable(const Range& r, StreamId stream) const {
  if (r.owner == kAnyStream || r.owner == stream) return true;  // synchronized, or same stream
  if (options_.reuse_allow_opportunistic && r.opportunistic) return true;
  // ReuseFollowEventDependencies: the asking stream waited on the owner after the free.
  return options_.reuse_follow_event_dependencies && r.owner != kUnifierStream &&
         seen_[stream][r.owner] >= r.free_tick;
}

// Free ranges `stream` may not reuse yet: other streams' frees it is not ordered after (the
// driver would take them only once the pool cannot grow, ReuseAllowInternalDependencies).
Bytes AsyncPoolAllocator::held_for_other_streams(StreamId stream, Bytes request) const {
  // A stream the pool has not seen yet is ordered after nothing: only synchronized frees and
  // those the coin completed are its to take.
  // Synchronized frees are everyone's: only the ranges of a stream (or the unifier) are visited,
  // through their slots, so a traced run pays for the frees since the last sync, not the pool.
  const bool seen = stream < seen_.size();
  std::vector<DeviceAddr> withheld;  // starts of the ranges `stream` may not take
  Bytes held = 0;
  sizes_.for_each_except(kAnyStream, [&](const FreeIndex::Entry& e) {
    const Range& r = slots_[e.block]->second;
    const bool ok = seen ? usable(r, stream) : options_.reuse_allow_opportunistic && r.opportunistic;
    if (ok) return;
    held += r.size;
    if (request > 0) withheld.push_back(r.start);
  });
  if (request == 0 || held == 0) return held;
  // With a request: only the withheld ranges in a run long enough for it, where the pool would
  // have placed it had every free been this stream's: adjacent free memory (whoever owns it) and
  // unmapped address space (grow() maps chunks into a run), across the block the last malloc
  // placed (held right after it is asked about the memory before it). Each run is walked once:
  // the withheld ranges are visited in address order.
  const Bytes rounded = request >= kMaxAsyncRequest ? request : round_up(request, kAsyncAlign);
  auto joined = [&](Open::const_iterator below, Open::const_iterator above, Bytes& bridge) {
    bridge = 0;
    if (below->first == above->second.start) return true;
    if (last_placed_size_ > 0 && below->first == last_placed_ && last_placed_ + last_placed_size_ == above->second.start) {
      bridge = last_placed_size_;
      return true;
    }
    return false;
  };
  std::sort(withheld.begin(), withheld.end());
  held = 0;
  DeviceAddr run_end = 0;  // the end of the last run walked
  bool run_fits = false;
  for (const DeviceAddr start : withheld) {
    const Open::const_iterator it = open_.upper_bound(start);  // the range starting at `start`
    if (start >= run_end) {
      Bytes total = it->second.size;
      Bytes bridge = 0;
      for (Open::const_iterator lo = it; lo != open_.begin();) {
        const Open::const_iterator below = std::prev(lo);
        if (!joined(below, lo, bridge)) break;
        total += below->second.size + bridge;
        lo = below;
      }
      Open::const_iterator hi = it;
      for (Open::const_iterator above = std::next(hi); above != open_.end() && joined(hi, above, bridge); ++above) {
        total += above->second.size + bridge;
        hi = above;
      }
      run_end = hi->first;
      run_fits = total >= rounded;
    }
    if (run_fits) held += it->second.size;
  }
  return held;
}

// ---- malloc ----------------------------------------------------------------------------------

bool AsyncPoolAllocator::malloc(BlockKey key, Bytes size, StreamId stream) {
  if (key < keys_.size() && keys_[key].live) {
    throw InfraError(fmt::format("async pool: block {} allocated twice", key));
  }
  if (key >= keys_.size()) keys_.resize(static_cast<std::size_t>(key) + 1);
  ensure_stream(stream);
  last_placed_size_ = 0;  // held_for_other_streams bridges only the block this malloc places
  // A retry right after a failed request (aimdo's hook evicts and calls again within one op)
  // keeps counting from what the first attempt met; any other request starts afresh.
  if (!last_failed_) retained_ = 0;
  last_failed_ = false;
  failed_pieces_.clear();
  if (size == 0) {  // PyTorch does not call cudaMallocAsync for an empty tensor
    keys_[key] = Live{true, true, 0, 0, 0, stream, false};
    return true;
  }
  if (size >= kMaxAsyncRequest) {
    record_oom(size, size, stream, false);
    return false;
  }
  // PyTorch's own memory-fraction check, on the sum of requested bytes, before calling CUDA.
  if (limit_ && stats_.requested.current + size > *limit_) {
    record_oom(size, round_up(size, kAsyncAlign), stream, true);
    return false;
  }

  const Bytes rounded = round_up(size, kAsyncAlign);
  DeviceAddr at = 0;
  std::uint32_t slot = kNoSlot;
  // Reuse what this stream may reuse (best fit on one free range of its own or synchronized
  // memory, else the best run of adjacent usable free ranges, other streams' frees included
  // where an event edge or the coin allows), else grow the pool.
  bool found = best_single_fit(stream, rounded, at, slot) ||
               best_run([&](const Range& r) { return usable(r, stream); }, rounded, at) ||
               grow(stream, rounded, at);
  // ReuseAllowInternalDependencies: only once the pool could not grow, take frees still
  // pending on other streams and let the driver insert the wait.
  if (!found && options_.reuse_allow_internal_dependencies &&
      best_run([](const Range&) { return true; }, rounded, at)) {
    take_with_internal_dependency(stream, at, rounded);
    found = true;
  }
  if (!found) {  // PyTorch raises at once: no synchronize, trim or retry
    keep_failed_growth(stream);
    record_oom(size, rounded, stream, false);
    last_failed_ = true;
    return false;
  }
  carve(slot != kNoSlot ? slots_[slot] : starting_at(at), at, rounded);
  last_placed_ = at;
  last_placed_size_ = rounded;
  keys_[key] = Live{true, false, at, rounded, size, stream, false};
  stats_.allocated.add(rounded);
  stats_.active.add(rounded);
  stats_.requested.add(size);
  return true;
}

bool AsyncPoolAllocator::best_single_fit(StreamId stream, Bytes size, DeviceAddr& at, std::uint32_t& slot) const {
  bool found = false;
  Bytes best_size = 0;
  for (const StreamId owner : {stream, kAnyStream}) {
    const FreeIndex::Cursor c = sizes_.lower_bound(owner, size);
    if (!c.valid) continue;
    const FreeIndex::Entry& e = sizes_.at(c);
    if (!found || std::tie(e.size, e.addr) < std::tie(best_size, at)) {
      found = true;
      best_size = e.size;
      at = e.addr;
      slot = e.block;
    }
  }
  return found;
}

// The smallest run of adjacent free ranges accepted by `usable_range` that holds `size`
// (lowest address on ties); the allocation goes at the start of the run.
template <class Pred>
bool AsyncPoolAllocator::best_run(Pred usable_range, Bytes size, DeviceAddr& at) const {
  bool found = false;
  Bytes best_total = 0;
  bool in_run = false;
  DeviceAddr run_start = 0;
  Bytes run_total = 0;
  auto close_run = [&] {
    if (in_run && run_total >= size && (!found || run_total < best_total)) {
      found = true;
      best_total = run_total;
      at = run_start;
    }
    in_run = false;
  };
  // A run is made of free ranges, so none can hold more than every free byte.
  if (sizes_.total_bytes() < size) return false;
  DeviceAddr run_end = 0;
  for (const auto& [end, r] : open_) {
    const DeviceAddr addr = r.start;
    if (r.kind == Kind::free && usable_range(r)) {
      if (in_run && addr != run_end) close_run();  // a tensor lies between: the run ended there
      run_end = addr + r.size;
      if (!in_run) {
        in_run = true;
        run_start = addr;
        run_total = 0;
      }
      run_total += r.size;
    } else {
      close_run();
    }
  }
  close_run();
  return found;
}

// Maps new chunks at the lowest address where usable free memory plus unmapped address space
// holds the request: usually the end of the pool, extending its free tail, so reserved grows in
// whole chunks ahead of allocated (the origin thread's 32 MiB steps).
bool AsyncPoolAllocator::grow(StreamId stream, Bytes size, DeviceAddr& at) {
  const Bytes g = options_.pool_granularity;
  bool in_run = false;
  DeviceAddr start = 0;
  Bytes run_total = 0;
  bool found = false;
  DeviceAddr end = 0;
  for (const auto& [range_end, r] : open_) {
    const DeviceAddr addr = r.start;
    const bool open = r.kind == Kind::unmapped || (r.kind == Kind::free && usable(r, stream));
    if (!open) {
      in_run = false;
      continue;
    }
    if (!in_run || addr != end) {  // a tensor lies between: a new run
      in_run = true;
      start = addr;
      run_total = 0;
    }
    run_total += r.size;
    end = range_end;
    if (run_total >= size) {
      found = true;
      break;
    }
  }
  if (!found) return false;

  // The unmapped pieces inside [start, start + size), each rounded up to whole chunks.
  std::vector<std::pair<DeviceAddr, Bytes>> pieces;
  Bytes covered = 0;
  Bytes to_map = 0;
  for (auto it = starting_at(start); covered < size; ++it) {
    const Range& r = it->second;
    if (r.kind == Kind::free) {
      covered += r.size;
      continue;
    }
    const Bytes bytes = round_up(std::min(r.size, size - covered), g);
    pieces.emplace_back(r.start, bytes);
    to_map += bytes;
    covered += bytes;
  }
  if (!device_.map(to_map)) {
    failed_pieces_ = std::move(pieces);  // kept by keep_failed_growth if the request fails
    return false;
  }
  map_pieces(pieces, to_map);
  stats_.reserved.add(to_map);
  ++stats_.num_device_alloc;
  at = start;
  return true;
}

// A request failed after a growth the device could not back. The driver still maps the chunks it
// can of that growth, in order, and the pool keeps them after the call fails (measured on an
// H200: a request 2 GiB beyond free memory left the pool holding all but 33 MiB of what was free,
// until cudaMemPoolTrimTo; reports/gpu/h200-2026-12-04-sequences.json, oom_probe). UNVERIFIED
// details: the model keeps every whole chunk that fits, where the H200 kept one chunk fewer in
// that probe and every chunk in an agreement case (gpu-check agreement, sep2026/async); and it
// keeps them only when the request fails, not when frees pending on other streams serve it once
// the growth failed (ReuseAllowInternalDependencies), which no recording covers.
void AsyncPoolAllocator::keep_failed_growth(StreamId stream) {
  if (failed_pieces_.empty()) return;
  const Bytes fits = device_.free() / options_.pool_granularity * options_.pool_granularity;
  if (fits == 0 || !device_.map(fits)) return;
  if (retained_ == 0) {  // what the request met (a retry's first attempt already said it)
    largest_before_ = largest_free_range();
    usable_before_ = largest_usable_range(stream);
  }
  const Bytes kept = map_pieces(failed_pieces_, fits);
  if (kept < fits) device_.unmap(fits - kept);  // the growth needed less than fits
  retained_ += kept;
  stats_.reserved.add(kept);
  ++stats_.num_device_alloc;
}

// Turns the first `budget` bytes of the unmapped pieces (whole chunks, in address order) into
// fresh free memory any stream may use; the caller has charged the device. Returns the bytes.
Bytes AsyncPoolAllocator::map_pieces(const std::vector<std::pair<DeviceAddr, Bytes>>& pieces, Bytes budget) {
  Bytes mapped = 0;
  for (const auto& [addr, piece] : pieces) {
    const Bytes bytes = std::min(piece, budget - mapped);
    if (bytes == 0) break;
    const auto it = starting_at(addr);  // an unmapped range starts exactly here
    if (bytes < it->second.size) {
      resize_front(it, addr + bytes);
    } else {
      erase_range(it);
    }
    Range fresh;  // new pool memory: any stream may use it
    fresh.start = addr;
    fresh.size = bytes;
    fresh.kind = Kind::free;
    fresh.owner = kAnyStream;
    place(fresh);
    mapped += bytes;
  }
  return mapped;
}

void AsyncPoolAllocator::take_with_internal_dependency(StreamId stream, DeviceAddr at, Bytes size) {
  for (auto it = starting_at(at); it != open_.end() && it->second.start < at + size; ++it) {
    const StreamId owner = it->second.owner;
    if (owner != kAnyStream && owner != kUnifierStream && owner != stream) order_after(stream, owner);
  }
}

// Gives [at, at + size) of free ranges to a tensor: `it` is the range at `at`, where a run of
// adjacent free ranges starts (every placement is at one), and the rest of the last range stays
// free with its owner.
void AsyncPoolAllocator::carve(Open::iterator it, DeviceAddr at, Bytes size) {
  Bytes left = size;
  while (left > 0) {
    if (it == open_.end() || it->second.kind != Kind::free) {
      throw InfraError(fmt::format("async pool: placement at {:#x} (+{}) is not on free memory", at, size));
    }
    const Bytes take = std::min(left, it->second.size);
    if (take < it->second.size) {
      resize_front(it, it->second.start + take);
    } else {
      it = erase_range(it);
    }
    left -= take;
  }
}

// ---- free, streams, synchronize ----------------------------------------------------------------

void AsyncPoolAllocator::free(BlockKey key) {
  if (key >= keys_.size() || !keys_[key].live) {
    throw InfraError(fmt::format("async pool: free of unknown block {}", key));
  }
  Live& l = keys_[key];
  l.live = false;
  last_placed_size_ = 0;
  if (l.zero) return;
  stats_.allocated.sub(l.size);
  stats_.active.sub(l.size);
  stats_.requested.sub(l.requested);

  Range fr;
  fr.start = l.addr;
  fr.size = l.size;
  fr.kind = Kind::free;
  if (l.recorded) {
    // PyTorch frees a block used on several streams on its "unifier" stream, which waits for
    // all of them: other streams get it only by chance, after a sync, or via internal deps.
    fr.owner = kUnifierStream;
  } else {
    fr.owner = l.stream;  // cudaFreeAsync on the allocation stream
    fr.free_tick = ++ticks_[l.stream];
  }
  fr.opportunistic = options_.reuse_allow_opportunistic && coin();
  place(fr);
}

void AsyncPoolAllocator::record_stream(BlockKey key, StreamId stream) {
  if (key >= keys_.size() || !keys_[key].live) {
    throw InfraError(fmt::format("async pool: record_stream of unknown block {}", key));
  }
  ensure_stream(stream);
  if (stream != keys_[key].stream) keys_[key].recorded = true;
}

void AsyncPoolAllocator::stream_wait(StreamId waiter, StreamId target) {
  ensure_stream(waiter);
  ensure_stream(target);
  order_after(waiter, target);
}

void AsyncPoolAllocator::synchronize() {
  // The host has seen every free complete: all free memory is reusable by every stream. Only
  // the free ranges of a stream (or the unifier) change: each becomes everyone's and merges with
  // its free neighbours, in address order. Synchronized ranges are merged already.
  if (sizes_.count(kAnyStream) != sizes_.size()) {
    std::vector<DeviceAddr> owned;
    owned.reserve(sizes_.size() - sizes_.count(kAnyStream));
    sizes_.for_each_except(kAnyStream, [&](const FreeIndex::Entry& e) { owned.push_back(e.addr); });
    std::sort(owned.begin(), owned.end());
    for (const DeviceAddr addr : owned) {
      const auto it = open_.upper_bound(addr);  // the range holding addr (it may have merged down)
      if (it->second.owner != kAnyStream) set_owner(it, kAnyStream, 0, false);
      coalesce(it);
    }
  }
  // cudaMemPoolAttrReleaseThreshold: above it, the sync gives free chunks back.
  if (stats_.reserved.current > options_.release_threshold) trim_to(options_.release_threshold);
}

// torch.cuda.empty_cache() with this backend: cudaDeviceSynchronize + cudaMemPoolTrimTo(0).
void AsyncPoolAllocator::empty_cache() {
  synchronize();
  trim_to(0);
}

// Releases whole free chunks, highest address first (UNVERIFIED order), until reserved <= keep.
// Chunks holding any part of a live allocation are never released.
void AsyncPoolAllocator::trim_to(Bytes keep) {
  const Bytes g = options_.pool_granularity;
  auto it = open_.end();
  while (stats_.reserved.current > keep && it != open_.begin()) {
    --it;
    const Range r = it->second;
    if (r.kind != Kind::free || r.owner != kAnyStream) continue;
    const DeviceAddr a = r.start;
    const Bytes lo = round_up(a - base_, g);
    const Bytes hi = (r.end() - base_) / g * g;
    if (hi <= lo) continue;
    const Bytes release = std::min(hi - lo, ceil_div(stats_.reserved.current - keep, g) * g);
    const DeviceAddr cut = base_ + hi - release;
    erase_range(it);
    Range piece = r;
    if (cut > a) {
      piece.size = cut - a;
      insert_range(piece);
    }
    if (r.end() > base_ + hi) {
      piece.start = base_ + hi;
      piece.size = r.end() - piece.start;
      insert_range(piece);
    }
    Range hole;
    hole.start = cut;
    hole.size = release;
    hole.kind = Kind::unmapped;
    place(hole);
    device_.unmap(release);
    stats_.reserved.sub(release);
    ++stats_.num_device_free;
    it = open_.upper_bound(a);  // what now holds `a`: the front piece, or the hole merged down
  }
}

// ---- Stats and introspection ------------------------------------------------------------------

Bytes AsyncPoolAllocator::largest_usable_range(StreamId stream) const {
  Bytes largest = 0;
  for (const auto& [end, r] : open_) {
    if (r.kind == Kind::free && usable(r, stream)) largest = std::max(largest, r.size);
  }
  return largest;
}

Bytes AsyncPoolAllocator::largest_free_range() const {
  Bytes largest = 0;
  sizes_.for_each([&](const FreeIndex::Entry& e) { largest = std::max(largest, e.size); });
  return largest;
}

void AsyncPoolAllocator::record_oom(Bytes size, Bytes rounded, StreamId stream, bool fraction) {
  ++stats_.num_ooms;
  OomInfo info;
  info.request = size;
  info.device_free = device_.free() + retained_;  // what the request met
  info.reserved = stats_.reserved.current - retained_;
  info.allocated = stats_.allocated.current;
  info.retained = retained_;
  if (fraction) {
    info.detail = fmt::format(
        "async: per_process_memory_fraction: requested {} + {} > limit {}; PyTorch raises before calling CUDA",
        format_mib(stats_.requested.current), format_mib(size), format_mib(*limit_));
  } else {
    const Bytes usable_largest = largest_usable_range(stream);
    info.detail = fmt::format(
        "async: cudaMallocAsync({}) on stream {} failed: pool reserved {}, used {} (reserved - used = {}), "
        "largest free range {} ({} usable by this stream), device free {}; PyTorch raises at once (no "
        "sync, trim or retry)",
        format_mib(rounded), stream, format_mib(info.reserved), format_mib(stats_.allocated.current),
        format_mib(info.reserved - stats_.allocated.current), format_mib(retained_ == 0 ? largest_free_range() : largest_before_),
        format_mib(retained_ == 0 ? usable_largest : usable_before_), format_mib(device_.free() + retained_));
    if (retained_ > 0) {
      info.detail += fmt::format("; trying, the pool grew by {} it could not use, and keeps it until trimmed", format_mib(retained_));
    }
  }
  last_oom_ = std::move(info);
}

void AsyncPoolAllocator::reset_peak_stats() {
  // reset_peak_memory_stats writes 0 to UsedMemHigh / ReservedMemHigh: the peak becomes current.
  stats_.reset_peaks();
}

std::optional<DeviceAddr> AsyncPoolAllocator::address(BlockKey key) const {
  if (key >= keys_.size() || !keys_[key].live || keys_[key].zero) return std::nullopt;
  return keys_[key].addr;
}

void AsyncPoolAllocator::live_blocks(std::vector<BlockView>& out) const {
  for (BlockKey k = 0; k < keys_.size(); ++k) {
    const Live& l = keys_[k];
    if (l.live && !l.zero) out.push_back(BlockView{k, l.addr, l.size, l.requested, l.stream});
  }
}

}  // namespace vf::sim

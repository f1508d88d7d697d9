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
  all.size = arena;
  all.kind = Kind::unmapped;
  insert_range(base_, all);
}

// ---- Range bookkeeping -----------------------------------------------------------------------

AsyncPoolAllocator::Arena::iterator AsyncPoolAllocator::insert_range(DeviceAddr addr, const Range& r) {
  auto it = arena_nodes_.insert(arena_, Arena::value_type{addr, r});
  if (r.kind == Kind::free) sizes_.insert(r.owner, r.size, addr, 0);
  if (r.kind != Kind::used) open_.insert(addr);
  return it;
}

AsyncPoolAllocator::Arena::iterator AsyncPoolAllocator::erase_range(Arena::iterator it) {
  if (it->second.kind == Kind::free) sizes_.erase(it->second.owner, it->second.size, it->first);
  if (it->second.kind != Kind::used) open_.erase(it->first);
  auto next = std::next(it);
  arena_nodes_.erase(arena_, it);
  return next;
}

void AsyncPoolAllocator::set_owner(Arena::iterator it, StreamId owner, std::uint64_t tick, bool opportunistic) {
  Range& r = it->second;
  sizes_.erase(r.owner, r.size, it->first);
  r.owner = owner;
  r.free_tick = tick;
  r.opportunistic = opportunistic;
  sizes_.insert(owner, r.size, it->first, 0);
}

// Merges a range with its neighbours when they are of one class: unmapped with unmapped, free
// with free of the same owner. UNVERIFIED modelling choice: free memory of different owners
// stays apart (each keeps its own reuse rule); merged frees of one owner keep the later free
// tick and are opportunistic only if both were.
AsyncPoolAllocator::Arena::iterator AsyncPoolAllocator::coalesce(Arena::iterator it) {
  auto mergeable = [](const Range& a, const Range& b) {
    if (a.kind != b.kind || a.kind == Kind::used) return false;
    return a.kind == Kind::unmapped || a.owner == b.owner;
  };
  if (it != arena_.begin()) {
    const auto prev = std::prev(it);
    if (mergeable(prev->second, it->second)) {
      absorb_next(prev);
      it = prev;
    }
  }
  const auto next = std::next(it);
  if (next != arena_.end() && mergeable(it->second, next->second)) absorb_next(it);
  return it;
}

// Grows a range by the range right after it, which is erased.
void AsyncPoolAllocator::absorb_next(Arena::iterator dst) {
  const auto src = std::next(dst);
  Range& d = dst->second;
  const Range& s = src->second;
  if (d.kind == Kind::free) sizes_.erase(d.owner, d.size, dst->first);
  d.size += s.size;
  d.free_tick = std::max(d.free_tick, s.free_tick);
  d.opportunistic = d.opportunistic && s.opportunistic;
  erase_range(src);
  if (d.kind == Kind::free) sizes_.insert(d.owner, d.size, dst->first, 0);
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
Bytes AsyncPoolAllocator::held_for_other_streams(StreamId stream) const {
  // A stream the pool has not seen yet is ordered after nothing: only synchronized frees and
  // those the coin completed are its to take.
  const bool seen = stream < seen_.size();
  Bytes held = 0;
  for (const DeviceAddr addr : open_) {
    const Range& r = arena_.find(addr)->second;
    if (r.kind != Kind::free) continue;
    const bool ok = seen ? usable(r, stream) : r.owner == kAnyStream || (options_.reuse_allow_opportunistic && r.opportunistic);
    if (!ok) held += r.size;
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
  // Reuse what this stream may reuse (best fit on one free range of its own or synchronized
  // memory, else the best run of adjacent usable free ranges, other streams' frees included
  // where an event edge or the coin allows), else grow the pool.
  bool found = best_single_fit(stream, rounded, at) ||
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
    record_oom(size, rounded, stream, false);
    return false;
  }
  carve(at, rounded, key);
  keys_[key] = Live{true, false, at, rounded, size, stream, false};
  stats_.allocated.add(rounded);
  stats_.active.add(rounded);
  stats_.requested.add(size);
  return true;
}

bool AsyncPoolAllocator::best_single_fit(StreamId stream, Bytes size, DeviceAddr& at) const {
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
  DeviceAddr run_end = 0;
  for (const DeviceAddr addr : open_) {
    const Range& r = arena_.find(addr)->second;
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
  for (const DeviceAddr addr : open_) {
    const Range& r = arena_.find(addr)->second;
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
    end = addr + r.size;
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
  for (auto it = arena_.find(start); covered < size; ++it) {
    const Range& r = it->second;
    if (r.kind == Kind::free) {
      covered += r.size;
      continue;
    }
    const Bytes bytes = round_up(std::min(r.size, size - covered), g);
    pieces.emplace_back(it->first, bytes);
    to_map += bytes;
    covered += bytes;
  }
  if (!device_.map(to_map)) return false;  // all chunks or none

  for (const auto& [addr, bytes] : pieces) {
    auto it = arena_.find(addr);  // an unmapped range starts exactly here
    Range rest = it->second;
    erase_range(it);
    if (bytes < rest.size) {
      rest.size -= bytes;
      insert_range(addr + bytes, rest);
    }
    Range fresh;  // new pool memory: any stream may use it
    fresh.size = bytes;
    fresh.kind = Kind::free;
    fresh.owner = kAnyStream;
    coalesce(insert_range(addr, fresh));
  }
  stats_.reserved.add(to_map);
  ++stats_.num_device_alloc;
  at = start;
  return true;
}

void AsyncPoolAllocator::take_with_internal_dependency(StreamId stream, DeviceAddr at, Bytes size) {
  for (auto it = std::prev(arena_.upper_bound(at)); it != arena_.end() && it->first < at + size; ++it) {
    const StreamId owner = it->second.owner;
    if (owner != kAnyStream && owner != kUnifierStream && owner != stream) order_after(stream, owner);
  }
}

// Turns [at, at + size) of free ranges into one used range; the rest of the last free range
// stays free with its owner.
void AsyncPoolAllocator::carve(DeviceAddr at, Bytes size, BlockKey key) {
  auto it = std::prev(arena_.upper_bound(at));
  if (it->first < at) {  // start inside a free range: split off its front
    const DeviceAddr front_addr = it->first;
    Range front = it->second;
    Range back = it->second;
    front.size = at - front_addr;
    back.size -= front.size;
    erase_range(it);
    insert_range(front_addr, front);
    it = insert_range(at, back);
  }
  Bytes left = size;
  while (left > 0) {
    const DeviceAddr addr = it->first;
    Range r = it->second;
    it = erase_range(it);
    const Bytes take = std::min(left, r.size);
    if (r.size > take) {
      r.size -= take;
      insert_range(addr + take, r);
    }
    left -= take;
  }
  Range used;
  used.size = size;
  used.kind = Kind::used;
  used.key = key;
  insert_range(at, used);
}

// ---- free, streams, synchronize ----------------------------------------------------------------

void AsyncPoolAllocator::free(BlockKey key) {
  if (key >= keys_.size() || !keys_[key].live) {
    throw InfraError(fmt::format("async pool: free of unknown block {}", key));
  }
  Live& l = keys_[key];
  l.live = false;
  if (l.zero) return;
  stats_.allocated.sub(l.size);
  stats_.active.sub(l.size);
  stats_.requested.sub(l.requested);

  Range fr;
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
  erase_range(arena_.find(l.addr));
  coalesce(insert_range(l.addr, fr));
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
  // The host has seen every free complete: all free memory is reusable by every stream.
  // Only free and unmapped ranges change (open_): a tensor's range neither changes owner nor merges.
  const std::vector<DeviceAddr> open(open_.begin(), open_.end());
  for (const DeviceAddr addr : open) {
    const auto it = arena_.find(addr);
    if (it->second.kind == Kind::free && it->second.owner != kAnyStream) set_owner(it, kAnyStream, 0, false);
  }
  for (const DeviceAddr addr : open) {
    if (const auto it = arena_.find(addr); it != arena_.end()) coalesce(it);  // absent: merged into the one before
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
  if (stats_.reserved.current <= keep) return;
  const Bytes g = options_.pool_granularity;
  std::vector<DeviceAddr> frees;
  for (const auto& [addr, r] : arena_) {
    if (r.kind == Kind::free && r.owner == kAnyStream) frees.push_back(addr);
  }
  for (auto f = frees.rbegin(); f != frees.rend() && stats_.reserved.current > keep; ++f) {
    auto it = arena_.find(*f);
    const DeviceAddr a = it->first;
    const Range r = it->second;
    const Bytes lo = round_up(a - base_, g);
    const Bytes hi = (a + r.size - base_) / g * g;
    if (hi <= lo) continue;
    const Bytes release = std::min(hi - lo, ceil_div(stats_.reserved.current - keep, g) * g);
    const DeviceAddr cut = base_ + hi - release;
    const DeviceAddr end = a + r.size;
    erase_range(it);
    Range piece = r;
    if (cut > a) {
      piece.size = cut - a;
      insert_range(a, piece);
    }
    if (end > base_ + hi) {
      piece.size = end - (base_ + hi);
      insert_range(base_ + hi, piece);
    }
    Range hole;
    hole.size = release;
    hole.kind = Kind::unmapped;
    coalesce(insert_range(cut, hole));
    device_.unmap(release);
    stats_.reserved.sub(release);
    ++stats_.num_device_free;
  }
}

// ---- Stats and introspection ------------------------------------------------------------------

Bytes AsyncPoolAllocator::largest_free_range() const {
  Bytes largest = 0;
  sizes_.for_each([&](const FreeIndex::Entry& e) { largest = std::max(largest, e.size); });
  return largest;
}

void AsyncPoolAllocator::record_oom(Bytes size, Bytes rounded, StreamId stream, bool fraction) {
  ++stats_.num_ooms;
  OomInfo info;
  info.request = size;
  info.device_free = device_.free();
  info.reserved = stats_.reserved.current;
  info.allocated = stats_.allocated.current;
  if (fraction) {
    info.detail = fmt::format(
        "async: per_process_memory_fraction: requested {} + {} > limit {}; PyTorch raises before calling CUDA",
        format_mib(stats_.requested.current), format_mib(size), format_mib(*limit_));
  } else {
    Bytes usable_largest = 0;
    for (const auto& [addr, r] : arena_) {
      if (r.kind == Kind::free && usable(r, stream)) usable_largest = std::max(usable_largest, r.size);
    }
    info.detail = fmt::format(
        "async: cudaMallocAsync({}) on stream {} failed: pool reserved {}, used {} (reserved - used = {}), "
        "largest free range {} ({} usable by this stream), device free {}; PyTorch raises at once (no "
        "sync, trim or retry)",
        format_mib(rounded), stream, format_mib(stats_.reserved.current), format_mib(stats_.allocated.current),
        format_mib(stats_.reserved.current - stats_.allocated.current), format_mib(largest_free_range()),
        format_mib(usable_largest), format_mib(device_.free()));
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

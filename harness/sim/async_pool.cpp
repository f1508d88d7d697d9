// The cudaMallocAsync pool model. Rules: cuda-allocators.md §2, §3.1, §7.5; modelling choices
// the sources leave open are marked UNVERIFIED here and in docs/allocators.md.
#include "harness/sim/async_pool.h"

#include <algorithm>
#include <iterator>
#include <tuple>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/core/scalar_load.h"

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
  Node all;
  all.start = base_;
  all.size = arena;
  all.kind = Kind::unmapped;
  index(link_new(all, kNil));
}

// ---- Range bookkeeping -----------------------------------------------------------------------

// A new range, linked after `after` (kNil: at the arena's start) and not yet indexed.
inline std::uint32_t AsyncPoolAllocator::link_new(const Node& proto, std::uint32_t after) {
  std::uint32_t n = 0;
  if (!spare_nodes_.empty()) {
    n = spare_nodes_.back();
    spare_nodes_.pop_back();
    nodes_[n] = proto;
  } else {
    n = static_cast<std::uint32_t>(nodes_.size());
    nodes_.push_back(proto);
  }
  Node& r = nodes_[n];
  r.prev = after;
  if (after == kNil) {
    r.next = head_;
    head_ = n;
  } else {
    r.next = nodes_[after].next;
    nodes_[after].next = n;
  }
  if (r.next != kNil) nodes_[r.next].prev = n;
  return n;
}

// Takes an indexed range out of its index and the list.
inline void AsyncPoolAllocator::unlink(std::uint32_t n) {
  unindex(n);
  const Node& r = nodes_[n];
  if (r.prev != kNil) {
    nodes_[r.prev].next = r.next;
  } else {
    head_ = r.next;
  }
  if (r.next != kNil) nodes_[r.next].prev = r.prev;
  spare_nodes_.push_back(n);
}

inline void AsyncPoolAllocator::index(std::uint32_t n) {
  const Node& r = nodes_[n];
  if (r.kind == Kind::free) {
    sizes_.insert(r.owner, r.size, r.start, n);
  } else if (r.kind == Kind::unmapped) {
    unmapped_.emplace(r.start, n);
  }
}

inline void AsyncPoolAllocator::unindex(std::uint32_t n) {
  const Node& r = nodes_[n];
  if (r.kind == Kind::free) {
    sizes_.erase(r.owner, r.size, r.start);
  } else if (r.kind == Kind::unmapped) {
    unmapped_.erase(r.start);
  }
}

// Gives an indexed range new bounds, in its index too.
inline void AsyncPoolAllocator::resize(std::uint32_t n, DeviceAddr start, Bytes size) {
  Node& r = nodes_[n];
  if (r.kind == Kind::free) {
    sizes_.replace(r.owner, r.size, r.start, size, start);
  } else if (r.kind == Kind::unmapped && start != r.start) {
    unmapped_.erase(r.start);
    unmapped_.emplace(start, n);
  }
  r.start = start;
  r.size = size;
}

// Indexes the open range `n` (linked, not indexed), merged with its neighbours when they are of
// one class: unmapped with unmapped, free with free of the same owner. UNVERIFIED modelling
// choice: free memory of different owners stays apart (each keeps its own reuse rule); merged
// frees of one owner keep the later free tick and are opportunistic only if all were. Returns the
// range that holds n's bytes now.
inline std::uint32_t AsyncPoolAllocator::place(std::uint32_t n) {
  // n's fields one by one, not a copy of the node: free() has just stored its tick and owner
  // one by one, and a copy read them with a 16-byte load that cannot be forwarded from those
  // stores (core/scalar_load.h; a sixth of a free's time in the allocator benchmark).
  const Node& node = nodes_[n];
  const std::uint64_t tick = scalar_load(node.free_tick);
  const StreamId owner = scalar_load(node.owner);
  const Kind kind = node.kind;
  const bool opportunistic = node.opportunistic;
  const DeviceAddr start = node.start;
  const Bytes size_n = node.size;
  const std::uint32_t prev = node.prev, next = node.next;
  // Neighbours of one class merge: both unmapped, or both free with the same owner.
  auto one_class = [&](const Node& o) { return o.kind == kind && (kind == Kind::unmapped || o.owner == owner); };
  const std::uint32_t lo = prev != kNil && one_class(nodes_[prev]) ? prev : kNil;
  const std::uint32_t hi = next != kNil && one_class(nodes_[next]) ? next : kNil;
  auto absorb = [](Node& into, std::uint64_t from_tick, bool from_opportunistic) {
    into.free_tick = std::max(into.free_tick, from_tick);
    into.opportunistic = into.opportunistic && from_opportunistic;
  };
  if (lo == kNil && hi == kNil) {
    index(n);
    return n;
  }
  // n leaves the list (it is not indexed: unlink's unindex must not look for it)
  nodes_[n].kind = Kind::tensor;
  unlink(n);
  if (lo == kNil) {  // the range above grows down over n
    resize(hi, start, size_n + nodes_[hi].size);
    absorb(nodes_[hi], tick, opportunistic);
    return hi;
  }
  Bytes size = nodes_[lo].size + size_n;
  absorb(nodes_[lo], tick, opportunistic);
  if (hi != kNil) {
    size += nodes_[hi].size;
    absorb(nodes_[lo], nodes_[hi].free_tick, nodes_[hi].opportunistic);
    unlink(hi);
  }
  resize(lo, nodes_[lo].start, size);
  return lo;
}

// A stream's first use. Only this grows ticks_, and never past kMaxAsyncStreams entries, so an id
// that passes ensure_stream's inline compare is in range.
void AsyncPoolAllocator::add_stream(StreamId s) {
  if (s >= kMaxAsyncStreams) {
    throw InfraError(fmt::format("async pool: stream id {} is out of range (0..{})", s, kMaxAsyncStreams - 1));
  }
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

bool AsyncPoolAllocator::usable(const Node& r, StreamId stream) const {
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
  // through the free index, so a traced run pays for the frees since the last sync, not the pool.
  const bool seen = stream < seen_.size();
  std::vector<std::uint32_t> withheld;  // the ranges `stream` may not take
  Bytes held = 0;
  sizes_.for_each_except(kAnyStream, [&](const FreeIndex::Entry& e) {
    const Node& r = nodes_[e.block];
    const bool ok = seen ? usable(r, stream) : options_.reuse_allow_opportunistic && r.opportunistic;
    if (ok) return;
    held += r.size;
    if (request > 0) withheld.push_back(e.block);
  });
  if (request == 0 || held == 0) return held;
  // With a request: only the withheld ranges in a run long enough for it, where the pool would
  // have placed it had every free been this stream's: adjacent free memory (whoever owns it) and
  // unmapped address space (grow() maps chunks into a run), across the block the last malloc
  // placed (held right after it is asked about the memory before it). Each run is walked once:
  // the withheld ranges are visited in address order.
  const Bytes rounded = request >= kMaxAsyncRequest ? request : round_up(request, kAsyncAlign);
  // The open range joined to `from` on one side (prev or next), directly or across the block
  // the last malloc placed (whose bytes go to `bridge`), or kNil.
  auto joined = [&](std::uint32_t from, bool down, Bytes& bridge) -> std::uint32_t {
    bridge = 0;
    const std::uint32_t n = down ? nodes_[from].prev : nodes_[from].next;
    if (n == kNil) return kNil;
    const Node& r = nodes_[n];
    if (r.open()) return n;
    if (last_placed_size_ == 0 || r.start != last_placed_ || r.size != last_placed_size_) return kNil;
    const std::uint32_t beyond = down ? r.prev : r.next;
    if (beyond == kNil || !nodes_[beyond].open()) return kNil;
    bridge = r.size;
    return beyond;
  };
  std::sort(withheld.begin(), withheld.end(), [&](std::uint32_t a, std::uint32_t b) { return nodes_[a].start < nodes_[b].start; });
  held = 0;
  DeviceAddr run_end = 0;  // the end of the last run walked
  bool run_fits = false;
  for (const std::uint32_t n : withheld) {
    if (nodes_[n].start >= run_end) {
      Bytes total = nodes_[n].size;
      Bytes bridge = 0;
      for (std::uint32_t lo = joined(n, true, bridge); lo != kNil; lo = joined(lo, true, bridge)) {
        total += nodes_[lo].size + bridge;
      }
      std::uint32_t hi = n;
      for (std::uint32_t up = joined(hi, false, bridge); up != kNil; up = joined(hi, false, bridge)) {
        total += nodes_[up].size + bridge;
        hi = up;
      }
      run_end = nodes_[hi].end();
      run_fits = total >= rounded;
    }
    if (run_fits) held += nodes_[n].size;
  }
  return held;
}

// ---- malloc ----------------------------------------------------------------------------------

bool AsyncPoolAllocator::malloc(BlockKey key, Bytes size, StreamId stream) {
  if (key < keys_.size() && keys_[key].live) {
    throw InfraError(fmt::format("async pool: block {} allocated twice", key));
  }
  cover_key(keys_, key);
  ensure_stream(stream);
  last_placed_size_ = 0;  // held_for_other_streams bridges only the block this malloc places
  // A retry right after a failed request (aimdo's hook evicts and calls again within one op)
  // keeps counting from what the first attempt met; any other request starts afresh.
  if (!last_failed_) retained_ = 0;
  last_failed_ = false;
  failed_pieces_.clear();
  if (size == 0) {  // PyTorch does not call cudaMallocAsync for an empty tensor
    keys_[key] = Live{0, kNil, stream, true, true, false};
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
  std::uint32_t at = kNil;  // the free range the block goes at the start of
  FreeIndex::Cursor fit;    // its entry, when one range holds the block
  Bytes fit_size = 0;       // and that entry's size and address
  DeviceAddr fit_addr = 0;
  // Reuse what this stream may reuse (best fit on one free range of its own or synchronized
  // memory, else the best run of adjacent usable free ranges, other streams' frees included
  // where an event edge or the coin allows), else grow the pool.
  bool found = best_single_fit(stream, rounded, at, fit, fit_size, fit_addr) ||
               best_run([&](const Node& r) { return usable(r, stream); }, rounded, at) ||
               grow(stream, rounded, at);
  // ReuseAllowInternalDependencies: only once the pool could not grow, take frees still
  // pending on other streams and let the driver insert the wait.
  if (!found && options_.reuse_allow_internal_dependencies &&
      best_run([](const Node&) { return true; }, rounded, at)) {
    take_with_internal_dependency(stream, at, rounded);
    found = true;
  }
  // The failed growth's pieces name unmapped ranges of this moment only: used here, then dropped.
  if (!found) {  // PyTorch raises at once: no synchronize, trim or retry
    keep_failed_growth(stream);
    failed_pieces_.clear();
    record_oom(size, rounded, stream, false);
    last_failed_ = true;
    return false;
  }
  failed_pieces_.clear();
  // Where the block goes: the fit's entry has it (one dependent load fewer than its node).
  const DeviceAddr addr = fit.valid ? fit_addr : nodes_[at].start;
  const std::uint32_t node = carve(at, addr, rounded, fit, fit_size);
  last_placed_ = addr;
  last_placed_size_ = rounded;
  keys_[key] = Live{size, node, stream, true, false, false};
  stats_.allocated.add(rounded);
  stats_.active.add(rounded);
  stats_.requested.add(size);
  return true;
}

inline bool AsyncPoolAllocator::best_single_fit(StreamId stream, Bytes size, std::uint32_t& at, FreeIndex::Cursor& fit,
                                                Bytes& best_size, DeviceAddr& best_addr) const {
  bool found = false;
  for (const StreamId owner : {stream, kAnyStream}) {
    const FreeIndex::Cursor c = sizes_.lower_bound(owner, size);
    if (!c.valid) continue;
    const FreeIndex::Entry& e = sizes_.at(c);
    if (!found || std::tie(e.size, e.addr) < std::tie(best_size, best_addr)) {
      found = true;
      best_size = e.size;
      best_addr = e.addr;
      at = e.block;
      fit = c;
    }
  }
  return found;
}

// The smallest run of adjacent free ranges accepted by `usable_range` that holds `size`
// (lowest address on ties); the allocation goes at the start of the run (`at`, its first range).
// Runs are found from the free index, not by walking the tensors: each accepted range with no
// accepted range below it starts one.
template <class Pred>
bool AsyncPoolAllocator::best_run(Pred usable_range, Bytes size, std::uint32_t& at) const {
  // A run is made of free ranges, so none can hold more than every free byte.
  if (sizes_.total_bytes() < size) return false;
  auto accepted = [&](std::uint32_t n) { return n != kNil && nodes_[n].kind == Kind::free && usable_range(nodes_[n]); };
  bool found = false;
  Bytes best_total = 0;
  DeviceAddr best_start = 0;
  sizes_.for_each([&](const FreeIndex::Entry& e) {
    const std::uint32_t first = e.block;
    if (!usable_range(nodes_[first]) || accepted(nodes_[first].prev)) return;
    Bytes total = 0;
    for (std::uint32_t n = first; accepted(n); n = nodes_[n].next) total += nodes_[n].size;
    if (total < size) return;
    if (!found || total < best_total || (total == best_total && e.addr < best_start)) {
      found = true;
      best_total = total;
      best_start = e.addr;
      at = first;
    }
  });
  return found;
}

// Maps new chunks at the lowest address where usable free memory plus unmapped address space
// holds the request: usually the end of the pool, extending its free tail, so reserved grows in
// whole chunks ahead of allocated (the origin thread's 32 MiB steps). Called once best_run has
// found no run of usable free ranges that holds the request, so the run it takes holds unmapped
// space: only the runs around unmapped ranges are walked, in address order.
bool AsyncPoolAllocator::grow(StreamId stream, Bytes size, std::uint32_t& at) {
  const Bytes g = options_.pool_granularity;
  auto open_for = [&](std::uint32_t n) {
    const Node& r = nodes_[n];
    return r.kind == Kind::unmapped || (r.kind == Kind::free && usable(r, stream));
  };
  bool found = false;
  std::uint32_t start = kNil;
  DeviceAddr walked_to = 0;  // the end of the last run walked
  for (const auto& [ustart, u] : unmapped_) {
    if (ustart < walked_to) continue;  // inside the run walked last
    Bytes total = nodes_[u].size;
    std::uint32_t lo = u;
    while (nodes_[lo].prev != kNil && open_for(nodes_[lo].prev)) {
      lo = nodes_[lo].prev;
      total += nodes_[lo].size;
    }
    std::uint32_t hi = u;
    while (nodes_[hi].next != kNil && open_for(nodes_[hi].next)) {
      hi = nodes_[hi].next;
      total += nodes_[hi].size;
    }
    walked_to = nodes_[hi].end();
    if (total >= size) {
      found = true;
      start = lo;
      break;
    }
  }
  if (!found) return false;

  // The unmapped pieces inside [start, start + size), each rounded up to whole chunks.
  std::vector<std::pair<std::uint32_t, Bytes>> pieces;
  Bytes covered = 0;
  Bytes to_map = 0;
  for (std::uint32_t n = start; covered < size; n = nodes_[n].next) {
    const Node& r = nodes_[n];
    if (r.kind == Kind::free) {
      covered += r.size;
      continue;
    }
    const Bytes bytes = round_up(std::min(r.size, size - covered), g);
    pieces.emplace_back(n, bytes);
    to_map += bytes;
    covered += bytes;
  }
  if (!device_.map(to_map)) {
    failed_pieces_ = std::move(pieces);  // kept by keep_failed_growth if the request fails
    return false;
  }
  // The block goes at the run's start: the free range there, or the first piece once mapped (the
  // range below is not usable, so the fresh memory does not merge down; it may merge up).
  const bool starts_free = nodes_[start].kind == Kind::free;
  std::uint32_t first = kNil;
  map_pieces(pieces, to_map, &first);
  stats_.reserved.add(to_map);
  ++stats_.num_device_alloc;
  at = starts_free ? start : first;
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

// Turns the first `budget` bytes of the unmapped pieces (whole chunks, in address order, each at
// the start of its unmapped range) into fresh free memory any stream may use; the caller has
// charged the device. Returns the bytes; `first` gets the range that holds the first piece.
Bytes AsyncPoolAllocator::map_pieces(const std::vector<std::pair<std::uint32_t, Bytes>>& pieces, Bytes budget,
                                     std::uint32_t* first) {
  Bytes mapped = 0;
  for (const auto& [u, piece] : pieces) {
    const Bytes bytes = std::min(piece, budget - mapped);
    if (bytes == 0) break;
    Node fresh;  // new pool memory: any stream may use it
    fresh.start = nodes_[u].start;
    fresh.size = bytes;
    fresh.kind = Kind::free;
    fresh.owner = kAnyStream;
    std::uint32_t n = u;
    if (bytes < nodes_[u].size) {
      resize(u, fresh.start + bytes, nodes_[u].size - bytes);
      n = link_new(fresh, nodes_[u].prev);
    } else {
      unindex(u);
      fresh.prev = nodes_[u].prev;
      fresh.next = nodes_[u].next;
      nodes_[u] = fresh;
    }
    const std::uint32_t holder = place(n);
    if (first != nullptr && mapped == 0) *first = holder;
    mapped += bytes;
  }
  return mapped;
}

void AsyncPoolAllocator::take_with_internal_dependency(StreamId stream, std::uint32_t at, Bytes size) {
  const DeviceAddr end = nodes_[at].start + size;
  for (std::uint32_t n = at; n != kNil && nodes_[n].start < end; n = nodes_[n].next) {
    const StreamId owner = nodes_[n].owner;
    if (owner != kAnyStream && owner != kUnifierStream && owner != stream) order_after(stream, owner);
  }
}

// Gives `size` bytes of free ranges to a tensor: `n` is the free range where a run of adjacent
// free ranges starts (every placement is at one), and the rest of the last range stays free with
// its owner; `start` is n's start. `fit`, when valid, is n's entry in the free index (n holds the
// block alone) and fit_size its size. Returns the tensor's range.
inline std::uint32_t AsyncPoolAllocator::carve(std::uint32_t n, DeviceAddr start, Bytes size, FreeIndex::Cursor fit,
                                                Bytes fit_size) {
  const std::uint32_t below = nodes_[n].prev;
  Node tensor;
  tensor.start = start;
  tensor.size = size;
  tensor.kind = Kind::tensor;
  if (fit.valid) {  // one range: its entry is known, no search
    // The range's bounds from its entry, in registers on their way to the index (not read back
    // from the node the entry names: one dependent load fewer).
    Node& r = nodes_[n];
    if (size < fit_size) {
      const Bytes rest_size = fit_size - size;
      const DeviceAddr rest_start = start + size;
      sizes_.replace_at(fit, rest_size, rest_start);
      r.start = rest_start;
      r.size = rest_size;
    } else {
      sizes_.erase_at(fit);
      r.kind = Kind::tensor;  // out of the index already
      unlink(n);
    }
    return link_new(tensor, below);
  }
  Bytes left = size;
  while (left > 0) {
    if (n == kNil || nodes_[n].kind != Kind::free) {
      throw InfraError(fmt::format("async pool: placement at {:#x} (+{}) is not on free memory", tensor.start, size));
    }
    const Node& r = nodes_[n];
    const Bytes take = std::min(left, r.size);
    if (take < r.size) {
      resize(n, r.start + take, r.size - take);
    } else {
      const std::uint32_t next = r.next;
      unlink(n);
      n = next;
    }
    left -= take;
  }
  return link_new(tensor, below);
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
  const Bytes size = nodes_[l.node].size;
  stats_.allocated.sub(size);
  stats_.active.sub(size);
  stats_.requested.sub(l.requested);

  const std::uint32_t n = l.node;  // the tensor's range becomes free memory
  l.node = kNil;
  Node& fr = nodes_[n];
  fr.kind = Kind::free;
  if (l.recorded) {
    // PyTorch frees a block used on several streams on its "unifier" stream, which waits for
    // all of them: other streams get it only by chance, after a sync, or via internal deps.
    fr.owner = kUnifierStream;
    fr.free_tick = 0;
  } else {
    fr.owner = l.stream;  // cudaFreeAsync on the allocation stream
    fr.free_tick = ++ticks_[l.stream];
  }
  fr.opportunistic = options_.reuse_allow_opportunistic && coin();
  place(n);
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
    std::vector<std::uint32_t> owned;
    owned.reserve(sizes_.size() - sizes_.count(kAnyStream));
    sizes_.for_each_except(kAnyStream, [&](const FreeIndex::Entry& e) { owned.push_back(e.block); });
    std::sort(owned.begin(), owned.end(), [&](std::uint32_t a, std::uint32_t b) { return nodes_[a].start < nodes_[b].start; });
    // A range of a stream merges only with synchronized ones, so those not reached yet stay as
    // they are.
    for (const std::uint32_t n : owned) {
      unindex(n);
      Node& r = nodes_[n];
      r.owner = kAnyStream;
      r.free_tick = 0;
      r.opportunistic = false;
      place(n);
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
  if (stats_.reserved.current <= keep) return;
  const Bytes g = options_.pool_granularity;
  // Only synchronized free ranges of a chunk or more can hold a whole chunk; releasing one
  // changes no range below it, so they are visited from the top down as they are now.
  std::vector<std::uint32_t> candidates;
  for (FreeIndex::Cursor c = sizes_.lower_bound(kAnyStream, g); c.valid; c = sizes_.next(c)) {
    candidates.push_back(sizes_.at(c).block);
  }
  std::sort(candidates.begin(), candidates.end(), [&](std::uint32_t a, std::uint32_t b) { return nodes_[a].start > nodes_[b].start; });
  for (const std::uint32_t n : candidates) {
    if (stats_.reserved.current <= keep) break;
    const Node r = nodes_[n];
    const DeviceAddr a = r.start;
    const Bytes lo = round_up(a - base_, g);
    const Bytes hi = (r.end() - base_) / g * g;
    if (hi <= lo) continue;
    const Bytes release = std::min(hi - lo, ceil_div(stats_.reserved.current - keep, g) * g);
    const DeviceAddr cut = base_ + hi - release;
    // [a, cut) stays free, [cut, cut + release) is unmapped, [base + hi, end) stays free.
    std::uint32_t below = r.prev;
    unlink(n);
    Node piece = r;
    if (cut > a) {
      piece.size = cut - a;
      below = link_new(piece, below);
      index(below);
    }
    Node hole;
    hole.start = cut;
    hole.size = release;
    hole.kind = Kind::unmapped;
    const std::uint32_t h = link_new(hole, below);
    if (r.end() > base_ + hi) {
      piece.start = base_ + hi;
      piece.size = r.end() - piece.start;
      index(link_new(piece, h));
    }
    place(h);
    device_.unmap(release);
    stats_.reserved.sub(release);
    ++stats_.num_device_free;
  }
}

// ---- Stats and introspection ------------------------------------------------------------------

Bytes AsyncPoolAllocator::largest_usable_range(StreamId stream) const {
  Bytes largest = 0;
  sizes_.for_each([&](const FreeIndex::Entry& e) {
    if (usable(nodes_[e.block], stream)) largest = std::max(largest, e.size);
  });
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
  return nodes_[keys_[key].node].start;
}

void AsyncPoolAllocator::live_blocks(std::vector<BlockView>& out) const {
  for (BlockKey k = 0; k < keys_.size(); ++k) {
    const Live& l = keys_[k];
    if (l.live && !l.zero) out.push_back(BlockView{k, nodes_[l.node].start, nodes_[l.node].size, l.requested, l.stream});
  }
}

}  // namespace vf::sim

// `async`: the cudaMallocAsync default memory pool as PyTorch's `backend:cudaMallocAsync` uses
// it (cuda-allocators.md §2, §3.1, §7.5).
//
// PyTorch adds nothing on top of the driver: no rounding, no cache, no retry. The pool:
//   - Used (allocated) grows by the request rounded up to 512 B;
//   - Reserved grows in chunks of `pool_granularity` (UNVERIFIED, see below) mapped into one
//     address range; a request is placed by address, so free space scattered over the pool
//     cannot hold a large request and the pool grows (fragmentation: OOM is possible while
//     reserved - used is much larger than the request, rapidsai/rmm#1245, pytorch#110194);
//   - a free is reusable at once by its own stream; by other streams after an event edge
//     (stream_wait issued after the free: ReuseFollowEventDependencies), after a synchronize, by
//     chance (ReuseAllowOpportunistic: a seeded coin per free), or, when the pool cannot grow,
//     by letting the driver insert the wait (ReuseAllowInternalDependencies);
//   - on synchronize, a pool holding more than `release_threshold` trims free chunks down to it
//     (CUDA's default threshold 0 trims at every sync; PyTorch sets UINT64_MAX: never);
//   - OOM is raised at once: PyTorch does not sync, trim or retry.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "harness/core/recycle.h"
#include "harness/sim/allocator.h"
#include "harness/sim/free_index.h"

namespace vf::sim {

// Used grows in 512 B steps (observed, NVIDIA/cudf#10384; not a documented guarantee).
inline constexpr Bytes kAsyncAlign = 512;
// How much physical memory the pool adds when it grows: 32 MiB. Measured on an NVIDIA H200
// (driver 580.159.04, CUDA 13.0): reports/gpu/h200-2026-12-04.json,
// sections.calibration.suggested.pool_granularity (the default pool with release threshold
// UINT64_MAX reproduces the device's reserved bytes after all 52 requests of the sweep at 32 MiB,
// at no other step of the 64 tried; the dedicated pools agree). The origin thread's RTX 4090
// trace moves in the same steps (reference/origin-discussion.txt).
inline constexpr Bytes kDefaultPoolGranularity = 32 * MiB;
// The step of the origin thread's RTX 4090 trace (reference/origin-discussion.txt): the measured
// default, named for the tests that replay that trace.
inline constexpr Bytes kOriginPoolGranularity = 32 * MiB;
// Physical memory comes in 2 MiB pages, so a granularity is a whole number of them.
inline constexpr Bytes kPoolGranularityQuantum = 2 * MiB;
// cudaMemPoolAttrReleaseThreshold as PyTorch sets it (UINT64_MAX): never trim on synchronize.
inline constexpr Bytes kReleaseNever = ~Bytes{0};
// UNVERIFIED: the chance that a free made on another stream has already completed when this
// stream asks (run-to-run variable on a real GPU; drawn from the scenario seed here).
inline constexpr double kDefaultOpportunisticProbability = 0.5;
// The model maps the pool into one arena of virtual addresses this many times the device's
// total memory, so address space never limits growth (the driver's VA use is not modelled).
inline constexpr Bytes kAsyncArenaFactor = 4;
// Stream ids the pool tracks event edges for (0 = compute, 1..N offload streams).
inline constexpr StreamId kMaxAsyncStreams = 256;

struct AsyncOptions {
  Bytes release_threshold = kReleaseNever;  // PyTorch's setting (CUDA's own default is 0)
  Bytes pool_granularity = kDefaultPoolGranularity;
  bool reuse_follow_event_dependencies = true;
  bool reuse_allow_opportunistic = true;
  bool reuse_allow_internal_dependencies = true;
  double opportunistic_probability = kDefaultOpportunisticProbability;
  // per_process_memory_fraction: PyTorch enforces it on the sum of *requested* bytes.
  double memory_fraction = 1.0;
};

class AsyncPoolAllocator final : public Allocator {
 public:
  // `seed` drives the opportunistic-reuse coin: the same seed gives the same trace.
  AsyncPoolAllocator(SimDevice& device, const AsyncOptions& options, std::uint64_t seed);
  AsyncPoolAllocator(const AsyncPoolAllocator&) = delete;
  AsyncPoolAllocator& operator=(const AsyncPoolAllocator&) = delete;
  ~AsyncPoolAllocator() override { recycle_keep(keys_); }  // core/recycle.h

  AllocatorMode mode() const override { return AllocatorMode::async; }
  bool malloc(BlockKey key, Bytes size, StreamId stream) override;
  void free(BlockKey key) override;
  void record_stream(BlockKey key, StreamId stream) override;
  void stream_wait(StreamId waiter, StreamId target) override;
  void synchronize() override;
  void empty_cache() override;
  const AllocStats& stats() const override { return stats_; }
  void reset_peak_stats() override;
  void live_blocks(std::vector<BlockView>& out) const override;
  const std::optional<OomInfo>& last_oom() const override { return last_oom_; }
  Bytes held_for_other_streams(StreamId stream, Bytes request) const override;
  Bytes held_at_oom(StreamId stream, Bytes request) const override {
    return options_.reuse_allow_internal_dependencies ? 0 : held_for_other_streams(stream, request);
  }
  void reserve_keys(std::size_t keys) override { recycle_reserve(keys_, keys); }

  // cudaMemPoolTrimTo: releases whole free chunks that every stream may use (synchronized
  // frees), highest address first, until reserved <= keep. empty_cache() is synchronize + trim_to(0).
  void trim_to(Bytes keep);
  // The pool attributes can change while the pool is in use (cudaMemPoolSetAttribute); the
  // fake CUDA runtime (harness/cuda/runtime_fake.cpp) forwards them here.
  void set_release_threshold(Bytes threshold) { options_.release_threshold = threshold; }
  void set_reuse_policy(bool follow_event_dependencies, bool allow_opportunistic, bool allow_internal_dependencies) {
    options_.reuse_follow_event_dependencies = follow_event_dependencies;
    options_.reuse_allow_opportunistic = allow_opportunistic;
    options_.reuse_allow_internal_dependencies = allow_internal_dependencies;
  }

  // Introspection for tests and OOM reports.
  const AsyncOptions& options() const { return options_; }
  // The pool address of a live key (nullopt for a 0-byte key or one that is not live).
  std::optional<DeviceAddr> address(BlockKey key) const;
  Bytes largest_free_range() const;  // largest free range, whoever may use it
  Bytes largest_usable_range(StreamId stream) const;  // ... that `stream` may use now
  std::size_t free_range_count() const { return sizes_.size(); }

 private:
  // Owners of a free range besides real streams.
  static constexpr StreamId kAnyStream = 0xffffffffu;      // fresh or synchronized: any stream
  static constexpr StreamId kUnifierStream = 0xfffffffeu;  // freed after record_stream (PyTorch's
                                                           // "unifier" stream, nobody waits on it)
  static constexpr std::uint32_t kNil = ~std::uint32_t{0};
  enum class Kind : std::uint8_t { tensor, free, unmapped };

  // The arena is covered, without gaps, by ranges in a list in address order (boundary tags, as
  // PyTorch's own blocks keep prev/next): tensors, free ranges (mapped memory no tensor uses) and
  // unmapped ranges (whole chunks of address space without memory). A free looks at its two
  // neighbours only; a placement takes the front of a free range in place. Free ranges are
  // indexed by (owner, size, start) in `sizes_` and unmapped ones by start in `unmapped_`; a
  // tensor is indexed by its key (Live::node). Nothing searches the list by address.
  struct Node {
    DeviceAddr start = 0;
    Bytes size = 0;
    std::uint64_t free_tick = 0;  // free: the owner stream's free counter at the free
    StreamId owner = kAnyStream;  // free: who may reuse it without further ado
    std::uint32_t prev = kNil;    // the range below / above, kNil at the arena's ends
    std::uint32_t next = kNil;
    Kind kind = Kind::unmapped;
    bool opportunistic = false;  // free: the coin said this free completed early
    DeviceAddr end() const { return start + size; }
    bool open() const { return kind != Kind::tensor; }
  };

  // A key's block: its range (the node holds the address and the 512 B-rounded size).
  struct Live {
    Bytes requested = 0;
    std::uint32_t node = kNil;  // kNil for a 0-byte request
    StreamId stream = 0;
    bool live = false;
    bool zero = false;      // a 0-byte request: PyTorch never calls cudaMallocAsync for it
    bool recorded = false;  // record_stream on another stream: the free goes to the unifier
  };

  bool usable(const Node& r, StreamId stream) const;
  // The fit's range (`at`), its entry, and the entry's size and address.
  [[gnu::always_inline]] inline bool best_single_fit(StreamId stream, Bytes size, std::uint32_t& at,
                                                     FreeIndex::Cursor& fit, Bytes& fit_size, DeviceAddr& fit_addr) const;
  template <class Pred>
  bool best_run(Pred usable_range, Bytes size, std::uint32_t& at) const;
  bool grow(StreamId stream, Bytes size, std::uint32_t& at);
  void take_with_internal_dependency(StreamId stream, std::uint32_t at, Bytes size);
  [[gnu::always_inline]] inline std::uint32_t carve(std::uint32_t n, DeviceAddr start, Bytes size,
                                                    FreeIndex::Cursor fit, Bytes fit_size);
  // The range list's and indexes' primitives, inlined into malloc, carve, place and free.
  [[gnu::always_inline]] inline std::uint32_t link_new(const Node& proto, std::uint32_t after);
  [[gnu::always_inline]] inline void unlink(std::uint32_t n);
  [[gnu::always_inline]] inline void index(std::uint32_t n);
  [[gnu::always_inline]] inline void unindex(std::uint32_t n);
  [[gnu::always_inline]] inline void resize(std::uint32_t n, DeviceAddr start, Bytes size);
  [[gnu::always_inline]] inline std::uint32_t place(std::uint32_t n);
  // A stream seen before is in range and has its tables: the common case is one compare, inline.
  void ensure_stream(StreamId s) {
    if (s >= ticks_.size()) add_stream(s);
  }
  void add_stream(StreamId s);
  void order_after(StreamId waiter, StreamId target);
  bool coin();
  void record_oom(Bytes size, Bytes rounded, StreamId stream, bool fraction);
  Bytes map_pieces(const std::vector<std::pair<std::uint32_t, Bytes>>& pieces, Bytes budget, std::uint32_t* first = nullptr);
  void keep_failed_growth(StreamId stream);

  SimDevice& device_;
  AsyncOptions options_;
  std::uint64_t rng_state_;
  std::optional<Bytes> limit_;  // fraction x total, on requested bytes
  DeviceAddr base_ = 0;         // arena start, aligned to the granularity
  std::vector<Node> nodes_;  // by index; spare ones are listed in spare_nodes_
  std::vector<std::uint32_t> spare_nodes_;
  std::uint32_t head_ = kNil;  // the range at the arena's start
  FreeIndex sizes_;  // free ranges by (owner, size, start); entries carry their node
  std::map<DeviceAddr, std::uint32_t> unmapped_;  // unmapped ranges by start (a few: the tail, trimmed holes)
  std::vector<Live> keys_;
  // Event-edge bookkeeping (vector clocks): ticks_[s] counts frees on stream s;
  // seen_[w][s] is the latest free tick of s that stream w is ordered after.
  std::vector<std::uint64_t> ticks_;
  std::vector<std::vector<std::uint64_t>> seen_;
  AllocStats stats_;
  std::optional<OomInfo> last_oom_;
  // The block the latest malloc placed, until the next malloc or free (held_for_other_streams
  // counts it as the free or unmapped memory it was before).
  DeviceAddr last_placed_ = 0;
  Bytes last_placed_size_ = 0;
  // What the current malloc's failed growth mapped and kept (OomInfo::retained), and the free
  // ranges before it (for the OOM's message).
  Bytes retained_ = 0;
  bool last_failed_ = false;  // the previous malloc failed (a retry adds to retained_)
  std::vector<std::pair<std::uint32_t, Bytes>> failed_pieces_;  // the growth grow() could not back (unmapped nodes)
  Bytes largest_before_ = 0;
  Bytes usable_before_ = 0;
};

}  // namespace vf::sim

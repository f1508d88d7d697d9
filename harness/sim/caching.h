// `caching` and `caching-expandable`: PyTorch's native CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp) as a model you can read in one sitting.
//
// The rules, in the order a request meets them (cuda-allocators.md §1, §7.3, §7.4):
//   1. round the request up (512 B, optionally power-of-two divisions);
//   2. pick the pool by the rounded size: <= 1 MiB small, else large (pools never share);
//   3. best fit among the free blocks of that pool cached *on the same stream*, obeying the
//      oversize rules of max_split_size_mb;
//   4. on a miss, get a new segment: cudaMalloc(2 MiB | 20 MiB | round-up-to-2 MiB) for native,
//      or map 2 MiB / 20 MiB pages into the stream's growable segment for expandable;
//   5. split the block when the remainder is worth keeping, else hand out the whole block;
//   6. on failure walk the ladder: release oversize cached blocks, retry; sync every event,
//      release every fully free segment (unmap every free page), retry; then OOM.
// Frees merge with free neighbours of the same segment. A block used on other streams
// (record_stream) stays out of the cache until events recorded at free time complete.
//
// Both modes share this class; what differs is how blocks get device memory (whole cudaMalloc
// segments vs. pages mapped into a reserved VA range, the latter kept in caching_expandable.cpp).
// Memory itself comes from a DeviceLayer (device_layer.h): the SimDevice in the simulator, real
// cudaMalloc / cuMemMap in the `cuda` backend. One model, two device layers.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "harness/core/recycle.h"
#include "harness/core/scalar_load.h"
#include "harness/sim/allocator.h"
#include "harness/sim/free_index.h"
#include "harness/sim/node_stash.h"

namespace vf::sim {

// ---- Constants (PyTorch's names; unchanged in every version read, §1.1) --------------------

// Every request is rounded up to a multiple of 512 B (minimum 512 B). cudaMalloc hands out
// 512 B-spaced addresses, so carving blocks in 512 B steps keeps every block aligned.
inline constexpr Bytes kMinBlockSize = 512;
// Rounded requests up to 1 MiB are "small" and live in their own pool, so many tiny tensors
// do not fragment the segments that large tensors need.
inline constexpr Bytes kSmallSize = 1 * MiB;
// A small-pool miss asks the device for one 2 MiB segment (one physical page) and carves it.
inline constexpr Bytes kSmallBuffer = 2 * MiB;
// Large requests below 10 MiB share a "large buffer" segment instead of getting their own.
inline constexpr Bytes kMinLargeAlloc = 10 * MiB;
// That large buffer: 20 MiB by default. PyTorch's 2026 AllocatorConfig makes it
// `large_segment_size_mb` (> 10), which is also the default of max_non_split_rounding_mb and the
// minimum of both max_split_size_mb and max_non_split_rounding_mb (alloc_options.cpp).
inline constexpr Bytes kLargeBuffer = 20 * MiB;
// Requests of 10 MiB and more get a segment of their own, rounded up to whole 2 MiB pages.
inline constexpr Bytes kRoundLarge = 2 * MiB;
// roundup_power2_divisions has one entry per power-of-two interval from 1 MiB to 64 GiB:
// entry i covers [2^i, 2^(i+1)) MiB; everything below 1 MiB uses entry 0, >= 32 GiB entry 15.
inline constexpr std::size_t kRoundupIntervals = 16;
// Expandable segments reserve 1.125 x the device's total memory of virtual address space each
// (written as 9/8 so it stays integer arithmetic).
inline constexpr Bytes kExpandableVaNum = 9;
inline constexpr Bytes kExpandableVaDen = 8;
// "No limit" for max_split_size (PyTorch: SIZE_MAX).
inline constexpr Bytes kUnlimited = ~Bytes{0};
// Requests of this size (1 EiB) and more are refused as OOM before the allocator runs, as
// PyTorch's allocate() does (`size < one_exa_bytes`): no pending event is processed for them.
// It also keeps the rounding arithmetic overflow-free.
inline constexpr Bytes kMaxRequest = Bytes{1} << 60;

using RoundupDivisions = std::array<std::uint32_t, kRoundupIntervals>;

// The knobs of PYTORCH_ALLOC_CONF that the model honours (alloc_options.cpp parses them).
struct CachingOptions {
  RoundupDivisions roundup_divisions{};     // roundup_power2_divisions; 0 / 1 = plain 512 B rounding
  Bytes max_split_size = kUnlimited;        // max_split_size_mb: blocks >= it are never split
  Bytes max_non_split_rounding = kLargeBuffer;  // max_non_split_rounding_mb (default: large_segment_size): oversize reuse slack
  double garbage_collection_threshold = 0;  // (0,1); active only with a memory fraction
  double memory_fraction = 1.0;             // per_process_memory_fraction; limit round(f x total); 1 = no limit
  bool expandable_segments = false;         // expandable_segments:True
  Bytes large_segment_size = kLargeBuffer;  // large_segment_size_mb
  // Sim-only: how many later mallocs still see a record_stream event pending. nullopt (the
  // default, conservative): events complete only at synchronize() / empty_cache() / the
  // OOM ladder's sync. See "work done" in docs/allocators.md.
  std::optional<std::uint32_t> event_lag_mallocs;
};

// §1.2: the rounded size of a request (size <= kMaxRequest).
Bytes round_size(Bytes size, const RoundupDivisions& divisions);
// The divisions-table entry a size uses.
std::size_t roundup_interval(Bytes size);
// §1.3: the segment size a miss asks for, from the rounded size.
Bytes allocation_size(Bytes rounded, Bytes large_segment_size);

class CachingAllocator final : public Allocator {
 public:
  CachingAllocator(DeviceLayer& device, const CachingOptions& options);
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;
  ~CachingAllocator() override;

  AllocatorMode mode() const override {
    return options_.expandable_segments ? AllocatorMode::caching_expandable : AllocatorMode::caching;
  }
  bool malloc(BlockKey key, Bytes size, StreamId stream) override;
  void free(BlockKey key) override;
  void record_stream(BlockKey key, StreamId stream) override;
  // The native allocator never sees stream edges: only its own events tell it work is done.
  void stream_wait(StreamId, StreamId) override {}
  void synchronize() override;
  void empty_cache() override;
  const AllocStats& stats() const override { return stats_; }
  void reset_peak_stats() override;
  void live_blocks(std::vector<BlockView>& out) const override;
  const std::optional<OomInfo>& last_oom() const override { return last_oom_; }
  Bytes held_for_other_streams(StreamId stream, Bytes request) const override;
  // Blocks are at most about one per key (live blocks have one each; the free ones between them
  // are fewer), so a large program's block table is sized with its keys; both tables are
  // recycled (core/recycle.h).
  void reserve_keys(std::size_t keys) override;

  // Introspection for tests and reports.
  const CachingOptions& options() const { return options_; }
  std::size_t segment_count() const;       // live cudaMalloc segments / expandable VA segments
  std::size_t pending_events() const { return pending_.size(); }
  std::optional<Bytes> allowed_memory() const { return allowed_; }  // fraction x total
  // The device address of a live key (nullopt for a 0-byte key or one that is not live).
  std::optional<DeviceAddr> address(BlockKey key) const;

 private:
  using Index = std::uint32_t;
  static constexpr Index kNone = 0xffffffffu;
  static constexpr Index kZeroSized = 0xfffffffeu;  // a live key of 0 bytes: no block at all

  enum class State : std::uint8_t {
    free,             // in its pool's free set, reusable
    allocated,        // handed out to a key
    awaiting_events,  // freed, but other streams' events recorded at free time are pending
    unmapped,         // expandable only: VA without physical pages
  };

  // Expandable: unmapped VA pieces by (stream, address), searched lowest address first.
  struct UnmappedKey {
    StreamId stream;
    DeviceAddr addr;
    Index block;
    bool operator<(const UnmappedKey& o) const {
      return stream != o.stream ? stream < o.stream : addr < o.addr;
    }
  };
  using UnmappedSet = std::set<UnmappedKey>;

  struct Pool {
    bool small = false;
    FreeIndex blocks;  // free mapped blocks by (stream, size, address): best fit is lower_bound
    UnmappedSet unmapped;
    std::uint64_t lookups = 0;  // get_free_block calls; block age for GC = lookups - gc_base
  };

  // 64 bytes, copied as plain bytes (a split makes one per malloc). What only some blocks need
  // lives beside the table: the record_stream set in uses_; an unmapped block is found in its
  // pool's set by its key, which does not change while it is there.
  struct Block {
    DeviceAddr addr = 0;
    Bytes size = 0;
    Bytes requested = 0;
    std::uint64_t gc_base = 0;
    Index prev = kNone;  // neighbours in the same segment, by address
    Index next = kNone;
    Index segment = kNone;
    StreamId stream = 0;
    std::uint32_t event_count = 0;
    BlockKey key = 0;
    Index uses = kNone;  // its record_stream set in uses_ (never empty there); kNone: none
    State state = State::free;
    bool small = false;
  };
  static_assert(std::is_trivially_copyable_v<Block> && sizeof(Block) <= 64);

  struct Segment {
    bool live = false;
    DeviceAlloc alloc;   // native: what cudaFree needs
    DeviceAddr base = 0; // expandable: start of the reserved VA
    Bytes page = 0;      // expandable: 2 MiB (small) or large_segment_size (large)
  };

  // An event recorded on a stream that used a freed block; `ready_at` is the malloc number
  // whose process_events first sees it complete (kNever until a sync).
  struct PendingEvent {
    Index block;
    std::uint64_t ready_at;
  };
  static constexpr std::uint64_t kNever = ~std::uint64_t{0};

  enum class Failure : std::uint8_t { none, fraction, device };

  // -- the malloc path (caching.cpp) --
  // The best fit, left in the index: `at` is its place there (hand_out takes it out, or keeps
  // the split's remainder at that place).
  Index get_free_block(Pool& pool, StreamId stream, Bytes size, FreeIndex::Cursor& at, Bytes& found_size,
                       DeviceAddr& found_addr);
  Index alloc_block(Pool& pool, StreamId stream, Bytes rounded, Bytes alloc_size);
  bool release_available_cached_blocks(Pool& pool, StreamId stream, Bytes rounded);
  void release_cached_blocks();
  void garbage_collect_cached_blocks();
  // From the found block's size and pool, as its index entry gave them: the decision does not
  // wait for the block itself to be read.
  bool should_split(Bytes block_size, bool small, Bytes size) const;
  // `found` is a block of `pool` of found_size bytes at found_addr. `cached` (valid): it is still
  // in the pool's free index there, and those are its entry's figures; else it is in no index (a
  // new segment's block).
  Index hand_out(Index found, Pool& pool, Bytes found_size, DeviceAddr found_addr, Bytes rounded, Bytes requested,
                 BlockKey key, FreeIndex::Cursor cached);
  [[gnu::always_inline]] inline void free_block(Index b);  // in free and in event processing
  void event_done(Index b);
  Bytes try_merge(Index dst, Index src);
  [[gnu::always_inline]] Bytes absorb(Index dst, Index src);  // the splice both merges share
  void process_events();  // after malloc counted itself (malloc_count_), where events are pending
  void synchronize_and_free_events();
  void record_oom(Bytes size, Bytes rounded, Bytes alloc_size, StreamId stream);

  // -- native device layer (caching.cpp) --
  Index new_segment(Pool& pool, StreamId stream, Bytes alloc_size);
  void release_block(Index b);
  void release_pool_native(Pool& pool);

  // -- expandable device layer (caching_expandable.cpp) --
  Index map_expandable(Pool& pool, StreamId stream, Bytes rounded);
  Index find_expandable_candidate(Pool& pool, StreamId stream, Bytes size);
  Index new_expandable_segment(Pool& pool, StreamId stream);
  Index map_block(Index unmapped, Bytes bytes);
  void unmap_block(Index b);
  void merge_unmapped(Index dst, Index src);
  void release_pool_expandable(Pool& pool);
  Bytes expandable_size(Index b) const;

  // -- bookkeeping --
  Pool& pool_of(const Block& b) { return b.small ? small_ : large_; }
  Index new_block();
  void recycle_block(Index b);
  Index new_segment_slot();
  // Into its pool's free index. With `replacing` (valid: the entry of the found block whose
  // front a split handed out, or of a free neighbour b absorbed), b takes that entry's place:
  // moved within its chunk when it stays in one, not erased and inserted again.
  // Inline (below): its call, once per free and per split, was 4 % of a malloc+free pair.
  [[gnu::always_inline]] void insert_free(Index b, FreeIndex::Cursor replacing = {});
  // The same with b's pool, size and address given (just computed, not read back from b).
  [[gnu::always_inline]] void insert_free(Index b, Pool& pool, Bytes size, DeviceAddr addr,
                                          FreeIndex::Cursor replacing);
  void erase_free(Index b);
  void insert_unmapped(Index b);
  void erase_unmapped(Index b);
  bool is_split(const Block& b) const { return b.prev != kNone || b.next != kNone; }
  bool gc_enabled() const { return allowed_.has_value() && options_.garbage_collection_threshold > 0; }

  DeviceLayer& device_;
  CachingOptions options_;
  bool any_divisions_ = false;    // a non-trivial roundup table is set
  std::optional<Bytes> allowed_;  // memory fraction x total, when fraction < 1
  Pool small_;
  Pool large_;
  std::vector<Block> blocks_;  // indexed by Index; new_block() may move it: re-fetch references
  std::vector<Index> spare_blocks_;
  std::vector<Segment> segments_;
  std::vector<Index> spare_segments_;
  std::vector<Index> keys_;  // BlockKey -> block (kNone: not live)
  std::vector<std::vector<StreamId>> uses_;  // record_stream sets, by Block::uses
  std::vector<Index> spare_uses_;
  std::vector<Index> scratch_;  // block lists for release / GC passes (kept to avoid churn)
  std::vector<std::pair<DeviceAddr, Bytes>> map_pieces_;  // expandable: page runs one miss maps
  std::deque<PendingEvent> pending_;
  Bytes awaiting_bytes_ = 0;  // blocks freed with events pending (State::awaiting_events)
  std::uint64_t malloc_count_ = 0;
  NodeStash<UnmappedSet> unmapped_nodes_;
  Failure last_failure_ = Failure::none;
  AllocStats stats_;
  std::optional<OomInfo> last_oom_;
};

inline void CachingAllocator::insert_free(Index bi, FreeIndex::Cursor replacing) {
  Block& b = blocks_[bi];
  // The size and address one by one: a merge or split has just stored them so (core/scalar_load.h).
  insert_free(bi, pool_of(b), scalar_load(b.size), scalar_load(b.addr), replacing);
}

inline void CachingAllocator::insert_free(Index bi, Pool& pool, Bytes size, DeviceAddr addr,
                                          FreeIndex::Cursor replacing) {
  Block& b = blocks_[bi];
  if (replacing.valid) {
    pool.blocks.replace_at(replacing, size, addr, bi);
  } else {
    pool.blocks.insert(b.stream, size, addr, bi);
  }
  b.state = State::free;
  b.gc_base = pool.lookups;
}

// Splices neighbour `src` (already out of its pool's set) into `dst`: dst takes its address range.
// Inline (a free's merge calls it): out of line, the merged size and address went through memory
// on their way to the free index.
inline Bytes CachingAllocator::absorb(Index dst, Index src) {
  Block& d = blocks_[dst];
  const Block& s = blocks_[src];
  if (d.prev == src) {
    d.addr = s.addr;
    d.prev = s.prev;
    if (d.prev != kNone) blocks_[d.prev].next = dst;
  } else {
    d.next = s.next;
    if (d.next != kNone) blocks_[d.next].prev = dst;
  }
  d.size += s.size;
  const Bytes absorbed = s.size;
  recycle_block(src);
  return absorbed;
}

}  // namespace vf::sim

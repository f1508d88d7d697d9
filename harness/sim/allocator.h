// The allocator interface every simulated allocator mode implements (raw, caching,
// caching-expandable, async), and the statistics they report the way PyTorch does.
// The backend drives it with the ops of a lowered program; `alloc-replay` drives it with a
// user's event trace. Allocators never throw on OOM: malloc returns false and the caller
// records the event.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/core/bytes.h"
#include "harness/scenario.h"
#include "harness/sim/device.h"

namespace vf::sim {

using StreamId = std::uint32_t;  // 0 = the compute (default) stream; 1..N = offload streams
using BlockKey = std::uint32_t;  // the caller's id of a live allocation (dense, small integers)

// One statistic with its high-water mark; reset_peak sets peak = current (PyTorch semantics).
struct Stat {
  Bytes current = 0;
  Bytes peak = 0;
  void add(Bytes b) {
    current += b;
    if (current > peak) peak = current;
  }
  void sub(Bytes b) { current -= b; }
  void reset_peak() { peak = current; }
};

// torch.cuda.memory_stats() names: requested <= allocated <= reserved; active adds blocks freed
// but waiting on another stream's events; inactive_split = free pieces of split segments.
struct AllocStats {
  Stat requested;
  Stat allocated;
  Stat active;
  Stat reserved;
  Stat inactive_split;
  std::uint64_t num_alloc_retries = 0;
  std::uint64_t num_ooms = 0;
  std::uint64_t num_device_alloc = 0;  // cudaMalloc / cuMemMap / pool growth calls
  std::uint64_t num_device_free = 0;
  // reset_peak_memory_stats: every peak becomes its current value (counters are kept).
  void reset_peaks() {
    for (Stat* st : {&requested, &allocated, &active, &reserved, &inactive_split}) st->reset_peak();
  }
};

// A live block as the property tests see it: [addr, addr + size) must not overlap another.
struct BlockView {
  BlockKey key = 0;
  DeviceAddr addr = 0;
  Bytes size = 0;       // bytes handed out (allocated), >= requested
  Bytes requested = 0;
  StreamId stream = 0;
};

struct OomInfo {
  Bytes request = 0;      // bytes asked for
  Bytes device_free = 0;  // what cudaMemGetInfo would have said
  Bytes reserved = 0;     // allocator reserved at that moment
  Bytes allocated = 0;
  std::string detail;     // which rung of the ladder failed, fragmentation note ...
  // Reserved bytes the failed call itself added and kept (cudaMallocAsync maps what it can of a
  // growth the device cannot back, and the pool keeps it); `reserved` is before them.
  Bytes retained = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;

  virtual AllocatorMode mode() const = 0;

  // Allocates `size` bytes for `key` on `stream`; false on OOM after the allocator's own recovery
  // (the caching retry ladder; async does not retry). The key must not be live.
  virtual bool malloc(BlockKey key, Bytes size, StreamId stream) = 0;
  // Frees `key`, ordered on the stream it was allocated on.
  virtual void free(BlockKey key) = 0;
  // PyTorch record_stream: the block is also used on `stream`; its free waits for that work.
  virtual void record_stream(BlockKey key, StreamId stream) = 0;
  // `waiter` waits for all work issued so far on `target` (cudaStreamWaitEvent edge).
  virtual void stream_wait(StreamId waiter, StreamId target) = 0;
  // Device-wide synchronize: all issued work is complete and the host knows it.
  virtual void synchronize() = 0;
  // torch.cuda.empty_cache() (async: sync + trim the pool to 0).
  virtual void empty_cache() = 0;

  virtual const AllocStats& stats() const = 0;
  virtual void reset_peak_stats() = 0;
  virtual void live_blocks(std::vector<BlockView>& out) const = 0;
  // Details of the most recent failed malloc.
  virtual const std::optional<OomInfo>& last_oom() const = 0;
  // Reserved bytes no tensor uses that a malloc on `stream` could not take now, because they
  // belong to another stream: blocks cached in other streams' pools or freed with other
  // streams' events still pending (caching), free pool ranges whose frees `stream` is not
  // ordered after (async). Part of reserved - allocated; 0 where there is no cache (raw).
  // `request` > 0: only what a malloc of that many bytes could have taken had it been the
  // stream's own (a block of the request's pool at least its rounded size; a run of adjacent
  // free ranges at least that long): a 1.6 MiB segment tail of another stream cannot hold a
  // 5 MiB request on any stream, so it is slack, not a stream's holding. 0: every such byte.
  virtual Bytes held_for_other_streams(StreamId stream, Bytes request) const {
    (void)stream;
    (void)request;
    return 0;
  }
  // The same right after a malloc of `request` bytes on `stream` failed: what that malloc could
  // not take. The async pool takes other streams' frees before it fails
  // (ReuseAllowInternalDependencies), so there, with that policy on, nothing was held from it.
  virtual Bytes held_at_oom(StreamId stream, Bytes request) const { return held_for_other_streams(stream, request); }
  // A hint: keys will be below `keys` (a program's buffer count), so per-key tables are sized
  // once instead of growing (and moving) as a program of millions of buffers runs.
  virtual void reserve_keys(std::size_t keys) { (void)keys; }
};

// Builds the allocator for `config` on `device`. Options are validated here: an unknown option,
// a value of the wrong type or out of range throws InputError naming `allocator.options.<key>`.
// `seed` drives allocator-side nondeterminism (async opportunistic reuse), replayably.
std::unique_ptr<Allocator> make_allocator(const AllocatorConfig& config, SimDevice& device, std::uint64_t seed);

// Validates the options of `config` without building an allocator (scenario load uses it).
void validate_allocator_config(const AllocatorConfig& config, std::string_view path);
// The same, naming each option's field with `field_of` (alloc_options.h).
void validate_allocator_config(const AllocatorConfig& config, const std::function<std::string(std::string_view)>& field_of);
// Validates, then names the model the options build: mode caching with expandable_segments True
// becomes caching-expandable, so signatures, reports and corpus matching say which model ran.
void normalize_allocator_config(AllocatorConfig& config, std::string_view path);
void normalize_allocator_config(AllocatorConfig& config, const std::function<std::string(std::string_view)>& field_of);

}  // namespace vf::sim

// `async`: the cudaMallocAsync default pool as PyTorch uses it (cuda-allocators.md §2, §3.1,
// §7.5): 512 B Used steps, chunked growth, release threshold, the three reuse policies, the
// fragmentation term, no retry.
#include <gtest/gtest.h>

#include "harness/core/error.h"
#include "harness/sim/async_pool.h"
#include "tests/sim_test_util.h"

namespace vf::sim {
namespace {

using test::spec_of;
using test::addr_of;

// Most tests grow the pool in 2 MiB steps, so that a rule shows in small numbers; the measured
// default step (32 MiB) has tests of its own.
AsyncOptions step2() {
  AsyncOptions o;
  o.pool_granularity = 2 * MiB;
  return o;
}

// Cross-stream tests switch the coin off so only the rule under test can allow reuse.
AsyncOptions no_opportunistic() {
  AsyncOptions o = step2();
  o.reuse_allow_opportunistic = false;
  return o;
}

// The growth is kept only once the request has failed, after the fallback to frees pending on
// other streams (ReuseAllowInternalDependencies): chunks kept before it would join those frees
// and turn the OOM into a success. 136 MiB card, 32 MiB steps: stream 0 holds 20 MiB, stream 1
// frees 60 MiB, stream 0 asks for 100 MiB: an OOM with or without the fallback (as before the
// kept growth was modelled), the one chunk that fits kept.
TEST(AsyncPool, AFailedGrowthIsKeptOnlyAfterTheFallbackFailed) {
  for (const bool internal : {true, false}) {
    SimDevice d(spec_of(136 * MiB));
    AsyncOptions o;
    o.reuse_allow_opportunistic = false;
    o.reuse_allow_internal_dependencies = internal;
    AsyncPoolAllocator a(d, o, 0);
    ASSERT_TRUE(a.malloc(0, 20 * MiB, 0));
    ASSERT_TRUE(a.malloc(1, 60 * MiB, 1));
    a.free(1);
    EXPECT_EQ(a.stats().reserved.current, 96 * MiB);
    EXPECT_FALSE(a.malloc(2, 100 * MiB, 0)) << internal;
    EXPECT_EQ(a.stats().reserved.current, 128 * MiB);
    EXPECT_EQ(a.last_oom()->reserved, 96 * MiB);
    EXPECT_EQ(a.last_oom()->retained, 32 * MiB);
  }
}

TEST(AsyncPool, UsedGrowsBy512ByteStepsReservedByChunks) {
  SimDevice d(spec_of(1 * GiB));
  AsyncPoolAllocator a(d, step2(), 0);
  ASSERT_TRUE(a.malloc(0, 600, 0));
  EXPECT_EQ(a.stats().allocated.current, 1024u);
  EXPECT_EQ(a.stats().active.current, 1024u);
  EXPECT_EQ(a.stats().requested.current, 600u);
  EXPECT_EQ(a.stats().reserved.current, 2 * MiB);  // one 2 MiB step
  ASSERT_TRUE(a.malloc(1, 3 * MiB, 0));            // 2 MiB - 1 KiB free in the pool: grow by 2 MiB
  EXPECT_EQ(a.stats().reserved.current, 4 * MiB);
  EXPECT_EQ(addr_of(a, 1), addr_of(a, 0) + 1024);  // placed by address, right after
  EXPECT_EQ(d.charged(), 4 * MiB);
}

// The measured default (an H200, reports/gpu/h200-2026-12-04.json): 32 MiB steps. The sweep's
// first requests there: 512 B -> 32 MiB reserved; 33 MiB more with 27 MiB used -> 64 MiB;
// 100 MiB more with 59 MiB used -> 160 MiB (the free tail is extended by 96 MiB).
TEST(AsyncPool, TheDefaultStepIsTheMeasuredThirtyTwoMiB) {
  SimDevice d(spec_of(24 * GiB));
  AsyncPoolAllocator a(d, {}, 0);
  EXPECT_EQ(a.options().pool_granularity, 32 * MiB);
  ASSERT_TRUE(a.malloc(0, 512, 0));
  EXPECT_EQ(a.stats().reserved.current, 32 * MiB);
  ASSERT_TRUE(a.malloc(1, 27267584 - 512, 0));  // used 27267584 B, as after the H200's 9th request
  EXPECT_EQ(a.stats().reserved.current, 32 * MiB);
  ASSERT_TRUE(a.malloc(2, 34603008, 0));
  EXPECT_EQ(a.stats().reserved.current, 64 * MiB);
  ASSERT_TRUE(a.malloc(3, 104857600, 0));
  EXPECT_EQ(a.stats().reserved.current, 160 * MiB);
  EXPECT_EQ(d.charged(), 160 * MiB);
}

// A growth the device cannot back: the pool keeps the whole chunks that fit, and the OOM says
// what the request met (the H200 kept all but 33 MiB of the device's free memory in its probe).
TEST(AsyncPool, AFailedGrowthKeepsTheChunksThatFit) {
  SimDevice d(spec_of(2 * GiB + 5 * MiB));
  AsyncPoolAllocator a(d, {}, 0);
  ASSERT_TRUE(a.malloc(0, 512 * MiB, 0));
  EXPECT_EQ(a.stats().reserved.current, 512 * MiB);
  EXPECT_FALSE(a.malloc(1, 4 * GiB, 0));
  // 1541 MiB were free: 48 whole chunks (1536 MiB) are mapped and kept, 5 MiB stay free.
  EXPECT_EQ(a.stats().reserved.current, 2048 * MiB);
  EXPECT_EQ(d.free(), 5 * MiB);
  const OomInfo& oom = *a.last_oom();
  EXPECT_EQ(oom.reserved, 512 * MiB);
  EXPECT_EQ(oom.device_free, 1541 * MiB);
  EXPECT_EQ(oom.retained, 1536 * MiB);
  EXPECT_NE(oom.detail.find("the pool grew by 1536.00 MiB it could not use"), std::string::npos) << oom.detail;
  // A retry in the same op (aimdo's hook evicts and calls again) still reports what the first
  // attempt met.
  EXPECT_FALSE(a.malloc(3, 4 * GiB, 0));
  EXPECT_EQ(a.last_oom()->reserved, 512 * MiB);
  EXPECT_EQ(a.last_oom()->retained, 1536 * MiB);
  EXPECT_EQ(a.last_oom()->device_free, 1541 * MiB);
  // A later request that fits uses the kept chunks without growing; a trim gives them back.
  ASSERT_TRUE(a.malloc(2, 1 * GiB, 0));
  EXPECT_EQ(a.stats().reserved.current, 2048 * MiB);
  a.free(2);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 512 * MiB);
}

TEST(AsyncPool, ThirtyTwoMiBGranularityReservesAheadOfAllocated) {
  SimDevice d(spec_of(24 * GiB));
  AsyncOptions o = step2();
  o.pool_granularity = kOriginPoolGranularity;
  AsyncPoolAllocator a(d, o, 0);
  ASSERT_TRUE(a.malloc(0, 40 * MiB, 0));
  EXPECT_EQ(a.stats().reserved.current, 64 * MiB);  // two chunks for 40 MiB
  ASSERT_TRUE(a.malloc(1, 40 * MiB, 0));            // 24 MiB tail + one more chunk
  EXPECT_EQ(a.stats().reserved.current, 96 * MiB);
  EXPECT_EQ(addr_of(a, 1), addr_of(a, 0) + 40 * MiB);
  ASSERT_TRUE(a.malloc(2, 10 * MiB, 0));            // fits the 16 MiB tail
  EXPECT_EQ(a.stats().reserved.current, 96 * MiB);
}

// ---- release threshold -----------------------------------------------------------------------

TEST(AsyncPool, ThresholdZeroTrimsAtSynchronize) {
  SimDevice d(spec_of(1 * GiB));
  AsyncOptions o = step2();
  o.release_threshold = 0;  // CUDA's own default
  AsyncPoolAllocator a(d, o, 0);
  ASSERT_TRUE(a.malloc(0, 100 * MiB, 0));
  ASSERT_TRUE(a.malloc(1, 10 * MiB, 0));
  a.free(0);
  EXPECT_EQ(a.stats().reserved.current, 110 * MiB);  // nothing happens at the free itself
  a.synchronize();
  EXPECT_EQ(a.stats().reserved.current, 10 * MiB);   // only the live block's chunks stay
  EXPECT_EQ(d.charged(), 10 * MiB);
}

TEST(AsyncPool, PyTorchsThresholdNeverTrimsAtSynchronize) {
  SimDevice d(spec_of(1 * GiB));
  AsyncPoolAllocator a(d, step2(), 0);  // release_threshold = UINT64_MAX, as PyTorch sets it
  EXPECT_EQ(a.options().release_threshold, kReleaseNever);
  ASSERT_TRUE(a.malloc(0, 100 * MiB, 0));
  a.free(0);
  a.synchronize();
  EXPECT_EQ(a.stats().reserved.current, 100 * MiB);
  a.empty_cache();  // torch.cuda.empty_cache(): device sync + TrimTo(0)
  EXPECT_EQ(a.stats().reserved.current, 0u);
  EXPECT_EQ(d.charged(), 0u);
}

TEST(AsyncPool, ThresholdKeepsThatMuchAtSynchronize) {
  SimDevice d(spec_of(1 * GiB));
  AsyncOptions o = step2();
  o.release_threshold = 30 * MiB;
  AsyncPoolAllocator a(d, o, 0);
  ASSERT_TRUE(a.malloc(0, 100 * MiB, 0));
  a.free(0);
  a.synchronize();
  EXPECT_EQ(a.stats().reserved.current, 30 * MiB);
}

TEST(AsyncPool, TrimNeverReleasesAChunkHoldingLiveData) {
  SimDevice d(spec_of(1 * GiB));
  AsyncOptions o = step2();
  o.pool_granularity = 32 * MiB;
  AsyncPoolAllocator a(d, o, 0);
  ASSERT_TRUE(a.malloc(0, 40 * MiB, 0));  // [0, 40) in chunks 0-1
  ASSERT_TRUE(a.malloc(1, 10 * MiB, 0));  // [40, 50) in chunk 1
  a.free(0);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 32 * MiB);  // chunk 0 released, chunk 1 kept
}

// ---- reuse across streams ---------------------------------------------------------------------

TEST(AsyncPool, SameStreamReusesAtOnce) {
  SimDevice d(spec_of(1 * GiB));
  AsyncPoolAllocator a(d, no_opportunistic(), 0);
  ASSERT_TRUE(a.malloc(0, 64 * MiB, 0));
  const DeviceAddr first = addr_of(a, 0);
  a.free(0);
  ASSERT_TRUE(a.malloc(1, 64 * MiB, 0));
  EXPECT_EQ(addr_of(a, 1), first);
  EXPECT_EQ(a.stats().reserved.current, 64 * MiB);
}

TEST(AsyncPool, OtherStreamReusesOnlyAfterAWaitEdgeOrASync) {
  auto reserved_after = [](auto between) {
    SimDevice d(spec_of(1 * GiB));
    AsyncPoolAllocator a(d, no_opportunistic(), 0);
    EXPECT_TRUE(a.malloc(0, 64 * MiB, 0));
    a.free(0);
    between(a);
    EXPECT_TRUE(a.malloc(1, 64 * MiB, 1));
    return a.stats().reserved.current;
  };
  EXPECT_EQ(reserved_after([](Allocator&) {}), 128 * MiB);                          // no edge: grow
  EXPECT_EQ(reserved_after([](Allocator& a) { a.stream_wait(1, 0); }), 64 * MiB);   // edge after free
  EXPECT_EQ(reserved_after([](Allocator& a) { a.stream_wait(0, 1); }), 128 * MiB);  // wrong direction
  EXPECT_EQ(reserved_after([](Allocator& a) { a.synchronize(); }), 64 * MiB);
}

TEST(AsyncPool, AWaitIssuedBeforeTheFreeDoesNotCount) {
  SimDevice d(spec_of(1 * GiB));
  AsyncPoolAllocator a(d, no_opportunistic(), 0);
  ASSERT_TRUE(a.malloc(0, 64 * MiB, 0));
  a.stream_wait(1, 0);
  a.free(0);
  ASSERT_TRUE(a.malloc(1, 64 * MiB, 1));
  EXPECT_EQ(a.stats().reserved.current, 128 * MiB);
}

TEST(AsyncPool, EventEdgesAreTransitive) {
  SimDevice d(spec_of(1 * GiB));
  AsyncPoolAllocator a(d, no_opportunistic(), 0);
  ASSERT_TRUE(a.malloc(0, 64 * MiB, 0));
  a.free(0);
  a.stream_wait(1, 0);
  a.stream_wait(2, 1);  // stream 2 is now after stream 0's free too
  ASSERT_TRUE(a.malloc(1, 64 * MiB, 2));
  EXPECT_EQ(a.stats().reserved.current, 64 * MiB);
}

TEST(AsyncPool, FollowEventDependenciesCanBeSwitchedOff) {
  SimDevice d(spec_of(1 * GiB));
  AsyncOptions o = no_opportunistic();
  o.reuse_follow_event_dependencies = false;
  AsyncPoolAllocator a(d, o, 0);
  ASSERT_TRUE(a.malloc(0, 64 * MiB, 0));
  a.free(0);
  a.stream_wait(1, 0);
  ASSERT_TRUE(a.malloc(1, 64 * MiB, 1));
  EXPECT_EQ(a.stats().reserved.current, 128 * MiB);
}

TEST(AsyncPool, OpportunisticReuseFollowsTheSeededCoin) {
  auto reserved_with = [](double p) {
    SimDevice d(spec_of(1 * GiB));
    AsyncOptions o = step2();
    o.opportunistic_probability = p;
    AsyncPoolAllocator a(d, o, 0);
    EXPECT_TRUE(a.malloc(0, 64 * MiB, 0));
    a.free(0);
    EXPECT_TRUE(a.malloc(1, 64 * MiB, 1));
    return a.stats().reserved.current;
  };
  EXPECT_EQ(reserved_with(1.0), 64 * MiB);   // the free always counts as complete
  EXPECT_EQ(reserved_with(0.0), 128 * MiB);  // never
}

TEST(AsyncPool, SameSeedSameTrace) {
  auto trace = [](std::uint64_t seed) {
    SimDevice d(spec_of(4 * GiB));
    AsyncPoolAllocator a(d, step2(), seed);
    std::vector<DeviceAddr> addrs;
    for (BlockKey k = 0; k < 64; ++k) {
      EXPECT_TRUE(a.malloc(k, (k % 7 + 1) * MiB, k % 3));
      addrs.push_back(addr_of(a, k));
      if (k % 2 == 1) a.free(k - 1);
    }
    addrs.push_back(a.stats().reserved.current);
    return addrs;
  };
  EXPECT_EQ(trace(42), trace(42));
  bool any_differs = false;  // the coin matters: some seed takes another path
  for (std::uint64_t s = 1; s < 16 && !any_differs; ++s) any_differs = trace(s) != trace(0);
  EXPECT_TRUE(any_differs);
}

TEST(AsyncPool, InternalDependenciesOnlyWhenThePoolCannotGrow) {
  auto run = [](bool internal) {
    SimDevice d(spec_of(64 * MiB));
    AsyncOptions o = no_opportunistic();
    o.reuse_allow_internal_dependencies = internal;
    AsyncPoolAllocator a(d, o, 0);
    EXPECT_TRUE(a.malloc(0, 64 * MiB, 0));
    a.free(0);
    const bool ok = a.malloc(1, 64 * MiB, 1);  // cannot grow: device full
    EXPECT_EQ(a.stats().num_alloc_retries, 0u);
    return ok;
  };
  EXPECT_TRUE(run(true));    // the driver inserts the wait and reuses stream 0's free
  EXPECT_FALSE(run(false));  // OOM
}

TEST(AsyncPool, RecordStreamFreesGoToTheUnifierStream) {
  SimDevice d(spec_of(1 * GiB));
  AsyncPoolAllocator a(d, no_opportunistic(), 0);
  ASSERT_TRUE(a.malloc(0, 64 * MiB, 0));
  a.record_stream(0, 1);
  a.free(0);
  ASSERT_TRUE(a.malloc(1, 64 * MiB, 0));  // not even the creation stream reuses it at once
  EXPECT_EQ(a.stats().reserved.current, 128 * MiB);
  a.free(1);
  a.synchronize();
  ASSERT_TRUE(a.malloc(2, 128 * MiB, 1));  // after a sync all of it merges and is reusable
  EXPECT_EQ(a.stats().reserved.current, 128 * MiB);
}

// ---- fragmentation and OOM --------------------------------------------------------------------

TEST(AsyncPool, FragmentationOomWithReservedMinusUsedMuchLargerThanTheRequest) {
  SimDevice d(spec_of(100 * MiB));
  AsyncPoolAllocator a(d, step2(), 0);
  for (BlockKey k = 0; k < 50; ++k) ASSERT_TRUE(a.malloc(k, 2 * MiB, 0));
  for (BlockKey k = 0; k < 50; k += 2) a.free(k);  // 25 scattered 2 MiB holes
  EXPECT_EQ(a.stats().reserved.current, 100 * MiB);
  EXPECT_EQ(a.stats().allocated.current, 50 * MiB);
  EXPECT_FALSE(a.malloc(100, 4 * MiB, 0));  // no 4 MiB hole, and the pool cannot grow
  EXPECT_EQ(a.stats().reserved.current - a.stats().allocated.current, 50 * MiB);
  EXPECT_EQ(a.stats().num_ooms, 1u);
  EXPECT_EQ(a.stats().num_alloc_retries, 0u);  // PyTorch raises at once
  ASSERT_TRUE(a.last_oom());
  EXPECT_NE(a.last_oom()->detail.find("reserved - used = 50.00 MiB"), std::string::npos);
  EXPECT_NE(a.last_oom()->detail.find("largest free range 2.00 MiB"), std::string::npos);
  a.synchronize();  // a sync does not defragment
  EXPECT_FALSE(a.malloc(100, 4 * MiB, 0));
  EXPECT_TRUE(a.malloc(100, 2 * MiB, 0));
}

TEST(AsyncPool, MemoryFractionLimitsRequestedBytes) {
  SimDevice d(spec_of(1 * GiB));
  AsyncOptions o = step2();
  o.memory_fraction = 0.5;
  AsyncPoolAllocator a(d, o, 0);
  ASSERT_TRUE(a.malloc(0, 500 * MiB, 0));
  EXPECT_FALSE(a.malloc(1, 20 * MiB, 0));
  EXPECT_EQ(d.charged(), 500 * MiB);
  ASSERT_TRUE(a.last_oom());
  EXPECT_NE(a.last_oom()->detail.find("per_process_memory_fraction"), std::string::npos);
  EXPECT_TRUE(a.malloc(1, 12 * MiB, 0));
}

// ---- stats ------------------------------------------------------------------------------------

TEST(AsyncPool, PeaksResetToCurrent) {
  SimDevice d(spec_of(1 * GiB));
  AsyncPoolAllocator a(d, step2(), 0);
  ASSERT_TRUE(a.malloc(0, 100 * MiB, 0));
  a.free(0);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.peak, 100 * MiB);
  EXPECT_EQ(a.stats().allocated.peak, 100 * MiB);
  a.reset_peak_stats();  // writing 0 to ReservedMemHigh / UsedMemHigh: peak = current
  EXPECT_EQ(a.stats().reserved.peak, 0u);
  ASSERT_TRUE(a.malloc(1, 10 * MiB, 0));
  EXPECT_EQ(a.stats().reserved.peak, 10 * MiB);
  EXPECT_EQ(a.stats().inactive_split.current, 0u);
}

TEST(AsyncPool, ZeroBytesAndMisuse) {
  SimDevice d(spec_of(1 * GiB));
  AsyncPoolAllocator a(d, step2(), 0);
  ASSERT_TRUE(a.malloc(0, 0, 0));
  EXPECT_EQ(a.stats().reserved.current, 0u);
  EXPECT_THROW(a.malloc(0, 8, 0), InfraError);
  a.free(0);
  EXPECT_THROW(a.free(0), InfraError);
  EXPECT_THROW(a.malloc(1, 8, kMaxAsyncStreams), InfraError);
}

TEST(AsyncPool, BuiltFromTheConfig) {
  SimDevice d(spec_of(1 * GiB));
  AllocatorConfig cfg;
  cfg.mode = AllocatorMode::async;
  cfg.options = {{"pool_granularity", "32MiB"}, {"release_threshold", "0"}};
  const auto a = make_allocator(cfg, d, 7);
  EXPECT_EQ(a->mode(), AllocatorMode::async);
  ASSERT_TRUE(a->malloc(0, 1, 0));
  EXPECT_EQ(a->stats().reserved.current, 32 * MiB);
}

// A free on an offload stream is reusable by that stream at once, by the compute stream only
// once it is ordered after the free (the async-offload lag attribution reports).
TEST(AsyncPool, FreesOfAnotherStreamAreHeldUntilAnEventEdgeOrASync) {
  SimDevice d(spec_of(1 * GiB));
  AsyncPoolAllocator a(d, no_opportunistic(), 0);
  ASSERT_TRUE(a.malloc(0, 64 * MiB, 1));
  ASSERT_TRUE(a.malloc(1, 10 * MiB, 0));
  a.free(0);
  EXPECT_EQ(a.held_for_other_streams(0, 0), 64 * MiB);
  EXPECT_EQ(a.held_for_other_streams(1, 0), 0u);
  ASSERT_TRUE(a.malloc(2, 32 * MiB, 0));  // cannot take stream 1's free: the pool grows
  EXPECT_EQ(a.stats().reserved.current, 64 * MiB + 10 * MiB + 32 * MiB);
  a.stream_wait(0, 1);  // the compute stream waits on the offload stream after its free
  EXPECT_EQ(a.held_for_other_streams(0, 0), 0u);
  a.free(2);
  EXPECT_EQ(a.held_for_other_streams(1, 0), 32 * MiB);
  a.synchronize();
  EXPECT_EQ(a.held_for_other_streams(1, 0), 0u);
  EXPECT_EQ(a.held_for_other_streams(7, 0), 0u);  // a stream that never allocated
}

// With a request, a withheld free range counts only where the run of adjacent free memory it
// lies in (whoever owns each part) is long enough for the request.
TEST(AsyncPool, ARequestCountsOnlyWithheldRangesInARunLongEnoughForIt) {
  SimDevice d(spec_of(1 * GiB));
  AsyncPoolAllocator a(d, no_opportunistic(), 0);
  // [0: 8 MiB s1][1: 4 MiB s0][2: 8 MiB s1][3: 2 MiB s0 live]: 22 MiB, all of the pool's mapped
  // memory (2 MiB chunks), then unmapped address space.
  ASSERT_TRUE(a.malloc(0, 8 * MiB, 1));
  ASSERT_TRUE(a.malloc(1, 4 * MiB, 0));
  ASSERT_TRUE(a.malloc(2, 8 * MiB, 1));
  ASSERT_TRUE(a.malloc(3, 2 * MiB, 0));
  EXPECT_EQ(a.stats().reserved.current, 22 * MiB);
  a.free(0);  // stream 1's
  a.free(2);  // stream 1's
  EXPECT_EQ(a.held_for_other_streams(0, 0), 16 * MiB);
  EXPECT_EQ(a.held_for_other_streams(0, 8 * MiB), 16 * MiB);  // each range holds 8 MiB by itself
  EXPECT_EQ(a.held_for_other_streams(0, 9 * MiB), 0u);        // a live 4 MiB block splits them
  a.free(1);  // stream 0's own 4 MiB between them: one run of 20 MiB
  EXPECT_EQ(a.held_for_other_streams(0, 20 * MiB), 16 * MiB);
  EXPECT_EQ(a.held_for_other_streams(0, 20 * MiB + 1), 0u);
  EXPECT_EQ(a.held_for_other_streams(1, 4 * MiB), 4 * MiB);   // stream 1 may not take stream 0's
  EXPECT_EQ(a.held_for_other_streams(1, 20 * MiB), 4 * MiB);  // its run reaches down and up: 20 MiB
  EXPECT_EQ(a.held_for_other_streams(1, 21 * MiB), 0u);
}

// A withheld range next to unmapped address space is where grow() would have put a larger
// request, mapping only the rest; and right after a malloc, the block it placed counts as the
// free and unmapped memory it was taken from.
TEST(AsyncPool, AWithheldRangeBesideUnmappedSpaceOrTheBlockJustPlacedCounts) {
  SimDevice d(spec_of(1 * GiB));
  {
    AsyncPoolAllocator a(d, no_opportunistic(), 0);
    ASSERT_TRUE(a.malloc(0, 2 * MiB, 0));
    ASSERT_TRUE(a.malloc(1, 8 * MiB, 1));  // [0: 2 MiB s0][1: 8 MiB s1], then unmapped
    a.free(1);
    EXPECT_EQ(a.stats().reserved.current, 10 * MiB);
    EXPECT_EQ(a.held_for_other_streams(0, 12 * MiB), 8 * MiB);  // 8 MiB there + 4 MiB mapped above
    ASSERT_TRUE(a.malloc(2, 12 * MiB, 0));  // stream 0 may not: the pool grows by 12 MiB
    EXPECT_EQ(a.stats().reserved.current, 22 * MiB);
    EXPECT_EQ(a.held_for_other_streams(0, 12 * MiB), 8 * MiB);  // still beside its new block
  }
  {
    AsyncPoolAllocator a(d, no_opportunistic(), 0);
    ASSERT_TRUE(a.malloc(0, 8 * MiB, 1));
    ASSERT_TRUE(a.malloc(1, 4 * MiB, 0));  // [0: 8 MiB s1][1: 4 MiB s0], 12 MiB mapped
    a.free(0);
    a.free(1);
    // Stream 0 asks 10 MiB: its own 4 MiB and the unmapped space above make the run grow()
    // places it on, at [8, 18) MiB, mapping 6 MiB. Measured after it, stream 1's 8 MiB below
    // is beside that block: with it, the request would have needed no new chunk.
    ASSERT_TRUE(a.malloc(2, 10 * MiB, 0));
    EXPECT_EQ(a.stats().reserved.current, 18 * MiB);
    EXPECT_EQ(a.held_for_other_streams(0, 10 * MiB), 8 * MiB);
    ASSERT_TRUE(a.malloc(3, 2 * MiB, 0));  // another malloc: the 10 MiB block is a tensor like any
    EXPECT_EQ(a.held_for_other_streams(0, 10 * MiB), 0u);
  }
}

}  // namespace
}  // namespace vf::sim

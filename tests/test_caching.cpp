// `caching`: PyTorch's native caching allocator, rule by rule with the numbers of
// cuda-allocators.md §1 (constants 1.1, rounding 1.2, pools 1.3, best fit 1.4, split/merge
// 1.5, the OOM ladder 1.6, knobs 1.7, streams 1.9, stats 1.10).
#include <gtest/gtest.h>

#include "harness/core/error.h"
#include "harness/sim/alloc_options.h"
#include "harness/sim/caching.h"
#include "tests/sim_test_util.h"

namespace vf::sim {
namespace {

using test::spec_of;
using test::addr_of;

RoundupDivisions all(std::uint32_t d) {
  RoundupDivisions t{};
  t.fill(d);
  return t;
}

// ---- §1.2 rounding -----------------------------------------------------------------------------

TEST(CachingRoundSize, PlainRoundingIs512Bytes) {
  const RoundupDivisions off{};
  EXPECT_EQ(round_size(1, off), 512u);
  EXPECT_EQ(round_size(512, off), 512u);
  EXPECT_EQ(round_size(513, off), 1024u);
  EXPECT_EQ(round_size(600, off), 1024u);
  EXPECT_EQ(round_size(1 * MiB + 1, off), 1 * MiB + 512);
}

TEST(CachingRoundSize, PowerOfTwoDivisions) {
  // The reference's example "1200 B with 4 divisions -> 1280 B" is the arithmetic of one step
  // (PyTorch's comment on roundup_power2_next_division). round_size itself applies divisions only
  // above 512 B x divisions = 2048 B, so a 1200 B request gets plain 512 B rounding: 1536 B.
  EXPECT_EQ(round_size(1200, all(4)), 1536u);
  // The same arithmetic one scale up, where round_size does use it: 1200 KiB lies in [1, 2) MiB,
  // whose 4 steps are 1, 1.25, 1.5, 1.75 MiB -> 1280 KiB (plain rounding would keep 1200 KiB).
  EXPECT_EQ(round_size(1200 * KiB, all(4)), 1280 * KiB);
  EXPECT_EQ(round_size(4097, all(4)), 5120u);        // steps of 1 KiB in [4, 8) KiB
  EXPECT_EQ(round_size(2048, all(4)), 2048u);        // not above 2048: plain
  EXPECT_EQ(round_size(64 * MiB, all(4)), 64 * MiB); // powers of two stay
  EXPECT_EQ(round_size(1200 * KiB, all(1)), 1200 * KiB);  // 1 division = off
}

TEST(CachingRoundSize, IntervalIndexStartsAtOneMiB) {
  EXPECT_EQ(roundup_interval(1000), 0u);
  EXPECT_EQ(roundup_interval(1 * MiB), 0u);
  EXPECT_EQ(roundup_interval(3 * MiB), 1u);
  EXPECT_EQ(roundup_interval(64 * MiB), 6u);
  EXPECT_EQ(roundup_interval(1 * GiB), 10u);
  EXPECT_EQ(roundup_interval(32 * GiB), 15u);
  EXPECT_EQ(roundup_interval(1024 * GiB), 15u);
}

TEST(CachingRoundSize, ListFormFromPyTorchsUnitTest) {
  // c10/core AllocatorConfig unit test: [128:8,256:16,512:1,2048:8,>:2]
  const RoundupDivisions t = parse_roundup_power2_divisions("[128:8,256:16,512:1,2048:8,>:2]", "f");
  EXPECT_EQ(t[roundup_interval(64 * MiB)], 8u);    // below the first key: copies it
  EXPECT_EQ(t[roundup_interval(128 * MiB)], 8u);
  EXPECT_EQ(t[roundup_interval(256 * MiB)], 16u);
  EXPECT_EQ(t[roundup_interval(512 * MiB)], 1u);
  EXPECT_EQ(t[roundup_interval(1 * GiB)], 0u);     // a gap stays 0
  EXPECT_EQ(t[roundup_interval(2 * GiB)], 8u);
  EXPECT_EQ(t[roundup_interval(4 * GiB)], 2u);     // '>' fills after the last key
  EXPECT_EQ(t[roundup_interval(64 * GiB)], 2u);
  // And what it does to sizes: 64 MiB + 1 with 8 divisions -> the next 8 MiB step.
  EXPECT_EQ(round_size(64 * MiB + 1, t), 72 * MiB);
  EXPECT_EQ(round_size(1 * GiB + 1, t), 1 * GiB + 512);  // 0 divisions: plain
}

// ---- §1.3 pools and segment sizes ------------------------------------------------------------

TEST(CachingAllocator, OneMiBPlusOneReservesA20MiBSegmentAndTheNextComesFromItsRemainder) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 1 * MiB + 1, 0));
  EXPECT_EQ(a.stats().reserved.current, 20 * MiB);             // large buffer segment
  EXPECT_EQ(a.stats().allocated.current, 1 * MiB + 512);       // rounded, split off
  EXPECT_EQ(a.stats().requested.current, 1 * MiB + 1);
  EXPECT_EQ(a.stats().inactive_split.current, 20 * MiB - (1 * MiB + 512));
  ASSERT_TRUE(a.malloc(1, 1 * MiB + 1, 0));
  EXPECT_EQ(a.stats().reserved.current, 20 * MiB);             // no new segment
  EXPECT_EQ(a.segment_count(), 1u);
  EXPECT_EQ(a.stats().num_device_alloc, 1u);
  EXPECT_EQ(addr_of(a, 1), addr_of(a, 0) + 1 * MiB + 512);
  EXPECT_EQ(d.charged(), 20 * MiB);
}

TEST(CachingAllocator, TenMiBGetsExactlyTenMiBReserved) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 10 * MiB, 0));
  EXPECT_EQ(a.stats().reserved.current, 10 * MiB);
  EXPECT_EQ(a.stats().allocated.current, 10 * MiB);
  EXPECT_EQ(a.stats().inactive_split.current, 0u);
  // One byte more rounds the segment to the next 2 MiB and the 2 MiB - 512 B rest is split off.
  ASSERT_TRUE(a.malloc(1, 10 * MiB + 1, 0));
  EXPECT_EQ(a.stats().reserved.current, 22 * MiB);
  EXPECT_EQ(a.stats().allocated.current, 20 * MiB + 512);
}

TEST(CachingAllocator, SixHundredBytesUseTheSmallPool) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 600, 0));
  EXPECT_EQ(a.stats().reserved.current, 2 * MiB);  // one small-pool segment
  EXPECT_EQ(a.stats().allocated.current, 1024u);   // 600 B rounded to 512 B multiples
  EXPECT_EQ(a.stats().requested.current, 600u);
  ASSERT_TRUE(a.malloc(1, 600, 0));
  EXPECT_EQ(addr_of(a, 1), addr_of(a, 0) + 1024);
  EXPECT_EQ(a.stats().reserved.current, 2 * MiB);
  // 1 MiB exactly is still small; a large request never takes small-pool space.
  ASSERT_TRUE(a.malloc(2, 1 * MiB, 0));
  EXPECT_EQ(a.stats().reserved.current, 2 * MiB);
  ASSERT_TRUE(a.malloc(3, 1 * MiB + 1, 0));
  EXPECT_EQ(a.stats().reserved.current, 22 * MiB);
}

// ---- §1.5 split rules -------------------------------------------------------------------------

TEST(CachingAllocator, LargeBlockIsNotSplitWhenTheRestIsAtMostOneMiB) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 19 * MiB + 512 * KiB, 0));  // segment rounds to 20 MiB, rest 0.5 MiB
  EXPECT_EQ(a.stats().reserved.current, 20 * MiB);
  EXPECT_EQ(a.stats().allocated.current, 20 * MiB);   // the slack counts as allocated
  EXPECT_EQ(a.stats().requested.current, 19 * MiB + 512 * KiB);
  a.free(0);
  // The cached 20 MiB block and a 19 MiB request: the rest is exactly 1 MiB, not more -> whole.
  ASSERT_TRUE(a.malloc(1, 19 * MiB, 0));
  EXPECT_EQ(a.stats().allocated.current, 20 * MiB);
  EXPECT_EQ(a.stats().reserved.current, 20 * MiB);
  a.free(1);
  // 512 B less leaves 1 MiB + 512 B: now it is split.
  ASSERT_TRUE(a.malloc(2, 19 * MiB - 512, 0));
  EXPECT_EQ(a.stats().allocated.current, 19 * MiB - 512);
  EXPECT_EQ(a.stats().inactive_split.current, 1 * MiB + 512);
}

TEST(CachingAllocator, SmallPoolSplitsDownTo512Bytes) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(1, 1 * MiB, 0));        // 1 MiB is still small: 2 MiB segment, 1 MiB rest
  ASSERT_TRUE(a.malloc(2, 1 * MiB - 512, 0));  // leaves exactly 512 B: the small pool keeps it
  EXPECT_EQ(a.stats().allocated.current, 2 * MiB - 512);
  ASSERT_TRUE(a.malloc(3, 512, 0));            // the last 512 B of the same segment
  EXPECT_EQ(addr_of(a, 3), addr_of(a, 1) + 2 * MiB - 512);
  EXPECT_EQ(a.stats().reserved.current, 2 * MiB);
}

TEST(CachingAllocator, FreeMergesWithFreeNeighboursOfTheSameSegment) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 4 * MiB, 0));
  ASSERT_TRUE(a.malloc(1, 4 * MiB, 0));
  ASSERT_TRUE(a.malloc(2, 4 * MiB, 0));  // one 20 MiB segment: 4 | 4 | 4 | 8 free
  EXPECT_EQ(a.stats().inactive_split.current, 8 * MiB);
  a.free(1);
  EXPECT_EQ(a.stats().inactive_split.current, 12 * MiB);
  a.free(0);  // merges with the middle
  a.free(2);  // merges both sides: the whole segment is one free block again
  EXPECT_EQ(a.stats().inactive_split.current, 0u);
  EXPECT_EQ(a.stats().active.current, 0u);
  ASSERT_TRUE(a.malloc(3, 20 * MiB, 0));  // best fit finds the whole 20 MiB
  EXPECT_EQ(a.stats().reserved.current, 20 * MiB);
  a.free(3);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 0u);
}

// ---- §1.3 / §1.4 same stream only --------------------------------------------------------------

TEST(CachingAllocator, CachedBlocksAreReusedOnlyOnTheirStream) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 30 * MiB, 0));
  a.free(0);
  ASSERT_TRUE(a.malloc(1, 30 * MiB, 1));  // stream 1 cannot use stream 0's cache
  EXPECT_EQ(a.stats().reserved.current, 60 * MiB);
  ASSERT_TRUE(a.malloc(2, 30 * MiB, 0));  // stream 0 can
  EXPECT_EQ(a.stats().reserved.current, 60 * MiB);
}

// ---- §1.9 record_stream ---------------------------------------------------------------------

TEST(CachingAllocator, RecordStreamDefersReuseUntilTheOtherStreamsWorkIsDone) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 4 * MiB, 0));
  const DeviceAddr first = addr_of(a, 0);
  a.record_stream(0, 1);
  a.free(0);
  EXPECT_EQ(a.pending_events(), 1u);
  EXPECT_EQ(a.stats().allocated.current, 0u);
  EXPECT_EQ(a.stats().active.current, 4 * MiB);  // active_awaiting_free
  ASSERT_TRUE(a.malloc(1, 4 * MiB, 0));
  EXPECT_NE(addr_of(a, 1), first);  // not reused: stream 1's work is not known to be done
  a.free(1);
  ASSERT_TRUE(a.malloc(2, 4 * MiB, 0));
  EXPECT_NE(addr_of(a, 2), first);  // still not: no sync happened
  a.synchronize();
  EXPECT_EQ(a.stats().active.current, 8 * MiB);  // noticed only by the next malloc
  ASSERT_TRUE(a.malloc(3, 4 * MiB, 0));
  EXPECT_EQ(addr_of(a, 3), first);  // reused once the events completed
  EXPECT_EQ(a.pending_events(), 0u);
}

TEST(CachingAllocator, RecordStreamOnTheAllocationStreamIsIgnored) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 4 * MiB, 2));
  a.record_stream(0, 2);
  a.free(0);
  EXPECT_EQ(a.pending_events(), 0u);
}

TEST(CachingAllocator, EventLagOptionCompletesEventsAfterNMallocs) {
  SimDevice d(spec_of(1 * GiB));
  CachingOptions o;
  o.event_lag_mallocs = 2;
  CachingAllocator a(d, o);
  ASSERT_TRUE(a.malloc(0, 4 * MiB, 0));
  const DeviceAddr first = addr_of(a, 0);
  a.record_stream(0, 1);
  a.free(0);
  ASSERT_TRUE(a.malloc(1, 4 * MiB, 0));  // 1st malloc after the free: pending
  ASSERT_TRUE(a.malloc(2, 4 * MiB, 0));  // 2nd: pending
  EXPECT_EQ(a.pending_events(), 1u);
  ASSERT_TRUE(a.malloc(3, 4 * MiB, 0));  // 3rd: complete, reused at once
  EXPECT_EQ(addr_of(a, 3), first);
}

TEST(CachingAllocator, EmptyCacheSyncsPendingEventsFirst) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 30 * MiB, 0));
  a.record_stream(0, 1);
  a.free(0);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 0u);
  EXPECT_EQ(a.stats().active.current, 0u);
  EXPECT_EQ(a.stats().requested.current, 0u);
}

// ---- §1.10 empty_cache ------------------------------------------------------------------------

TEST(CachingAllocator, EmptyCacheReleasesOnlyFullyFreeSegments) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 30 * MiB, 0));  // its own 30 MiB segment
  ASSERT_TRUE(a.malloc(1, 4 * MiB, 0));   // 20 MiB segment: 4 | 16
  ASSERT_TRUE(a.malloc(2, 4 * MiB, 0));   // 4 | 4 | 12
  a.free(0);
  a.free(1);
  EXPECT_EQ(a.stats().reserved.current, 50 * MiB);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 20 * MiB);  // the split segment stays
  EXPECT_EQ(a.segment_count(), 1u);
  EXPECT_EQ(a.stats().inactive_split.current, 16 * MiB);
  EXPECT_EQ(a.stats().num_device_free, 1u);
  EXPECT_EQ(d.charged(), 20 * MiB);
}

// ---- §1.6 the OOM ladder ----------------------------------------------------------------------

TEST(CachingAllocator, OomLadderFreesCachedSegmentsAndRetries) {
  SimDevice d(spec_of(64 * MiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 40 * MiB, 0));
  a.free(0);  // 40 MiB cached on stream 0
  ASSERT_TRUE(a.malloc(1, 30 * MiB, 1));  // cudaMalloc(30) fails, the cache is freed, retry works
  EXPECT_EQ(a.stats().num_alloc_retries, 1u);
  EXPECT_EQ(a.stats().num_ooms, 0u);
  EXPECT_EQ(a.stats().reserved.current, 30 * MiB);
  EXPECT_EQ(a.stats().num_device_free, 1u);
}

TEST(CachingAllocator, OomAfterTheRetryFails) {
  SimDevice d(spec_of(64 * MiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 30 * MiB, 0));  // 30 MiB segment
  ASSERT_TRUE(a.malloc(1, 4 * MiB, 0));   // 20 MiB segment: 4 | 16
  ASSERT_TRUE(a.malloc(2, 4 * MiB, 0));   // 4 | 4 | 12
  a.free(1);  // a free piece of a split segment: never released
  EXPECT_FALSE(a.malloc(3, 40 * MiB, 1));
  EXPECT_EQ(a.stats().num_alloc_retries, 1u);
  EXPECT_EQ(a.stats().num_ooms, 1u);
  EXPECT_EQ(a.stats().reserved.current, 50 * MiB);
  ASSERT_TRUE(a.last_oom());
  EXPECT_EQ(a.last_oom()->request, 40 * MiB);
  EXPECT_EQ(a.last_oom()->reserved, 50 * MiB);
  EXPECT_EQ(a.last_oom()->allocated, 34 * MiB);
  EXPECT_EQ(a.last_oom()->device_free, 14 * MiB);
  EXPECT_NE(a.last_oom()->detail.find("cudaMalloc(40.00 MiB)"), std::string::npos);
  EXPECT_NE(a.last_oom()->detail.find("16.00 MiB reserved but unallocated"), std::string::npos);
  std::vector<BlockView> live;
  a.live_blocks(live);
  EXPECT_EQ(live.size(), 2u);  // the failed key is not live
}

// ---- §1.4 / §1.7 max_split_size_mb ------------------------------------------------------------

TEST(CachingAllocator, OversizeRulesWithMaxSplit) {
  SimDevice d(spec_of(1 * GiB));
  CachingOptions o;
  o.max_split_size = 100 * MiB;
  CachingAllocator a(d, o);
  ASSERT_TRUE(a.malloc(0, 200 * MiB, 0));
  a.free(0);  // an oversize cached block
  ASSERT_TRUE(a.malloc(1, 50 * MiB, 0));  // below max_split: may not take it
  EXPECT_EQ(a.stats().reserved.current, 250 * MiB);
  a.free(1);
  ASSERT_TRUE(a.malloc(2, 190 * MiB, 0));  // 200 < 190 + 20: taken whole, unsplit
  EXPECT_EQ(a.stats().allocated.current, 200 * MiB);
  EXPECT_EQ(a.stats().reserved.current, 250 * MiB);
  a.free(2);
  ASSERT_TRUE(a.malloc(3, 150 * MiB, 0));  // 200 >= 150 + 20: too wasteful, new segment
  EXPECT_EQ(a.stats().reserved.current, 400 * MiB);
}

TEST(CachingAllocator, LadderRungOneReleasesOversizeBlocksWithoutCountingARetry) {
  SimDevice d(spec_of(300 * MiB));
  CachingOptions o;
  o.max_split_size = 100 * MiB;
  CachingAllocator a(d, o);
  ASSERT_TRUE(a.malloc(0, 200 * MiB, 0));
  a.free(0);
  ASSERT_TRUE(a.malloc(1, 150 * MiB, 0));  // refuses the 200 block, cudaMalloc fails, rung 1 frees it
  EXPECT_EQ(a.stats().num_alloc_retries, 0u);
  EXPECT_EQ(a.stats().reserved.current, 150 * MiB);
}

// ---- §1.7 memory fraction and garbage collection ---------------------------------------------

TEST(CachingAllocator, MemoryFractionLimitsReservedBeforeTouchingTheDevice) {
  SimDevice d(spec_of(1 * GiB));
  CachingOptions o;
  o.memory_fraction = 0.5;  // 512 MiB allowed
  CachingAllocator a(d, o);
  EXPECT_EQ(a.allowed_memory(), 512 * MiB);
  ASSERT_TRUE(a.malloc(0, 500 * MiB, 0));
  EXPECT_FALSE(a.malloc(1, 20 * MiB, 0));  // 500 + 20 > 512
  EXPECT_EQ(d.charged(), 500 * MiB);       // the device was never asked
  EXPECT_EQ(a.stats().num_ooms, 1u);
  ASSERT_TRUE(a.last_oom());
  EXPECT_NE(a.last_oom()->detail.find("per_process_memory_fraction"), std::string::npos);
  ASSERT_TRUE(a.malloc(2, 12 * MiB, 0));   // 500 + 12 = 512: allowed
}

TEST(CachingAllocator, GarbageCollectionFreesOldCachedBlocksAboveTheThreshold) {
  auto run = [](double gc) {
    SimDevice d(spec_of(1 * GiB));
    CachingOptions o;
    o.memory_fraction = 0.5;  // allowed 512 MiB
    o.garbage_collection_threshold = gc;  // 0.5: collect above 256 MiB reserved
    CachingAllocator a(d, o);
    EXPECT_TRUE(a.malloc(0, 300 * MiB, 0));
    a.free(0);
    EXPECT_TRUE(a.malloc(1, 100 * MiB, 1));  // a miss on stream 1 runs GC first
    return a.stats().reserved.current;
  };
  EXPECT_EQ(run(0.5), 100 * MiB);  // the cached 300 MiB was collected
  EXPECT_EQ(run(0.0), 400 * MiB);  // without GC it stays cached
}

// ---- §1.10 stats ------------------------------------------------------------------------------

TEST(CachingAllocator, PeaksAndReset) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 30 * MiB, 0));
  ASSERT_TRUE(a.malloc(1, 30 * MiB, 0));
  a.free(0);
  a.free(1);
  EXPECT_EQ(a.stats().allocated.peak, 60 * MiB);
  EXPECT_EQ(a.stats().reserved.peak, 60 * MiB);
  a.empty_cache();
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().reserved.peak, 0u);
  EXPECT_EQ(a.stats().allocated.peak, 0u);
  EXPECT_EQ(a.stats().num_device_alloc, 2u);
  EXPECT_EQ(a.stats().num_device_free, 2u);
}

TEST(CachingAllocator, ZeroBytesTakeNoMemory) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 0, 0));
  EXPECT_EQ(a.stats().reserved.current, 0u);
  a.record_stream(0, 1);
  a.free(0);
  EXPECT_THROW(a.free(0), InfraError);
}

TEST(CachingAllocator, MisuseIsAnInfrastructureError) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 10, 0));
  EXPECT_THROW(a.malloc(0, 10, 0), InfraError);
  EXPECT_THROW(a.free(9), InfraError);
  EXPECT_THROW(a.record_stream(9, 1), InfraError);
}

TEST(CachingAllocator, AbsurdRequestIsAnOomBeforeTheAllocator) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  EXPECT_FALSE(a.malloc(0, ~Bytes{0}, 0));
  // PyTorch's allocate() refuses it (OutOfMemoryError) without calling the allocator, whose OOM
  // count stays 0.
  EXPECT_EQ(a.stats().num_ooms, 0u);
  ASSERT_TRUE(a.last_oom());
  EXPECT_NE(a.last_oom()->detail.find("1 EiB or more"), std::string::npos) << a.last_oom()->detail;
}

// PyTorch 2026: `size < one_exa_bytes` or OutOfMemoryError, so 2^60 B itself is refused (the
// model refused only more than 2^60); a zero-byte request never reaches the allocator either.
// Neither looks at pending events: the block freed with a pending event stays out of the cache
// until a request that does reach the allocator.
TEST(CachingAllocator, ZeroByteAndExaByteRequestsDoNotProcessEvents) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 30 * MiB, 0));
  a.record_stream(0, 1);
  a.free(0);
  a.synchronize();  // the event is complete; the next process_events would return the block
  ASSERT_EQ(a.pending_events(), 1u);
  ASSERT_TRUE(a.malloc(1, 0, 0));
  EXPECT_EQ(a.pending_events(), 1u) << "a zero-byte request processed the events";
  EXPECT_FALSE(a.malloc(2, Bytes{1} << 60, 0));
  EXPECT_EQ(a.pending_events(), 1u) << "a refused 2^60 B request processed the events";
  EXPECT_EQ(a.stats().num_ooms, 0u);
  EXPECT_EQ(a.stats().allocated.current, 0u);
  // 2^60 - 512 is below the refusal: it reaches the allocator, processes the event, and OOMs in
  // the ladder like any request too large for the device.
  EXPECT_FALSE(a.malloc(3, (Bytes{1} << 60) - 512, 0));
  EXPECT_EQ(a.pending_events(), 0u);
  EXPECT_EQ(a.stats().num_ooms, 1u);
}

// PyTorch 2026 sets the limit to round(fraction x total) (earlier versions truncated). 1 GiB x f
// with f x 2^30 = 209,715,199.6 allows 209,715,200 B: exactly a 200 MiB segment, which the
// truncated limit (one byte less) refused.
TEST(CachingAllocator, MemoryFractionLimitIsRoundedNotTruncated) {
  SimDevice d(spec_of(1 * GiB));
  CachingOptions o;
  o.memory_fraction = 209715199.6 / static_cast<double>(GiB);
  CachingAllocator a(d, o);
  EXPECT_EQ(a.allowed_memory(), 200 * MiB);
  EXPECT_TRUE(a.malloc(0, 200 * MiB, 0));
  // 0.7 of 1 GiB: 751,619,276.8 -> 751,619,277 (docs/allocators.md).
  CachingOptions o7;
  o7.memory_fraction = 0.7;
  SimDevice d7(spec_of(1 * GiB));
  EXPECT_EQ(CachingAllocator(d7, o7).allowed_memory(), Bytes{751619277});
}

TEST(CachingAllocator, LargeSegmentSizeOption) {
  SimDevice d(spec_of(1 * GiB));
  CachingOptions o;
  o.large_segment_size = 12 * MiB;
  CachingAllocator a(d, o);
  ASSERT_TRUE(a.malloc(0, 2 * MiB, 0));
  EXPECT_EQ(a.stats().reserved.current, 12 * MiB);
}

TEST(CachingAllocator, BuiltFromTheConfig) {
  SimDevice d(spec_of(1 * GiB));
  AllocatorConfig cfg;
  cfg.mode = AllocatorMode::caching;
  cfg.options = {{"max_split_size_mb", "100"}};
  const auto a = make_allocator(cfg, d, 0);
  EXPECT_EQ(a->mode(), AllocatorMode::caching);
  const auto* c = dynamic_cast<const CachingAllocator*>(a.get());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->options().max_split_size, 100 * MiB);
}

}  // namespace
}  // namespace vf::sim

// ---- held for other streams (attribution's "other streams' frees", class B) ------------------

namespace vf::sim {
namespace {

TEST(CachingHeldForOtherStreams, CachedBlocksOfAnotherStreamAndPendingEventsAreHeld) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  ASSERT_TRUE(a.malloc(0, 64 * MiB, 1));  // an offload stream's transfer copy: its own 64 MiB segment
  ASSERT_TRUE(a.malloc(1, 30 * MiB, 0));  // the compute stream's conversion
  a.free(0);                              // cached in stream 1's pool
  EXPECT_EQ(a.held_for_other_streams(0, 0), 64 * MiB);  // the compute stream cannot reuse it
  EXPECT_EQ(a.held_for_other_streams(1, 0), 0u);        // its own stream can
  a.free(1);
  EXPECT_EQ(a.held_for_other_streams(1, 0), 30 * MiB);  // a 30 MiB block of the compute stream's 30 MiB segment
  // A block used on another stream (record_stream) waits for that stream's event: nobody may
  // reuse it until a malloc sees the event complete.
  ASSERT_TRUE(a.malloc(2, 20 * MiB, 0));  // reuses nothing of stream 1: the 30 MiB block splits
  a.record_stream(2, 1);
  a.free(2);
  EXPECT_EQ(a.held_for_other_streams(0, 0), 64 * MiB + 20 * MiB);
  a.synchronize();
  ASSERT_TRUE(a.malloc(3, 512, 0));  // process_events: the 20 MiB block is back in stream 0's pool
  EXPECT_EQ(a.held_for_other_streams(0, 0), 64 * MiB);
  a.empty_cache();
  EXPECT_EQ(a.held_for_other_streams(0, 0), 0u);
}

// With a request, only what that request could have taken had it been the stream's own: the
// origin of an "other streams' frees" diagnosis that was really segment-tail slack (a campaign's
// qwen-image case: 692 weights of 30.38 MiB, each in a 32 MiB segment of the compute stream,
// left 1.62 MiB tails that no 5.06 MiB transfer copy on the offload stream could use anyway).
TEST(CachingHeldForOtherStreams, ARequestCountsOnlyTheBlocksThatCouldHaveHeldIt) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a(d, {});
  // Three weights of 30 MiB + 384 KiB on the compute stream: each a 32 MiB segment (large
  // requests round up to 2 MiB) with a free tail of 1.625 MiB in stream 0's large pool.
  const Bytes weight = 30 * MiB + 384 * KiB;
  for (BlockKey k = 0; k < 3; ++k) ASSERT_TRUE(a.malloc(k, weight, 0));
  EXPECT_EQ(a.stats().reserved.current, 96 * MiB);
  const Bytes tail = 32 * MiB - weight;
  EXPECT_EQ(a.held_for_other_streams(1, 0), 3 * tail);            // every byte stream 1 cannot take
  EXPECT_EQ(a.held_for_other_streams(1, 5 * MiB + 64 * KiB), 0u);  // none would hold 5.06 MiB
  EXPECT_EQ(a.held_for_other_streams(1, tail), 3 * tail);         // each would hold exactly its size
  EXPECT_EQ(a.held_for_other_streams(1, tail + 1), 0u);           // 512 B-rounded: one byte more is too much
  EXPECT_EQ(a.held_for_other_streams(1, 512 * KiB), 0u);          // a small request: the small pool, empty
  EXPECT_EQ(a.held_for_other_streams(0, 1 * MiB + 1), 0u);        // its own stream: nothing held
  // A 64 MiB block freed on stream 1: a 5 MiB request of stream 0 could have split it.
  ASSERT_TRUE(a.malloc(3, 64 * MiB, 1));
  a.free(3);
  EXPECT_EQ(a.held_for_other_streams(0, 5 * MiB), 64 * MiB);
  EXPECT_EQ(a.held_for_other_streams(0, 64 * MiB), 64 * MiB);
  EXPECT_EQ(a.held_for_other_streams(0, 64 * MiB + 1), 0u);
  // A block waiting for another stream's event counts once, however many events it waits for.
  ASSERT_TRUE(a.malloc(4, 20 * MiB, 0));
  a.record_stream(4, 1);
  a.record_stream(4, 2);
  a.free(4);
  EXPECT_EQ(a.held_for_other_streams(0, 8 * MiB), 64 * MiB + 20 * MiB);
  EXPECT_EQ(a.held_for_other_streams(0, 32 * MiB), 64 * MiB);
}

// max_split_size_mb: a request below it never takes an oversize block, so another stream's
// oversize block is not held from it; an oversize request takes one within
// max_non_split_rounding (20 MiB by default) of its size.
TEST(CachingHeldForOtherStreams, TheOversizeRulesDecideWhatARequestCouldHaveTaken) {
  SimDevice d(spec_of(1 * GiB));
  CachingOptions o;
  o.max_split_size = 64 * MiB;
  CachingAllocator a(d, o);
  ASSERT_TRUE(a.malloc(0, 100 * MiB, 1));
  a.free(0);
  EXPECT_EQ(a.held_for_other_streams(0, 0), 100 * MiB);
  EXPECT_EQ(a.held_for_other_streams(0, 8 * MiB), 0u);     // below max_split: never an oversize block
  EXPECT_EQ(a.held_for_other_streams(0, 90 * MiB), 100 * MiB);  // wastes 10 MiB < 20 MiB
  EXPECT_EQ(a.held_for_other_streams(0, 80 * MiB), 0u);    // would waste exactly 20 MiB: refused
}

}  // namespace
}  // namespace vf::sim

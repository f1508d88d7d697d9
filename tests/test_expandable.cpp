// `caching-expandable` (expandable_segments:True, cuda-allocators.md §1.8, §7.4): one growable
// segment per (stream, pool), pages mapped for the rounded request, free tail reused first,
// 512 B splits, free pages unmapped on empty_cache and on the OOM ladder.
#include <gtest/gtest.h>

#include <memory>

#include "harness/sim/caching.h"
#include "tests/sim_test_util.h"

namespace vf::sim {
namespace {

using test::spec_of;
using test::addr_of;

CachingAllocator expandable(SimDevice& d) {
  CachingOptions o;
  o.expandable_segments = true;
  return CachingAllocator(d, o);
}

TEST(ExpandableSegments, BuiltFromTheModeOrTheOption) {
  SimDevice d(spec_of(1 * GiB));
  AllocatorConfig cfg;
  cfg.mode = AllocatorMode::caching_expandable;
  EXPECT_EQ(make_allocator(cfg, d, 0)->mode(), AllocatorMode::caching_expandable);
  cfg.mode = AllocatorMode::caching;
  cfg.options = {{"expandable_segments", "True"}};
  EXPECT_EQ(make_allocator(cfg, d, 0)->mode(), AllocatorMode::caching_expandable);
}

TEST(ExpandableSegments, GrowsInTwentyMiBPagesAndReusesTheFreeTail) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a = expandable(d);
  ASSERT_TRUE(a.malloc(0, 2 * MiB + 1, 0));  // large pool: one 20 MiB page
  EXPECT_EQ(a.stats().reserved.current, 20 * MiB);
  EXPECT_EQ(a.stats().allocated.current, 2 * MiB + 512);
  // 18 MiB does not fit the 18 MiB - 512 B tail: the tail is extended by one more page and the
  // block starts right where the first ended.
  ASSERT_TRUE(a.malloc(1, 18 * MiB, 0));
  EXPECT_EQ(a.stats().reserved.current, 40 * MiB);
  EXPECT_EQ(addr_of(a, 1), addr_of(a, 0) + 2 * MiB + 512);
  EXPECT_EQ(a.segment_count(), 1u);
  EXPECT_EQ(d.charged(), 40 * MiB);  // pages are charged exactly
  // What is left of the second page (20 MiB - 512 B) takes the next request without mapping.
  ASSERT_TRUE(a.malloc(2, 19 * MiB, 0));
  EXPECT_EQ(a.stats().reserved.current, 40 * MiB);
  EXPECT_EQ(addr_of(a, 2), addr_of(a, 1) + 18 * MiB);
}

TEST(ExpandableSegments, MapsForTheRoundedRequestNotTheSegmentSize) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a = expandable(d);
  ASSERT_TRUE(a.malloc(0, 30 * MiB, 0));  // native would cudaMalloc 30 MiB; here 2 pages
  EXPECT_EQ(a.stats().reserved.current, 40 * MiB);
  EXPECT_EQ(a.stats().allocated.current, 30 * MiB);
  ASSERT_TRUE(a.malloc(1, 12 * MiB, 0));  // 10 MiB tail + one more page
  EXPECT_EQ(a.stats().reserved.current, 60 * MiB);
  EXPECT_EQ(addr_of(a, 1), addr_of(a, 0) + 30 * MiB);
}

TEST(ExpandableSegments, SplitsAt512BytesInTheLargePoolToo) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a = expandable(d);
  // Native: a 20 MiB segment handed out whole (rest 1 MiB is not > 1 MiB). Expandable: split.
  ASSERT_TRUE(a.malloc(0, 19 * MiB, 0));
  EXPECT_EQ(a.stats().allocated.current, 19 * MiB);
  ASSERT_TRUE(a.malloc(1, 1 * MiB - 512 + 1, 1));  // small pool, other stream: own segment
  ASSERT_TRUE(a.malloc(2, 1 * MiB + 1, 0));        // large pool, rounded 1 MiB + 512 > 1 MiB tail
  EXPECT_EQ(addr_of(a, 2), addr_of(a, 0) + 19 * MiB);
  EXPECT_EQ(a.stats().inactive_split.current, 0u);  // PyTorch leaves expandable out of it
}

TEST(ExpandableSegments, SmallPoolPagesAreTwoMiB) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a = expandable(d);
  ASSERT_TRUE(a.malloc(0, 600, 0));
  EXPECT_EQ(a.stats().reserved.current, 2 * MiB);
  EXPECT_EQ(a.stats().allocated.current, 1024u);
  ASSERT_TRUE(a.malloc(1, 1 * MiB, 0));
  ASSERT_TRUE(a.malloc(2, 1 * MiB, 0));  // 1 MiB - 1024 B of tail left: one more 2 MiB page
  EXPECT_EQ(a.stats().reserved.current, 4 * MiB);
  EXPECT_EQ(addr_of(a, 2), addr_of(a, 1) + 1 * MiB);
}

TEST(ExpandableSegments, EmptyCacheUnmapsFreePagesOnly) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a = expandable(d);
  for (BlockKey k = 0; k < 3; ++k) ASSERT_TRUE(a.malloc(k, 20 * MiB, 0));  // one page each
  EXPECT_EQ(a.stats().reserved.current, 60 * MiB);
  a.free(1);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 40 * MiB);  // the middle page is unmapped
  EXPECT_EQ(d.charged(), 40 * MiB);
  // The hole is mapped again for the next request that fits it (lowest address first).
  ASSERT_TRUE(a.malloc(3, 20 * MiB, 0));
  EXPECT_EQ(a.stats().reserved.current, 60 * MiB);
  for (BlockKey k : {0u, 2u, 3u}) a.free(k);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 0u);
  EXPECT_EQ(a.segment_count(), 0u);  // the VA of an entirely unmapped segment is given back
}

TEST(ExpandableSegments, PartlyUsedPagesStayMapped) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a = expandable(d);
  ASSERT_TRUE(a.malloc(0, 10 * MiB, 0));  // one 20 MiB page, 10 MiB free tail inside it
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved.current, 20 * MiB);
  ASSERT_TRUE(a.malloc(1, 25 * MiB, 0));  // 10 MiB tail + 20 MiB page... needs 15 more: 1 page
  EXPECT_EQ(a.stats().reserved.current, 40 * MiB);
  a.free(0);
  a.empty_cache();  // [0,10) free inside page 0 which block 1 also uses: stays
  EXPECT_EQ(a.stats().reserved.current, 40 * MiB);
}

TEST(ExpandableSegments, OomLadderUnmapsFreePagesOfOtherStreams) {
  SimDevice d(spec_of(60 * MiB));
  CachingAllocator a = expandable(d);
  ASSERT_TRUE(a.malloc(0, 40 * MiB, 0));
  a.free(0);  // 40 MiB mapped, free, on stream 0's segment
  ASSERT_TRUE(a.malloc(1, 40 * MiB, 1));  // stream 1's own segment; mapping fails until the ladder unmaps
  EXPECT_EQ(a.stats().num_alloc_retries, 1u);
  EXPECT_EQ(a.stats().num_ooms, 0u);
  EXPECT_EQ(a.stats().reserved.current, 40 * MiB);
  EXPECT_FALSE(a.malloc(2, 40 * MiB, 0));  // now really out of memory
  EXPECT_EQ(a.stats().num_ooms, 1u);
  EXPECT_EQ(d.charged(), 40 * MiB);       // a failed request maps nothing
}

TEST(ExpandableSegments, StreamsGetSeparateSegments) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a = expandable(d);
  ASSERT_TRUE(a.malloc(0, 1 * MiB + 1, 0));
  ASSERT_TRUE(a.malloc(1, 1 * MiB + 1, 1));
  EXPECT_EQ(a.stats().reserved.current, 40 * MiB);
  EXPECT_EQ(a.segment_count(), 2u);
  // VA per segment: 1.125 x 1 GiB = 1152 MiB, rounded to whole 20 MiB pages = 1160 MiB.
  EXPECT_EQ(addr_of(a, 1) - addr_of(a, 0), 1160 * MiB);
}

TEST(ExpandableSegments, MemoryFractionUsesTheNativeSegmentSize) {
  SimDevice d(spec_of(1 * GiB));
  CachingOptions o;
  o.expandable_segments = true;
  o.memory_fraction = 0.05;  // 51.2 MiB allowed
  CachingAllocator a(d, o);
  ASSERT_TRUE(a.malloc(0, 40 * MiB, 0));   // reserved 0 + alloc_size 40 <= 51.2: maps 2 pages
  EXPECT_FALSE(a.malloc(1, 12 * MiB, 0));  // reserved 40 + alloc_size 12 > 51.2
  EXPECT_EQ(a.stats().num_ooms, 1u);
}

// Other streams' frees with expandable segments: a free block at the end of its segment can grow
// into the unmapped address space after it, so it could have held a request larger than itself
// had it been the asking stream's (held_for_other_streams with a request).
TEST(ExpandableSegments, AFreeTailThatCouldGrowIsHeldFromALargerRequest) {
  SimDevice d(spec_of(1 * GiB));
  CachingAllocator a = expandable(d);
  ASSERT_TRUE(a.malloc(0, 15 * MiB, 1));  // one 20 MiB page of stream 1's segment: a 5 MiB free tail
  EXPECT_EQ(a.stats().reserved.current, 20 * MiB);
  EXPECT_EQ(a.held_for_other_streams(0, 0), 5 * MiB);
  EXPECT_EQ(a.held_for_other_streams(0, 4 * MiB), 5 * MiB);   // the tail itself would do
  EXPECT_EQ(a.held_for_other_streams(0, 25 * MiB), 5 * MiB);  // the tail and one more page
  EXPECT_EQ(a.held_for_other_streams(1, 25 * MiB), 0u);       // its own stream's
  ASSERT_TRUE(a.malloc(1, 25 * MiB, 0));  // stream 0 maps two pages of its own segment
  EXPECT_EQ(a.stats().reserved.current, 60 * MiB);
}

}  // namespace
}  // namespace vf::sim

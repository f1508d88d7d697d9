// `raw`: every tensor is its own cudaMalloc / cudaFree (PYTORCH_NO_CUDA_MEMORY_CACHING=1).
#include <gtest/gtest.h>

#include "harness/core/error.h"
#include "harness/sim/raw.h"
#include "tests/sim_test_util.h"

namespace vf::sim {
namespace {

using test::spec_of;

TEST(RawAllocator, OneByteReservesAPage) {
  SimDevice d(spec_of(1 * GiB));
  RawAllocator a(d);
  ASSERT_TRUE(a.malloc(0, 1, 0));
  EXPECT_EQ(a.stats().requested.current, 1u);
  EXPECT_EQ(a.stats().allocated.current, 512u);
  EXPECT_EQ(a.stats().reserved.current, 2 * MiB);
  a.free(0);
  EXPECT_EQ(a.stats().allocated.current, 0u);
  EXPECT_EQ(a.stats().reserved.current, 0u);
  EXPECT_EQ(a.stats().reserved.peak, 2 * MiB);
}

TEST(RawAllocator, TwoMiBPlusOneReservesFourMiB) {
  SimDevice d(spec_of(1 * GiB));
  RawAllocator a(d);
  ASSERT_TRUE(a.malloc(0, 2 * MiB + 1, 0));
  EXPECT_EQ(a.stats().allocated.current, 2 * MiB + 512);
  EXPECT_EQ(a.stats().reserved.current, 4 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 1u);
  std::vector<BlockView> live;
  a.live_blocks(live);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].size, 2 * MiB + 512);
  EXPECT_EQ(live[0].requested, 2 * MiB + 1);
  a.free(0);  // both pages go back
  EXPECT_EQ(a.stats().allocated.current, 0u);
  EXPECT_EQ(a.stats().reserved.current, 0u);
  EXPECT_EQ(d.charged(), 0u);
}

// A zero-byte request still takes cudaMalloc's 512 B and is a live block until freed.
TEST(RawAllocator, AZeroByteRequestTakes512Bytes) {
  SimDevice d(spec_of(1 * GiB));
  RawAllocator a(d);
  ASSERT_TRUE(a.malloc(0, 0, 2));
  ASSERT_TRUE(a.malloc(1, 0, 0));
  EXPECT_EQ(a.stats().allocated.current, 1024u);
  EXPECT_EQ(a.stats().requested.current, 0u);
  std::vector<BlockView> live;
  a.live_blocks(live);
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0].size, 512u);
  EXPECT_EQ(live[0].stream, 2u);
  EXPECT_EQ(live[1].addr, live[0].addr + 512);
  a.free(0);
  EXPECT_THROW(a.free(0), InfraError);  // freed once
  a.free(1);
  EXPECT_EQ(a.stats().allocated.current, 0u);
  EXPECT_EQ(d.charged(), 0u);
}

TEST(RawAllocator, SmallTensorsShareAPageUntilTheLastIsFreed) {
  SimDevice d(spec_of(1 * GiB));
  RawAllocator a(d);
  for (BlockKey k = 0; k < 3; ++k) ASSERT_TRUE(a.malloc(k, 1000, 0));
  EXPECT_EQ(a.stats().allocated.current, 3 * 1024u);
  EXPECT_EQ(a.stats().reserved.current, 2 * MiB);
  a.free(0);
  a.free(1);
  EXPECT_EQ(a.stats().reserved.current, 2 * MiB);
  a.free(2);
  EXPECT_EQ(a.stats().reserved.current, 0u);
  EXPECT_EQ(a.stats().num_device_free, 3u);
}

TEST(RawAllocator, OutOfMemoryIsReportedNotThrown) {
  SimDevice d(spec_of(8 * MiB));
  RawAllocator a(d);
  ASSERT_TRUE(a.malloc(0, 6 * MiB, 0));
  EXPECT_FALSE(a.malloc(1, 4 * MiB, 0));
  EXPECT_EQ(a.stats().num_ooms, 1u);
  EXPECT_EQ(a.stats().num_alloc_retries, 0u);
  ASSERT_TRUE(a.last_oom());
  EXPECT_EQ(a.last_oom()->request, 4 * MiB);
  EXPECT_EQ(a.last_oom()->device_free, 2 * MiB);
  EXPECT_TRUE(a.malloc(1, 2 * MiB, 0));  // the key is reusable after a failed malloc
}

TEST(RawAllocator, LiveBlocksAndPeaks) {
  SimDevice d(spec_of(1 * GiB));
  RawAllocator a(d);
  ASSERT_TRUE(a.malloc(3, 3 * MiB, 1));
  ASSERT_TRUE(a.malloc(5, 100, 0));
  std::vector<BlockView> live;
  a.live_blocks(live);
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0].key, 3u);
  EXPECT_EQ(live[0].stream, 1u);
  EXPECT_EQ(live[0].requested, 3 * MiB);
  a.free(3);
  EXPECT_EQ(a.stats().reserved.peak, 6 * MiB);  // 4 MiB of pages + one small page
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().reserved.peak, 2 * MiB);  // PyTorch semantics: peak = current
}

TEST(RawAllocator, MisuseIsAnInfrastructureError) {
  SimDevice d(spec_of(1 * GiB));
  RawAllocator a(d);
  ASSERT_TRUE(a.malloc(0, 10, 0));
  EXPECT_THROW(a.malloc(0, 10, 0), InfraError);
  EXPECT_THROW(a.free(7), InfraError);
  EXPECT_THROW(a.malloc(1, 10, 70000), InfraError);  // no stream that high exists
}

TEST(RawAllocator, TakesNoOptions) {
  SimDevice d(spec_of(1 * GiB));
  AllocatorConfig cfg;
  cfg.mode = AllocatorMode::raw;
  EXPECT_EQ(make_allocator(cfg, d, 0)->mode(), AllocatorMode::raw);
  cfg.options = {{"max_split_size_mb", "100"}};
  try {
    make_allocator(cfg, d, 0);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "allocator.options.max_split_size_mb");
  }
}

}  // namespace
}  // namespace vf::sim

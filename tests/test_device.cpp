// SimDevice: the driver layer below every allocator (cuda-allocators.md §3.2, §7.1-7.2).
#include <gtest/gtest.h>

#include "harness/sim/device.h"

namespace vf::sim {
namespace {

DeviceSpec spec_of(Bytes total, Bytes others = 0, Bytes context = 0) {
  DeviceSpec s;
  s.total = total;
  s.used_by_others = others;
  s.context_overhead = context;
  return s;
}

TEST(SimDevice, CapacityIsTotalMinusOthersMinusContext) {
  const SimDevice d(spec_of(24 * GiB, 1 * GiB, 300 * MiB));
  EXPECT_EQ(d.capacity(), 24 * GiB - 1 * GiB - 300 * MiB);
  EXPECT_EQ(d.free(), d.capacity());
  EXPECT_EQ(d.device_used(), 1 * GiB + 300 * MiB);  // NVML view before our first byte
  const SimDevice crowded(spec_of(1 * GiB, 2 * GiB, 0));
  EXPECT_EQ(crowded.capacity(), 0u);  // saturates, never wraps
}

TEST(SimDevice, OneByteIsChargedAWholePage) {
  SimDevice d(spec_of(1 * GiB));
  const auto a = d.cuda_malloc(1);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->size, 512u);           // 512 B spacing
  EXPECT_EQ(d.charged(), 2 * MiB);    // the first small buffer opens a 2 MiB page
}

TEST(SimDevice, LargeBuffersAreChargedInWholePages) {
  SimDevice d(spec_of(1 * GiB));
  const auto two = d.cuda_malloc(2 * MiB);
  ASSERT_TRUE(two);
  EXPECT_EQ(two->charge, 2 * MiB);
  EXPECT_EQ(d.charged(), 2 * MiB);
  const auto over = d.cuda_malloc(2 * MiB + 1);
  ASSERT_TRUE(over);
  EXPECT_EQ(over->charge, 4 * MiB);  // 2 MiB + 1 B costs two pages
  EXPECT_EQ(d.charged(), 6 * MiB);
  EXPECT_EQ(over->addr % kDevicePage, 0u);
  EXPECT_GE(over->addr, two->addr + 2 * MiB);  // no overlap
  d.cuda_free(*over);
  EXPECT_EQ(d.charged(), 2 * MiB);
}

TEST(SimDevice, SmallBuffersArePackedIntoSharedPages) {
  SimDevice d(spec_of(1 * GiB));
  const auto a = d.cuda_malloc(1000);
  const auto b = d.cuda_malloc(1000);
  const auto c = d.cuda_malloc(1 * MiB);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(b->addr, a->addr + 1024);  // 1000 B rounds to 1024 B, packed back to back
  EXPECT_EQ(c->addr, b->addr + 1024);
  EXPECT_EQ(d.charged(), 2 * MiB);     // all three share one page
  const auto e = d.cuda_malloc(1 * MiB);  // 2048 B + 1 MiB used: 1 MiB more does not fit
  ASSERT_TRUE(e);
  EXPECT_EQ(d.charged(), 4 * MiB);
}

TEST(SimDevice, PageIsReleasedWhenItsLastBlockIsFreed) {
  SimDevice d(spec_of(1 * GiB));
  const auto a = d.cuda_malloc(4096);
  const auto b = d.cuda_malloc(4096);
  ASSERT_TRUE(a && b);
  d.cuda_free(*a);
  EXPECT_EQ(d.charged(), 2 * MiB);  // b still lives in the page
  d.cuda_free(*b);
  EXPECT_EQ(d.charged(), 0u);
  EXPECT_EQ(d.peak_charged(), 2 * MiB);
  const auto c = d.cuda_malloc(4096);  // a fresh page again
  ASSERT_TRUE(c);
  EXPECT_EQ(d.charged(), 2 * MiB);
}

TEST(SimDevice, FailsWhenThePagesDoNotFit) {
  SimDevice d(spec_of(10 * MiB));
  ASSERT_TRUE(d.cuda_malloc(8 * MiB));
  EXPECT_FALSE(d.cuda_malloc(2 * MiB + 1));  // needs 4 MiB, 2 MiB free
  EXPECT_EQ(d.charged(), 8 * MiB);          // a failed call charges nothing
  EXPECT_TRUE(d.cuda_malloc(2 * MiB));
  EXPECT_FALSE(d.cuda_malloc(1));           // no page left for a small buffer either
  EXPECT_FALSE(d.cuda_malloc(~Bytes{0}));   // absurd sizes fail, never wrap
}

TEST(SimDevice, MappedPagesAreChargedExactly) {
  SimDevice d(spec_of(100 * MiB));
  const DeviceAddr va1 = d.reserve_address_range(45 * MiB);
  const DeviceAddr va2 = d.reserve_address_range(10 * MiB);
  EXPECT_GE(va2, va1 + 45 * MiB);  // reservations never overlap
  EXPECT_EQ(d.charged(), 0u);      // address space costs no memory
  EXPECT_TRUE(d.map(60 * MiB));
  EXPECT_EQ(d.charged(), 60 * MiB);
  EXPECT_FALSE(d.map(60 * MiB));
  d.unmap(20 * MiB);
  EXPECT_EQ(d.charged(), 40 * MiB);
  EXPECT_EQ(d.peak_charged(), 60 * MiB);
  EXPECT_EQ(d.device_used(), 40 * MiB);
}

}  // namespace
}  // namespace vf::sim

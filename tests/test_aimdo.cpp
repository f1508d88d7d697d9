// The aimdo layer (harness/sim/aimdo.h) with the reference's numbers: VBAR caps, the ledger's
// rounding, eviction order, the hooks' two-step eviction, the 2 s poll, cast buffers.
#include <gtest/gtest.h>

#include "harness/sim/aimdo.h"
#include "harness/sim/device.h"

namespace vf::sim {
namespace {

DeviceSpec card(Bytes total) {
  DeviceSpec d;
  d.total = total;
  d.context_overhead = 0;
  return d;
}

std::uint64_t resident_pages(const Aimdo& a, std::uint32_t v) { return a.loaded_size(v) / kVbarPage; }

// A VBAR of `pages` pages, all mapped (one page per fault: each passes the miss check) and unpinned.
std::uint32_t map_unpinned(Aimdo& a, std::uint64_t pages) {
  const std::uint32_t v = a.vbar_allocate(pages * kVbarPage);
  for (std::uint64_t p = 0; p < pages; ++p) {
    EXPECT_EQ(a.fault(v, p * kVbarPage, kVbarPage), FaultResult::mapped) << p;
    a.unpin(v, p * kVbarPage, kVbarPage);
  }
  return v;
}

TEST(Aimdo, AVbarOnA24GiBCardIsCappedAt768PagesOf32MiB) {
  // ModelPatcherDynamic asks for 10 x the model: the FLUX.2 text encoder (17180.60 MiB) asks for
  // 171805.96 MiB; aimdo grants floor(24 GiB / 32 MiB) = 768 pages.
  const Bytes te = 18015012864ull;  // 17180.60 MiB
  EXPECT_EQ(vbar_pages_for(te * kVbarRequestFactor, 24 * GiB), 768u);
  EXPECT_EQ(vbar_pages_for(100 * MiB, 24 * GiB), 4u);  // under the cap: rounded up to whole pages
  SimDevice dev(card(24 * GiB));
  const std::uint64_t now = 0;
  Aimdo a(24 * GiB, DynamicConstants{}, dev, now);
  const std::uint32_t v = a.vbar_allocate(te * kVbarRequestFactor);
  EXPECT_EQ(a.nr_pages(v), 768u);
  EXPECT_EQ(a.watermark(v), 768u);
}

TEST(Aimdo, TheLedgerBooksA1KiBFloorExactSizesAndWhole2MiBPagesAbove1MiB) {
  EXPECT_EQ(aimdo_accounted(1, false), 1 * KiB);
  EXPECT_EQ(aimdo_accounted(1 * KiB, false), 1 * KiB);
  EXPECT_EQ(aimdo_accounted(1 * KiB + 1, false), 1 * KiB + 1);
  EXPECT_EQ(aimdo_accounted(1 * MiB, false), 1 * MiB);
  EXPECT_EQ(aimdo_accounted(1 * MiB + 1, false), 2 * MiB);
  EXPECT_EQ(aimdo_accounted(3 * MiB, false), 4 * MiB);
  // aimdo 0.2.2 (feb2026): everything in 2 MiB pages.
  EXPECT_EQ(aimdo_accounted(1, true), 2 * MiB);
  EXPECT_EQ(aimdo_accounted(3 * MiB, true), 4 * MiB);
}

// A 1 GiB card with aimdo's 256 MiB headroom: 768 MiB (24 pages) of budget.
struct SmallCard {
  SimDevice dev{card(1 * GiB)};
  std::uint64_t now = 0;
  Aimdo a{1 * GiB, DynamicConstants{}, dev, now};
};

TEST(Aimdo, AFaultWithoutBudgetEvictsTheLowestPriorityPagesFromTheTopDownSkippingPinnedOnes) {
  SmallCard c;
  Aimdo& a = c.a;
  const std::uint32_t low = a.vbar_allocate(16 * kVbarPage);
  const std::uint32_t high = a.vbar_allocate(16 * kVbarPage);  // allocated last: the top of the list
  // The low-priority model holds pages 0..11, with 10 and 11 still pinned (a layer in flight).
  ASSERT_EQ(a.fault(low, 0, 12 * kVbarPage), FaultResult::mapped);
  a.unpin(low, 0, 10 * kVbarPage);
  EXPECT_EQ(a.pinned_bytes(), 2 * kVbarPage);
  EXPECT_EQ(a.ledger(), 384 * MiB);
  // The high-priority model faults 8 pages (256 MiB). Surplus: 1024 - (384 + 256 + 256) = 128 MiB,
  // which skips 4 of its absent pages; the other 4 must be evicted: the low VBAR's watermark
  // steps down over its absent top pages 15..12, over the pinned 11 and 10 (kept), and frees 9,
  // 8, 7 and 6.
  std::uint32_t mapped = 0;
  ASSERT_EQ(a.fault(high, 0, 8 * kVbarPage, &mapped), FaultResult::mapped);
  EXPECT_EQ(mapped, 8u);
  EXPECT_EQ(a.stats().pages_evicted, 4u);
  EXPECT_EQ(resident_pages(a, low), 8u);  // 0..5 and the pinned 10, 11
  for (std::uint64_t p : {6u, 7u, 8u, 9u}) EXPECT_FALSE(a.mapped(low, p)) << p;
  for (std::uint64_t p : {0u, 5u, 10u, 11u}) EXPECT_TRUE(a.mapped(low, p)) << p;
  EXPECT_EQ(a.watermark(low), 6u);
  EXPECT_EQ(a.ledger(), 512 * MiB);
  // Unpinned, the pages the watermark passed are freed at once.
  a.unpin(low, 10 * kVbarPage, 2 * kVbarPage);
  EXPECT_EQ(resident_pages(a, low), 6u);
  // A slice above the watermark is refused without mapping anything.
  EXPECT_EQ(a.fault(low, 6 * kVbarPage, kVbarPage), FaultResult::refused);
  EXPECT_EQ(a.stats().faults_above_watermark, 1u);
  // prioritize resets the watermark: the slice can fault again.
  a.prioritize(low);
  EXPECT_EQ(a.watermark(low), 16u);
  EXPECT_EQ(a.fault(low, 6 * kVbarPage, kVbarPage), FaultResult::mapped);
}

TEST(Aimdo, AResidentSliceFaultsWithoutMappingAndKeepsItsSerials) {
  SmallCard c;
  const std::uint32_t v = c.a.vbar_allocate(4 * kVbarPage);
  ASSERT_EQ(c.a.fault(v, 0, 2 * kVbarPage), FaultResult::mapped);
  const std::uint32_t s0 = c.a.serial(v, 0);
  c.a.unpin(v, 0, 2 * kVbarPage);
  EXPECT_EQ(c.a.fault(v, 0, 2 * kVbarPage), FaultResult::resident);
  EXPECT_EQ(c.a.serial(v, 0), s0);
  c.a.unpin(v, 0, 2 * kVbarPage);
  // Evicted (partially_unload: from the top, lowering the watermark to the bottom) and faulted
  // again once the model is prioritized (its next load): a new serial, so a module can tell its
  // copy is gone.
  EXPECT_EQ(c.a.free_memory(v, 4 * kVbarPage), 2 * kVbarPage);
  EXPECT_EQ(c.a.loaded_size(v), 0u);
  EXPECT_EQ(c.a.watermark(v), 0u);
  EXPECT_EQ(c.a.fault(v, 0, kVbarPage), FaultResult::refused);
  c.a.prioritize(v);
  ASSERT_EQ(c.a.fault(v, 0, kVbarPage), FaultResult::mapped);
  EXPECT_NE(c.a.serial(v, 0), s0);
}

TEST(Aimdo, AMissIsMappedOnlyWithASurplusOfItsPagesAgainOrAfterEvictingTheDifference) {
  // vbar_fault's miss check (aimdo 2026-06-05): the surplus is what the simple term leaves after
  // the miss (capacity - ledger - headroom - the pages from the first absent one to the end), and
  // the cursor then needs one 32 MiB of surplus, or one eviction, per absent page below the end:
  // with nothing else to evict, a miss fits only in half the free budget.
  SmallCard c;  // 24 pages of budget
  const std::uint32_t v = c.a.vbar_allocate(16 * kVbarPage);
  EXPECT_EQ(c.a.fault(v, 0, 12 * kVbarPage), FaultResult::mapped);  // 24 - 12 = 12 pages of surplus: enough
  SmallCard d;
  const std::uint32_t w = d.a.vbar_allocate(16 * kVbarPage);
  // 13 pages: 11 of surplus, 2 short. The only pages to evict are the VBAR's own absent top
  // pages: its watermark steps down to 11 and the fault is refused (the module is cast through a
  // buffer, and the pages above 11 stay refused until the model's next load prioritizes it).
  EXPECT_EQ(d.a.fault(w, 0, 13 * kVbarPage), FaultResult::refused);
  EXPECT_EQ(d.a.watermark(w), 11u);
  EXPECT_EQ(d.a.loaded_size(w), 0u);
}

TEST(Aimdo, TheCudaMallocHookEvictsTheDeficitOfRequestPlus128MiBThenRequestPlus128MiBAfterAFailureAndRetriesOnce) {
  SmallCard c;
  Aimdo& a = c.a;
  const std::uint32_t v = map_unpinned(a, 20);
  ASSERT_EQ(a.ledger(), 640 * MiB);
  std::vector<std::uint64_t> resident_at_call;
  int calls = 0;
  const bool ok = a.hook_cuda_malloc(100 * MiB, [&] {
    resident_at_call.push_back(resident_pages(a, v));
    return ++calls == 2;  // the driver fails the first time
  });
  ASSERT_TRUE(ok);
  EXPECT_EQ(calls, 2);
  // Before the first try: deficit(228 MiB) = max(640 + 228 + 256 - 1024, (256 - 384) + 0 + 228)
  // = 100 MiB -> 4 pages. After the failure: 228 MiB -> 8 more.
  ASSERT_EQ(resident_at_call.size(), 2u);
  EXPECT_EQ(resident_at_call[0], 16u);
  EXPECT_EQ(resident_at_call[1], 8u);
  EXPECT_EQ(a.ledger(), 8 * kVbarPage + 100 * MiB);  // the pages left and the booked request
  EXPECT_EQ(a.stats().hook_retries, 1u);
  // A driver that fails both times: the torch OOM.
  EXPECT_FALSE(a.hook_cuda_malloc(1 * MiB, [] { return false; }));
  a.hook_free(100 * MiB);
  EXPECT_EQ(a.ledger(), a.loaded_size(v));
}

TEST(Aimdo, TheAsyncHookEvictsWithoutThe128MiB) {
  SmallCard c;
  Aimdo& a = c.a;
  const std::uint32_t v = map_unpinned(a, 20);
  int calls = 0;
  ASSERT_TRUE(a.hook_malloc_async(100 * MiB, [&] { return ++calls == 2; }));
  // deficit(100 MiB) = max(640 + 100 + 256 - 1024, -128 + 100) = -28: nothing before the try;
  // after the failure 100 MiB -> 4 pages.
  EXPECT_EQ(resident_pages(a, v), 16u);
}

TEST(Aimdo, TheDeltaTermSeesOtherProcessesOnlyAtTheNextPollTwoSecondsLater) {
  DeviceSpec d = card(8 * GiB);
  SimDevice dev(d);
  std::uint64_t now = 0;
  Aimdo a(8 * GiB, DynamicConstants{}, dev, now);
  // t = 0: the first call polls: 8 GiB free, deficit_sync = 256 MiB - 8 GiB.
  EXPECT_EQ(a.budget_deficit(0), static_cast<std::int64_t>(256 * MiB) - static_cast<std::int64_t>(8 * GiB));
  ASSERT_TRUE(dev.others_take(6 * GiB));
  now = 1'999'000;  // 1.999 s: the poll is stale, the simple term cannot see others at all
  EXPECT_EQ(a.budget_deficit(0), static_cast<std::int64_t>(256 * MiB) - static_cast<std::int64_t>(8 * GiB));
  EXPECT_EQ(a.stats().polls, 1u);
  now = 2'000'000;
  EXPECT_EQ(a.budget_deficit(0), static_cast<std::int64_t>(256 * MiB) - static_cast<std::int64_t>(2 * GiB));
  EXPECT_EQ(a.stats().polls, 2u);
  // --vram-headroom adds to every deficit.
  DynamicConstants k;
  k.vram_headroom = 1 * GiB;
  std::uint64_t t = 0;
  SimDevice dev2(d);
  Aimdo b(8 * GiB, k, dev2, t);
  EXPECT_EQ(b.budget_deficit(0), static_cast<std::int64_t>(256 * MiB) - static_cast<std::int64_t>(7 * GiB));
}

TEST(Aimdo, CastBuffersGrowIn16MiBChunksAndOnlyANodeEndGivesThemBack) {
  SmallCard c;
  Aimdo& a = c.a;
  ASSERT_TRUE(a.cast_grow(1, 1 * MiB));
  EXPECT_EQ(a.cast_size(1), 16 * MiB);
  ASSERT_TRUE(a.cast_grow(1, 40 * MiB));
  EXPECT_EQ(a.cast_size(1), 48 * MiB);
  ASSERT_TRUE(a.cast_grow(1, 20 * MiB));  // never shrinks
  EXPECT_EQ(a.cast_size(1), 48 * MiB);
  ASSERT_TRUE(a.cast_grow(2, 160 * MiB));
  EXPECT_EQ(a.cast_bytes(), 208 * MiB);
  EXPECT_EQ(a.ledger(), 208 * MiB);
  EXPECT_EQ(c.dev.charged(), 208 * MiB);
  EXPECT_FALSE(a.cast_grow(1, kCastReservation + 1));  // larger than its address space
  a.cast_reset();
  EXPECT_EQ(a.cast_bytes(), 0u);
  EXPECT_EQ(a.ledger(), 0u);
  EXPECT_EQ(c.dev.charged(), 0u);
}

TEST(Aimdo, ACastBufferThatCannotGrowFailsAfterEvictingWhatItCould) {
  SmallCard c;
  Aimdo& a = c.a;
  const std::uint32_t v = a.vbar_allocate(8 * kVbarPage);
  ASSERT_EQ(a.fault(v, 0, 8 * kVbarPage), FaultResult::mapped);  // 256 MiB, pinned
  ASSERT_TRUE(c.dev.others_take(700 * MiB));                     // 68 MiB left
  EXPECT_FALSE(a.cast_grow(1, 200 * MiB));
  EXPECT_EQ(a.cast_size(1), 64 * MiB);  // what it mapped stays until the node ends
  EXPECT_EQ(a.loaded_size(v), 8 * kVbarPage);  // pinned pages are never evicted
}

}  // namespace
}  // namespace vf::sim

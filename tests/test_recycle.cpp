// core/recycle.h: a large table's storage goes to the next reservation on the same thread
// (and harness/lower.h: a program's destructor keeps its ops and buffers).
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "harness/core/recycle.h"
#include "harness/lower.h"

namespace vf {
namespace {

// Each test uses its own element type: the spare is per type and per thread.
struct A { std::uint64_t x = 0; };
struct B { std::uint64_t x = 0; };
struct C { std::uint64_t x = 0; };
struct D { std::uint64_t x = 0; };
struct E { std::uint64_t x = 0; };
struct F { std::uint64_t x = 0; };
struct G { std::uint64_t x = 0; };

// A thread-local table made before the spare and destroyed after it, at the thread's end.
struct LateTable {
  std::vector<E> table = std::vector<E>(120'000);
  bool* kept_on_exit = nullptr;
  ~LateTable() {
    recycle_keep(table);  // the spare is gone by now: left to the heap, no use of a dead vector
    *kept_on_exit = table.empty();
  }
};

TEST(Recycle, ALargeTableIsTakenByTheNextReservationThatFits) {
  std::vector<A> first(100'000);
  const A* storage = first.data();
  recycle_keep(first);
  EXPECT_TRUE(first.empty());
  EXPECT_EQ(first.capacity(), 0u);
  std::vector<A> next;
  recycle_reserve(next, 80'000);
  EXPECT_EQ(next.data(), storage);
  EXPECT_GE(next.capacity(), 100'000u);
  EXPECT_TRUE(next.empty());
  // The spare was handed over: a second reservation gets fresh storage.
  std::vector<A> other;
  recycle_reserve(other, 80'000);
  EXPECT_NE(other.data(), storage);
  EXPECT_EQ(other.capacity(), 80'000u);
}

TEST(Recycle, TablesUnder64KiElementsAreLeftToTheHeap) {
  std::vector<B> small(kRecycleMin - 1);
  recycle_keep(small);
  EXPECT_EQ(small.size(), kRecycleMin - 1);  // untouched
  std::vector<B> next;
  recycle_reserve(next, kRecycleMin);
  EXPECT_NE(next.data(), small.data());
  EXPECT_EQ(next.capacity(), kRecycleMin);
}

TEST(Recycle, OnlyTheLargestIsKeptAndATooSmallSpareIsFreedBeforeALargerReservation) {
  std::vector<C> big(200'000), medium(100'000);
  const C* big_storage = big.data();
  recycle_keep(big);
  recycle_keep(medium);  // smaller than the spare: untouched
  EXPECT_EQ(medium.size(), 100'000u);
  std::vector<C> huge;
  recycle_reserve(huge, 300'000);  // the 200,000 spare cannot hold it: freed, fresh storage
  EXPECT_EQ(huge.capacity(), 300'000u);
  std::vector<C> after;
  recycle_reserve(after, 100'000);
  EXPECT_NE(after.data(), big_storage);
  EXPECT_EQ(after.capacity(), 100'000u);
}

TEST(Recycle, ATableThatAlreadyHoldsItsElementsKeepsThem) {
  std::vector<D> spare(100'000);
  recycle_keep(spare);
  std::vector<D> v(kRecycleMin / 2);
  for (std::size_t i = 0; i < v.size(); ++i) v[i].x = i;
  recycle_reserve(v, 90'000);
  ASSERT_EQ(v.size(), kRecycleMin / 2);
  EXPECT_GE(v.capacity(), 100'000u);
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i].x, i);
}

TEST(Recycle, AnotherThreadDoesNotSeeThisThreadsSpare) {
  std::vector<F> mine(150'000);
  const F* storage = mine.data();
  recycle_keep(mine);
  const F* theirs = nullptr;
  std::thread([&] {
    std::vector<F> v;
    recycle_reserve(v, 150'000);
    theirs = v.data();
  }).join();
  EXPECT_NE(theirs, storage);
  std::vector<F> back;
  recycle_reserve(back, 150'000);
  EXPECT_EQ(back.data(), storage);
}

TEST(Recycle, ALargerTableReplacesASmallerSpare) {
  std::vector<G> small(70'000), large(140'000);
  const G* large_storage = large.data();
  recycle_keep(small);  // the spare: 70,000
  EXPECT_TRUE(small.empty());
  recycle_keep(large);  // larger: it becomes the spare, the 70,000 one goes to `large`, freed with it
  EXPECT_TRUE(large.empty());
  EXPECT_EQ(large.capacity(), 70'000u);
  std::vector<G> next;
  recycle_reserve(next, 120'000);
  EXPECT_EQ(next.data(), large_storage);
}

TEST(Recycle, ADestroyedProgramLeavesItsOpsAndBuffersToTheNextOnItsThread) {
  const Op* ops = nullptr;
  const Buffer* buffers = nullptr;
  {
    Program p;
    p.ops.resize(100'000);
    p.buffers.resize(70'000);
    ops = p.ops.data();
    buffers = p.buffers.data();
  }
  Program q;
  recycle_reserve(q.ops, 90'000);
  recycle_reserve(q.buffers, 70'000);
  EXPECT_EQ(q.ops.data(), ops);
  EXPECT_EQ(q.buffers.data(), buffers);
  EXPECT_TRUE(q.ops.empty());
  // A moved-from program has no storage left to keep: the one moved into keeps it.
  Program moved = std::move(q);
  EXPECT_EQ(q.ops.capacity(), 0u);
  EXPECT_EQ(moved.ops.data(), ops);
}

TEST(Recycle, ATableDestroyedAfterTheThreadsSpareIsLeftToTheHeap) {
  bool emptied = true;
  std::thread([&] {
    thread_local LateTable late;  // constructed first, so destroyed last
    late.kept_on_exit = &emptied;
    std::vector<E> first(100'000);
    recycle_keep(first);  // makes the spare, destroyed before `late`
    EXPECT_TRUE(first.empty());
  }).join();
  EXPECT_FALSE(emptied);  // its storage stayed with it, freed by its own destructor
}

TEST(Recycle, CoverKeyDoublesATableWithinItsReservationAndPastItGeometrically) {
  // Within the reservation: from 64 entries, doubling, never reallocated, new entries are `fill`.
  std::vector<std::uint32_t> reserved;
  reserved.reserve(1'000);
  const std::uint32_t* storage = reserved.data();
  cover_key(reserved, 3, 0xffffffffu);
  ASSERT_EQ(reserved.size(), 64u);
  for (const std::uint32_t v : reserved) ASSERT_EQ(v, 0xffffffffu);
  reserved[63] = 7;
  cover_key(reserved, 63, 0xffffffffu);
  EXPECT_EQ(reserved.size(), 64u);
  EXPECT_EQ(reserved[63], 7u);  // a covered key is left as it is
  cover_key(reserved, 64, 0xffffffffu);
  EXPECT_EQ(reserved.size(), 128u);
  cover_key(reserved, 700, 0xffffffffu);
  EXPECT_EQ(reserved.size(), 701u);  // past the doubling: up to the key
  cover_key(reserved, 701, 0xffffffffu);
  EXPECT_EQ(reserved.size(), 1'000u);  // the doubling stops at the reservation
  EXPECT_EQ(reserved.data(), storage);
  EXPECT_EQ(reserved[63], 7u);
  // Past the reservation: at least key + 1, and what was there stays.
  cover_key(reserved, 1'500, 0xffffffffu);
  EXPECT_GE(reserved.size(), 1'501u);
  EXPECT_EQ(reserved[63], 7u);
  EXPECT_EQ(reserved[1'500], 0xffffffffu);

  // A recycled table's capacity can be a far larger case's: a small case fills what it uses.
  std::vector<std::uint64_t> large;
  large.reserve(1'000'000);
  for (std::size_t key = 0; key < 3'000; ++key) cover_key(large, key, std::uint64_t{0});
  EXPECT_LE(large.size(), 6'000u);

  // Not reserved: keys one after another make O(log n) fills, not one per key.
  std::vector<std::uint64_t> grown;
  int fills = 0;
  for (std::size_t key = 0; key < 100'000; ++key) {
    const std::size_t before = grown.size();
    cover_key(grown, key, std::uint64_t{0});
    if (grown.size() != before) ++fills;
    ASSERT_GT(grown.size(), key);
  }
  EXPECT_LE(fills, 12);
}

}  // namespace
}  // namespace vf

// HoleIndex (harness/sim/hole_index.h): the simulated device's small-page holes in best-fit order
// (smallest size that holds the request, oldest of that size first), checked on hand-made cases
// with real sizes and against a plain ordered set on 200,000 random adds and removes.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "harness/core/splitmix.h"
#include "harness/sim/hole_index.h"

namespace vf::sim {
namespace {

constexpr std::uint32_t KiB = 1024;

TEST(HoleIndex, TheSmallestHoleThatHoldsTheRequestWins) {
  HoleIndex index;
  const auto big = index.add(0, 0, 1536 * KiB);
  const auto small = index.add(1, 4 * KiB, 8 * KiB);
  const auto mid = index.add(2, 512, 64 * KiB);
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.best_fit(512), small);           // 8 KiB holds 512 B
  EXPECT_EQ(index.best_fit(8 * KiB), small);       // an exact fit
  EXPECT_EQ(index.best_fit(8 * KiB + 512), mid);   // one unit more needs the 64 KiB hole
  EXPECT_EQ(index.best_fit(64 * KiB + 512), big);  // another bitmap word up
  EXPECT_EQ(index.best_fit(1536 * KiB + 512), HoleIndex::kNone);
  EXPECT_EQ(index.best_fit(2048 * KiB), HoleIndex::kNone);  // past the last class
  EXPECT_EQ(index[mid].page, 2u);
  EXPECT_EQ(index[mid].addr, 512u);
  EXPECT_EQ(index[mid].size, 64 * KiB);
}

TEST(HoleIndex, AmongEqualHolesTheOldestWinsAndRemovalsKeepTheOrder) {
  HoleIndex index;
  const auto a = index.add(7, 0, 4 * KiB);
  const auto b = index.add(3, 8 * KiB, 4 * KiB);
  const auto c = index.add(5, 16 * KiB, 4 * KiB);
  EXPECT_EQ(index.best_fit(4 * KiB), a);
  index.remove(b);  // from the middle
  EXPECT_EQ(index.best_fit(4 * KiB), a);
  index.remove(a);  // the head
  EXPECT_EQ(index.best_fit(4 * KiB), c);
  const auto d = index.add(9, 0, 4 * KiB);  // reuses a freed node, still the youngest
  EXPECT_EQ(index.best_fit(4 * KiB), c);
  index.remove(c);
  EXPECT_EQ(index.best_fit(4 * KiB), d);
  EXPECT_EQ(index[d].page, 9u);
  index.remove(d);
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.best_fit(512), HoleIndex::kNone);  // the bitmap is empty again
}

TEST(HoleIndex, AMovedHoleLeavesItsClassAndIsTheYoungestOfItsNewOne) {
  HoleIndex index;
  const auto a = index.add(1, 0, 4 * KiB);
  const auto b = index.add(2, 0, 8 * KiB);
  const auto c = index.add(3, 0, 8 * KiB);
  index.move(a, 512, 8 * KiB);  // 4 KiB -> 8 KiB: behind b and c
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.best_fit(4 * KiB), b);  // no 4 KiB hole is left
  index.remove(b);
  EXPECT_EQ(index.best_fit(8 * KiB), c);
  index.remove(c);
  EXPECT_EQ(index.best_fit(8 * KiB), a);
  EXPECT_EQ(index[a].page, 1u);
  EXPECT_EQ(index[a].addr, 512u);
  index.move(a, 0, 1536 * KiB);  // another bitmap word; the 8 KiB class empties
  EXPECT_EQ(index.best_fit(8 * KiB), a);
  EXPECT_EQ(index.best_fit(1536 * KiB + 512), HoleIndex::kNone);
  index.remove(a);
  EXPECT_EQ(index.best_fit(512), HoleIndex::kNone);
}

// A retired hole (an exact fit's marker) leaves the best-fit order at once but keeps its node and
// address until it is released; then its node is the next one added.
TEST(HoleIndex, ARetiredHoleIsNotFoundButKeepsItsNodeUntilReleased) {
  HoleIndex index;
  const auto a = index.add(1, 0x7f0000000000ull, 4 * KiB);
  const auto b = index.add(2, 0x7f0000200000ull, 4 * KiB);
  index.retire(a);
  EXPECT_EQ(index.size(), 1u);
  EXPECT_EQ(index.best_fit(4 * KiB), b);
  EXPECT_EQ(index[a].addr, 0x7f0000000000ull);
  EXPECT_EQ(index[a].size, 0u);
  const auto c = index.add(3, 0, 8 * KiB);  // a's node is still taken
  EXPECT_NE(c, a);
  index.release(a);
  EXPECT_EQ(index.size(), 2u);  // b and c: a was counted out when it was retired
  const auto d = index.add(4, 512, 4 * KiB);
  EXPECT_EQ(d, a);
  EXPECT_EQ(index.best_fit(4 * KiB), b);  // d is the younger of the two 4 KiB holes
  index.remove(b);
  EXPECT_EQ(index.best_fit(4 * KiB), d);
  EXPECT_EQ(index[d].page, 4u);
}

TEST(HoleIndex, EveryClassFromOneUnitToTheLargestIsFound) {
  HoleIndex index;
  // The first and last class of each 64-class word, and the extremes 512 B and 2 MiB - 512 B.
  for (std::uint32_t c = 1; c < HoleIndex::kSizes; ++c) {
    const std::uint32_t size = c * HoleIndex::kUnit;
    const auto id = index.add(c, 0, size);
    ASSERT_EQ(index.best_fit(size), id) << size;
    ASSERT_EQ(index.best_fit(HoleIndex::kUnit), id) << "the only hole holds any request";
    ASSERT_EQ(index.best_fit(size + HoleIndex::kUnit), HoleIndex::kNone) << size;
    index.remove(id);
  }
}

// The best fit is the first entry of the set ordered by (size, age) at or above the request.
TEST(HoleIndex, MatchesAnOrderedSetOnRandomAddsAndRemoves) {
  using HoleKey = std::tuple<std::uint32_t, std::uint64_t, HoleIndex::Id>;  // size, age, id
  std::set<HoleKey> plain;
  std::vector<HoleKey> live;
  HoleIndex index;
  SplitMix64 rng{0x401e};
  std::uint64_t age = 0;
  for (int step = 0; step < 200'000; ++step) {
    const bool add = live.empty() || (rng.next() % 100) < (live.size() < 3000 ? 60 : 40);
    if (add) {
      // Mostly small classes (many equal sizes, long lists), sometimes any class.
      const std::uint32_t c = (rng.next() % 4 != 0) ? 1 + static_cast<std::uint32_t>(rng.next() % 16)
                                                    : 1 + static_cast<std::uint32_t>(rng.next() % (HoleIndex::kSizes - 1));
      const std::uint32_t size = c * HoleIndex::kUnit;
      const auto id = index.add(static_cast<std::uint32_t>(step), 0, size);
      const HoleKey k{size, age++, id};
      plain.insert(k);
      live.push_back(k);
    } else if (rng.next() % 3 == 0) {  // a split's rest or a merge: new bounds, the youngest
      const std::size_t i = rng.next() % live.size();
      const HoleIndex::Id id = std::get<2>(live[i]);
      const std::uint32_t page = index[id].page;
      const std::uint32_t size = (1 + static_cast<std::uint32_t>(rng.next() % 16)) * HoleIndex::kUnit;
      index.move(id, 4096, size);
      ASSERT_EQ(index[id].page, page);
      ASSERT_EQ(index[id].addr, 4096u);
      plain.erase(live[i]);
      live[i] = HoleKey{size, age++, id};
      plain.insert(live[i]);
    } else {
      const std::size_t i = rng.next() % live.size();
      index.remove(std::get<2>(live[i]));
      plain.erase(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
    ASSERT_EQ(index.size(), plain.size());
    const std::uint32_t want = (1 + static_cast<std::uint32_t>(rng.next() % (HoleIndex::kSizes + 8))) * HoleIndex::kUnit;
    const auto it = plain.lower_bound(HoleKey{want, 0, 0});
    const HoleIndex::Id expected = it == plain.end() ? HoleIndex::kNone : std::get<2>(*it);
    ASSERT_EQ(index.best_fit(want), expected) << "step " << step << ", request " << want;
  }
}

}  // namespace
}  // namespace vf::sim

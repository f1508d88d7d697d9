// FreeIndex (harness/sim/free_index.h) against the ordered set it stands in for: a
// std::set<(stream, size, address)>, on random inserts, erases and replaces over streams that
// take both lane lookups (the table for ids below 256 and the top 16 ids, the scan for others),
// sizes that stay in one bin or move between bins, best-fit queries after every step and byte
// sums over size windows; and copies and moves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "harness/core/splitmix.h"
#include "harness/sim/free_index.h"

namespace vf::sim {
namespace {

using Key = std::tuple<std::uint32_t, Bytes, std::uint64_t>;  // stream, size, address

// The best fit of `stream` for `size` in the reference set, as FreeIndex::lower_bound defines it.
const Key* reference_fit(const std::set<Key>& ref, std::uint32_t stream, Bytes size) {
  const auto it = ref.lower_bound(Key{stream, size, 0});
  return it != ref.end() && std::get<0>(*it) == stream ? &*it : nullptr;
}

TEST(FreeIndex, AgreesWithAnOrderedSetOnRandomUpdatesOverEveryKindOfStreamId) {
  // 0 and 255: the table's ends; 256 and 70000: scanned; the async pool's two owner ids at the top.
  const std::uint32_t streams[] = {0, 3, 255, 256, 70000, 0xfffffffeu, 0xffffffffu};
  SplitMix64 rng{0xf1ee};
  FreeIndex index;
  std::set<Key> ref;
  std::vector<Key> present;
  std::uint64_t next_addr = 0x1000;
  std::uint32_t block = 0;
  for (int step = 0; step < 40000; ++step) {
    const std::uint32_t stream = streams[rng.below(std::size(streams))];
    const auto draw_size = [&]() -> Bytes {
      // small sizes, a few exact repeats (ties broken by address), and large ones
      switch (rng.below(3)) {
        case 0: return 512 * (1 + rng.below(64));
        case 1: return Bytes{1} << (12 + rng.below(4));
        default: return (Bytes{1} << (20 + rng.below(10))) + rng.below(Bytes{1} << 20);
      }
    };
    const std::uint64_t op = present.empty() ? 0 : rng.below(10);
    if (op < 4) {
      const Key k{stream, draw_size(), next_addr};
      next_addr += 0x200;
      index.insert(std::get<0>(k), std::get<1>(k), std::get<2>(k), block++);
      ref.insert(k);
      present.push_back(k);
    } else if (op < 6) {
      const std::size_t i = rng.below(present.size());
      const Key k = present[i];
      index.erase(std::get<0>(k), std::get<1>(k), std::get<2>(k));
      ref.erase(k);
      present[i] = present.back();
      present.pop_back();
    } else {
      // replace: a range losing its front (same end, smaller size), growing down, or any new size
      const std::size_t i = rng.below(present.size());
      const Key k = present[i];
      const Bytes old_size = std::get<1>(k);
      Bytes size = draw_size();
      if (op == 6 && old_size > 512) size = old_size - 512 * (1 + rng.below(old_size / 1024));
      if (op == 7) size = old_size + 512;  // mostly the same bin
      const Key moved{std::get<0>(k), size, next_addr};
      next_addr += 0x200;
      index.replace(std::get<0>(k), old_size, std::get<2>(k), size, std::get<2>(moved));
      ref.erase(k);
      ref.insert(moved);
      present[i] = moved;
    }
    ASSERT_EQ(index.size(), ref.size()) << "step " << step;
    // bytes_in over a drawn size window, every stream but one.
    if (step % 16 == 0) {
      const std::uint32_t skip = streams[rng.below(std::size(streams))];
      const Bytes lo = draw_size();
      const Bytes hi = rng.below(4) == 0 ? ~Bytes{0} : lo + draw_size();
      Bytes want = 0;
      for (const Key& k : ref) {
        if (std::get<0>(k) != skip && std::get<1>(k) >= lo && std::get<1>(k) < hi) want += std::get<1>(k);
      }
      ASSERT_EQ(index.bytes_in(skip, lo, hi), want) << "step " << step << " skip " << skip << " [" << lo << ", " << hi << ")";
    }
    // A best-fit query on every stream, and per-stream bytes and counts.
    for (const std::uint32_t s : streams) {
      const Bytes want = draw_size();
      const FreeIndex::Cursor c = index.lower_bound(s, want);
      const Key* r = reference_fit(ref, s, want);
      ASSERT_EQ(c.valid, r != nullptr) << "step " << step << " stream " << s << " size " << want;
      if (r != nullptr) {
        ASSERT_EQ(index.at(c).size, std::get<1>(*r)) << "step " << step << " stream " << s;
        ASSERT_EQ(index.at(c).addr, std::get<2>(*r)) << "step " << step << " stream " << s;
      }
    }
  }
  // The whole order, stream by stream, and each stream's totals.
  Bytes total = 0;
  for (const std::uint32_t s : streams) {
    std::vector<Key> walked;
    for (FreeIndex::Cursor c = index.lower_bound(s, 0); c.valid; c = index.next(c)) {
      walked.emplace_back(s, index.at(c).size, index.at(c).addr);
    }
    std::vector<Key> expected;
    Bytes bytes = 0;
    for (const Key& k : ref) {
      if (std::get<0>(k) == s) {
        expected.push_back(k);
        bytes += std::get<1>(k);
      }
    }
    EXPECT_EQ(walked, expected) << "stream " << s;
    EXPECT_EQ(index.bytes(s), bytes) << "stream " << s;
    EXPECT_EQ(index.count(s), expected.size()) << "stream " << s;
    total += bytes;
    if (!expected.empty()) {
      const FreeIndex::Cursor last = index.last(s);
      ASSERT_TRUE(last.valid);
      EXPECT_EQ(index.at(last).addr, std::get<2>(expected.back()));
    }
  }
  EXPECT_EQ(index.total_bytes(), total);
  EXPECT_GT(ref.size(), 1000u);  // the updates left a populated index to compare
}

// Thousands of entries in a handful of bins (a large model's same-shaped weights, freed): the
// bins split into chunks. Inserts, erases and replaces by key and at cursors (the async pool's
// and caching allocator's paths), moves within a bin and out of it, against the ordered set,
// with the whole order walked every 500 steps so chunk boundaries are crossed both ways.
TEST(FreeIndex, BinsOfThousandsOfEntriesStayInOrderAcrossTheirChunks) {
  const std::uint32_t streams[] = {0, 0xffffffffu};
  SplitMix64 rng{0xc4a7};
  FreeIndex index;
  std::set<Key> ref;
  std::vector<Key> present;
  std::uint32_t block = 0;
  // Sizes in [1 MiB, 1 MiB + 64 KiB): one bin; a few exact sizes, so most ties go by address.
  const auto draw_size = [&]() -> Bytes { return MiB + 4096 * rng.below(16); };
  const auto draw_addr = [&]() -> std::uint64_t { return 0x100000 + 0x1000 * rng.below(1u << 20); };
  const auto walk = [&](int step) {
    for (const std::uint32_t s : streams) {
      std::vector<Key> walked, expected;
      for (FreeIndex::Cursor c = index.lower_bound(s, 0); c.valid; c = index.next(c)) {
        walked.emplace_back(s, index.at(c).size, index.at(c).addr);
      }
      for (const Key& k : ref) {
        if (std::get<0>(k) == s) expected.push_back(k);
      }
      ASSERT_EQ(walked, expected) << "step " << step << " stream " << s;
      if (!expected.empty()) {
        ASSERT_EQ(index.at(index.last(s)).addr, std::get<2>(expected.back())) << "step " << step;
      }
    }
  };
  for (int step = 0; step < 30000; ++step) {
    const std::uint32_t stream = streams[rng.below(2)];
    // Grow to about 4,000 entries, then hover there.
    const std::uint64_t op = present.empty() ? 0 : rng.below(present.size() < 4000 ? 8 : 12);
    if (op < 5) {
      Key k{stream, draw_size(), draw_addr()};
      if (ref.count(k) != 0) continue;
      index.insert(std::get<0>(k), std::get<1>(k), std::get<2>(k), block++);
      ref.insert(k);
      present.push_back(k);
    } else if (op < 8) {
      const std::size_t i = rng.below(present.size());
      const Key k = present[i];
      if (op == 5) {
        index.erase(std::get<0>(k), std::get<1>(k), std::get<2>(k));
        ref.erase(k);
        present[i] = present.back();
        present.pop_back();
      } else {  // the entry a best-fit query finds, erased at its cursor (the allocators' path)
        const FreeIndex::Cursor c = index.lower_bound(std::get<0>(k), std::get<1>(k));
        ASSERT_TRUE(c.valid);
        const Key found{std::get<0>(k), index.at(c).size, index.at(c).addr};
        index.erase_at(c);
        ASSERT_EQ(ref.erase(found), 1u) << "step " << step;
        present.erase(std::find(present.begin(), present.end(), found));
      }
    } else {
      // Replace: the front taken off (down within the bin, or out of it), or a new address.
      const std::size_t i = rng.below(present.size());
      const Key k = present[i];
      Bytes size = std::get<1>(k);
      std::uint64_t addr = std::get<2>(k);
      switch (op % 4) {
        case 0: size = draw_size(); addr = draw_addr(); break;
        case 1:  // may leave the bin at its bottom
          if (size > 8192) {
            size -= 4096;
            addr += 4096;
          }
          break;
        case 2: size = 512 * (1 + rng.below(64)); break;  // out of the bin
        default: addr = draw_addr(); break;  // same size, anywhere in the bin's order
      }
      const Key moved{std::get<0>(k), size, addr};
      if (moved != k && ref.count(moved) != 0) continue;
      if (rng.below(2) == 0) {
        index.replace(std::get<0>(k), std::get<1>(k), std::get<2>(k), size, addr);
      } else {
        FreeIndex::Cursor c = index.lower_bound(std::get<0>(k), std::get<1>(k));
        while (c.valid && index.at(c).addr != std::get<2>(k)) c = index.next(c);
        ASSERT_TRUE(c.valid) << "step " << step;
        index.replace_at(c, size, addr);
      }
      ref.erase(k);
      ref.insert(moved);
      present[i] = moved;
    }
    ASSERT_EQ(index.size(), ref.size()) << "step " << step;
    const Bytes want = draw_size();
    const FreeIndex::Cursor c = index.lower_bound(stream, want);
    const Key* r = reference_fit(ref, stream, want);
    ASSERT_EQ(c.valid != 0, r != nullptr) << "step " << step;
    if (r != nullptr) {
      ASSERT_EQ(index.at(c).addr, std::get<2>(*r)) << "step " << step;
    }
    if (step % 500 == 0) walk(step);
  }
  walk(-1);
  EXPECT_GT(ref.size(), 3000u);  // well past one chunk per bin
}

// One bin filled past a chunk, emptied to a few entries (one chunk again), and filled again:
// the order, the best fit and the blocks hold through every split and un-split, and a replace
// that names another block leaves that block in the entry (the caching model's merge).
TEST(FreeIndex, ABinSplitsEmptiesAndSplitsAgainInOrder) {
  FreeIndex index;
  std::set<Key> ref;
  std::vector<std::pair<Key, std::uint32_t>> blocks;  // entry -> block, in insertion order
  SplitMix64 rng{0x5b17};
  const auto check = [&](int step) {
    ASSERT_EQ(index.size(), ref.size()) << step;
    std::vector<Key> walked;
    for (FreeIndex::Cursor c = index.lower_bound(0, 0); c.valid; c = index.next(c)) {
      walked.emplace_back(0u, index.at(c).size, index.at(c).addr);
    }
    ASSERT_EQ(walked, std::vector<Key>(ref.begin(), ref.end())) << step;
    const Bytes want = 4 * MiB + 4096 * rng.below(300);
    const FreeIndex::Cursor c = index.lower_bound(0, want);
    const Key* r = reference_fit(ref, 0, want);
    ASSERT_EQ(c.valid != 0, r != nullptr) << step;
    if (r != nullptr) {
      ASSERT_EQ(index.at(c).addr, std::get<2>(*r)) << step;
    }
  };
  std::uint32_t next_block = 1;
  const auto add = [&](int step) {
    // Sizes in [4 MiB, 4.5 MiB): one bin.
    const Key k{0u, 4 * MiB + 4096 * rng.below(128), 0x10000000 + 0x1000 * rng.below(1u << 16)};
    if (ref.count(k) != 0) return;
    index.insert(0, std::get<1>(k), std::get<2>(k), next_block);
    ref.insert(k);
    blocks.emplace_back(k, next_block++);
    check(step);
  };
  const auto remove = [&](int step) {
    const std::size_t i = rng.below(blocks.size());
    const Key k = blocks[i].first;
    index.erase(0, std::get<1>(k), std::get<2>(k));
    ref.erase(k);
    blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
    check(step);
  };
  int step = 0;
  for (int round = 0; round < 3; ++round) {
    while (ref.size() < 700) add(step++);     // five or more chunks of at most 128
    while (ref.size() > 5) remove(step++);    // one chunk again
  }
  while (ref.size() < 400) add(step++);
  // Every entry still names the block it was inserted with.
  for (const auto& [k, b] : blocks) {
    const FreeIndex::Cursor c = index.find(0, std::get<1>(k), std::get<2>(k));
    ASSERT_EQ(index.at(c).addr, std::get<2>(k));
    EXPECT_EQ(index.at(c).block, b);
  }
  // A merge's replace: the entry grows by a neighbour's bytes and names the surviving block.
  const Key k = blocks.front().first;
  index.replace_at(index.find(0, std::get<1>(k), std::get<2>(k)), std::get<1>(k) + 64 * MiB, std::get<2>(k), 99999);
  const FreeIndex::Cursor grown = index.lower_bound(0, std::get<1>(k) + 64 * MiB);
  ASSERT_TRUE(grown.valid);
  EXPECT_EQ(index.at(grown).addr, std::get<2>(k));
  EXPECT_EQ(index.at(grown).block, 99999u);
  EXPECT_EQ(index.size(), ref.size());
}

TEST(FreeIndex, ACopyIsIndependentAndAMovedFromIndexIsEmpty) {
  FreeIndex a;
  a.insert(0, 4096, 0x1000, 1);
  a.insert(0xffffffffu, 8192, 0x2000, 2);
  FreeIndex copy = a;
  copy.erase(0, 4096, 0x1000);
  EXPECT_EQ(a.count(0), 1u);
  EXPECT_EQ(copy.count(0), 0u);
  EXPECT_EQ(copy.count(0xffffffffu), 1u);
  FreeIndex moved = std::move(a);
  EXPECT_EQ(moved.size(), 2u);
  EXPECT_EQ(moved.at(moved.lower_bound(0xffffffffu, 1)).block, 2u);
  // NOLINTNEXTLINE(bugprone-use-after-move): the moved-from state is what is tested
  EXPECT_EQ(a.size(), 0u);
  EXPECT_FALSE(a.lower_bound(0, 0).valid);
  EXPECT_EQ(a.bytes(0xffffffffu), 0u);
  a.insert(0, 512, 0x3000, 3);  // usable again
  EXPECT_EQ(a.count(0), 1u);
}

TEST(FreeIndex, AStreamNeverSeenHasNoEntriesWhateverItsId) {
  FreeIndex index;
  index.insert(7, 4096, 0x1000, 1);
  for (const std::uint32_t s : {0u, 6u, 8u, 256u, 1000000u, 0xfffffff0u, 0xffffffffu}) {
    EXPECT_FALSE(index.lower_bound(s, 0).valid) << s;
    EXPECT_FALSE(index.last(s).valid) << s;
    EXPECT_EQ(index.bytes(s), 0u) << s;
    EXPECT_EQ(index.count(s), 0u) << s;
  }
  const FreeIndex::Cursor c = index.lower_bound(7, 4096);
  ASSERT_TRUE(c.valid);
  EXPECT_EQ(index.at(c).block, 1u);
  EXPECT_FALSE(index.lower_bound(7, 4097).valid);
}

// A destroyed index's lanes go to its thread's pool, emptied, and the next index takes them: it
// starts with no entries on any stream, whatever the last one held (a split bin of 300 entries,
// entries in many bins, three streams), and agrees with the ordered set from there.
TEST(FreeIndex, AnIndexBuiltAfterAnotherStartsEmptyOnItsRecycledLanes) {
  SplitMix64 rng{42};
  for (int round = 0; round < 4; ++round) {
    {
      FreeIndex old;
      for (std::uint64_t i = 0; i < 300; ++i) old.insert(0, 1 * MiB, 0x100000 * (i + 1), static_cast<std::uint32_t>(i));
      for (std::uint64_t i = 0; i < 200; ++i) {
        old.insert(static_cast<std::uint32_t>(1 + i % 2), 512 + rng.below(64 * MiB), 0x4000000000 + i * 0x1000, 1000);
      }
      ASSERT_EQ(old.size(), 500u);
    }
    FreeIndex fresh;
    EXPECT_EQ(fresh.size(), 0u);
    EXPECT_EQ(fresh.total_bytes(), 0u);
    std::set<Key> ref;
    for (const std::uint32_t s : {0u, 1u, 2u}) {
      // A lane comes into being with a stream's first entry: an empty one from the pool.
      fresh.insert(s, 4096, 0x10 + s, 7);
      ref.insert(Key{s, 4096, 0x10 + s});
      EXPECT_EQ(fresh.count(s), 1u) << s;
      EXPECT_EQ(fresh.bytes(s), 4096u) << s;
      EXPECT_FALSE(fresh.lower_bound(s, 4097).valid) << s;
      EXPECT_EQ(fresh.at(fresh.last(s)).addr, 0x10 + s) << s;
    }
    std::size_t seen = 0;
    fresh.for_each([&](const FreeIndex::Entry&) { ++seen; });
    EXPECT_EQ(seen, 3u);
    EXPECT_EQ(fresh.bytes_in(99, 0, ~Bytes{0}), 3u * 4096u);
    for (std::uint64_t i = 0; i < 400; ++i) {
      const std::uint32_t s = static_cast<std::uint32_t>(rng.below(3));
      const Bytes size = 512 + rng.below(8 * MiB);
      const std::uint64_t addr = 0x1000000 + i * 0x100;
      fresh.insert(s, size, addr, static_cast<std::uint32_t>(i));
      ref.insert(Key{s, size, addr});
      const Bytes want = 512 + rng.below(8 * MiB);
      const Key* fit = reference_fit(ref, s, want);
      const FreeIndex::Cursor c = fresh.lower_bound(s, want);
      ASSERT_EQ(c.valid, fit != nullptr) << i;
      if (fit) {
        EXPECT_EQ(fresh.at(c).size, std::get<1>(*fit)) << i;
        EXPECT_EQ(fresh.at(c).addr, std::get<2>(*fit)) << i;
      }
    }
    EXPECT_EQ(fresh.size(), ref.size());
  }
}

}  // namespace
}  // namespace vf::sim

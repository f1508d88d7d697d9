// SimDevice: the driver layer below every allocator (cuda-allocators.md §3.2, §7.1-7.2).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/sim/device.h"

namespace vf::sim {
namespace {

DeviceSpec device_spec(Bytes total, Bytes others = 0, Bytes context = 0) {
  DeviceSpec s;
  s.total = total;
  s.used_by_others = others;
  s.context_overhead = context;
  return s;
}

TEST(SimDevice, CapacityIsTotalMinusOthersMinusContext) {
  const SimDevice d(device_spec(24 * GiB, 1 * GiB, 300 * MiB));
  EXPECT_EQ(d.capacity(), 24 * GiB - 1 * GiB - 300 * MiB);
  EXPECT_EQ(d.free(), d.capacity());
  EXPECT_EQ(d.device_used(), 1 * GiB + 300 * MiB);  // NVML view before our first byte
  const SimDevice crowded(device_spec(1 * GiB, 2 * GiB, 0));
  EXPECT_EQ(crowded.capacity(), 0u);  // saturates, never wraps
}

TEST(SimDevice, OneByteIsChargedAWholePage) {
  SimDevice d(device_spec(1 * GiB));
  const auto a = d.cuda_malloc(1);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->size, 512u);           // 512 B spacing
  EXPECT_EQ(d.charged(), 2 * MiB);    // the first small buffer opens a 2 MiB page
}

TEST(SimDevice, LargeBuffersAreChargedInWholePages) {
  SimDevice d(device_spec(1 * GiB));
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

TEST(SimDevice, ASmallBufferTakesTheSmallestHoleThatHoldsIt) {
  SimDevice d(device_spec(1 * GiB));
  // One page: a 4 KiB, b 64 KiB, c 8 KiB, e 64 KiB, f 8 KiB, back to back from the page's start.
  const auto a = d.cuda_malloc(4 * KiB);
  const auto b = d.cuda_malloc(64 * KiB);
  const auto c = d.cuda_malloc(8 * KiB);
  const auto e = d.cuda_malloc(64 * KiB);
  const auto f = d.cuda_malloc(8 * KiB);
  ASSERT_TRUE(a && b && c && e && f);
  EXPECT_EQ(f->addr, a->addr + 140 * KiB);
  d.cuda_free(*b);  // holes: 64 KiB at a+4K, 64 KiB at a+76K, and the page's rest (1900 KiB)
  d.cuda_free(*e);
  // 10 KiB fits all three holes: the smallest two are equal, the older one (b's) wins.
  const auto g = d.cuda_malloc(10 * KiB);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->addr, a->addr + 4 * KiB);
  // b's hole is now 54 KiB, the smallest that holds 50 KiB: not e's 64 KiB, not the page's rest.
  const auto h = d.cuda_malloc(50 * KiB);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->addr, a->addr + 14 * KiB);
  EXPECT_EQ(d.charged(), 2 * MiB);
  // 1 MiB + 512 B: only the page's rest (1900 KiB) holds it; 1 MiB more would need a new page.
  const auto i = d.cuda_malloc(1 * MiB + 512);
  ASSERT_TRUE(i);
  EXPECT_EQ(i->addr, a->addr + 148 * KiB);
  EXPECT_EQ(d.charged(), 2 * MiB);
  const auto j = d.cuda_malloc(1 * MiB);
  ASSERT_TRUE(j);
  EXPECT_EQ(d.charged(), 4 * MiB);
}

TEST(SimDevice, AFreeMergesWithTheHolesBesideIt) {
  SimDevice d(device_spec(1 * GiB));
  const auto a = d.cuda_malloc(600 * KiB);
  const auto b = d.cuda_malloc(600 * KiB);
  const auto c = d.cuda_malloc(600 * KiB);
  const auto keep = d.cuda_malloc(200 * KiB);  // the page's rest is 48 KiB
  ASSERT_TRUE(a && b && c && keep);
  d.cuda_free(*a);
  d.cuda_free(*c);
  d.cuda_free(*b);  // a, b and c merge into one 1800 KiB hole
  const auto big = d.cuda_malloc(1700 * KiB);
  ASSERT_TRUE(big);
  EXPECT_EQ(big->addr, a->addr);
  EXPECT_EQ(d.charged(), 2 * MiB);  // no second page
}

// A buffer that fills a hole exactly leaves a marker in its page's list (the placement does not
// read the list). A marker is not a hole: a free beside one does not merge across it, and the
// buffer's own free removes it and merges as any other.
TEST(SimDevice, AnExactFitIsNeverMergedAcrossAndItsFreeMergesBothWays) {
  SimDevice d(device_spec(1 * GiB));
  const auto a = d.cuda_malloc(1 * MiB);    // page P: a at [0, 1 MiB); hole [1, 2) MiB
  const auto b = d.cuda_malloc(512 * KiB);  // [1 MiB, 1.5 MiB); hole [1.5, 2) MiB
  const auto c = d.cuda_malloc(512 * KiB);  // fills that hole exactly
  ASSERT_TRUE(a && b && c);
  const DeviceAddr p = a->addr;
  EXPECT_EQ(b->addr, p + 1 * MiB);
  EXPECT_EQ(c->addr, p + 1536 * KiB);
  EXPECT_EQ(d.charged(), 2 * MiB);
  d.cuda_free(*b);  // a 512 KiB hole [1, 1.5) MiB, not merged with c's place above it
  const auto no_room = d.cuda_malloc(512 * KiB + 512);
  ASSERT_TRUE(no_room);
  EXPECT_EQ(no_room->addr, p + 2 * MiB) << "a 512 KiB + 512 B request does not fit page P";
  EXPECT_EQ(d.charged(), 4 * MiB);
  d.cuda_free(*no_room);
  const auto e = d.cuda_malloc(512 * KiB);  // fills b's hole exactly: P has no hole again
  ASSERT_TRUE(e);
  EXPECT_EQ(e->addr, p + 1 * MiB);
  d.cuda_free(*c);  // [1.5, 2) MiB: below it is e, not a hole
  d.cuda_free(*a);  // [0, 1) MiB: above it is e
  const auto no_room2 = d.cuda_malloc(1 * MiB + 512);
  ASSERT_TRUE(no_room2);
  EXPECT_EQ(no_room2->addr, p + 4 * MiB) << "the holes beside e were not merged across it";
  d.cuda_free(*no_room2);
  const auto f = d.cuda_malloc(1 * MiB);  // [0, 1) MiB exactly
  ASSERT_TRUE(f);
  EXPECT_EQ(f->addr, p);
  d.cuda_free(*f);  // [0, 1) MiB again: above it is e's place, not a hole
  EXPECT_EQ(d.charged(), 2 * MiB);
  d.cuda_free(*e);  // merges down with [0, 1) MiB and up with [1.5, 2) MiB: the page is free
  EXPECT_EQ(d.charged(), 0u);
  const auto g = d.cuda_malloc(1 * MiB);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->addr, p + 6 * MiB) << "a new page";
  const auto h = d.cuda_malloc(1 * MiB);  // the new page's rest, exactly
  ASSERT_TRUE(h);
  EXPECT_EQ(h->addr, p + 7 * MiB);
  EXPECT_EQ(d.charged(), 2 * MiB);
}

// A page keeps five holes in its own record and more on the heap: one page cut into 12 holes
// keeps all of them, in its best-fit order, and merges them back.
TEST(SimDevice, APageWithManyHolesKeepsEveryOne) {
  SimDevice d(device_spec(1 * GiB));
  std::vector<DeviceAlloc> a;
  for (int i = 0; i < 24; ++i) {
    const auto x = d.cuda_malloc(4 * KiB);
    ASSERT_TRUE(x);
    a.push_back(*x);
  }
  ASSERT_EQ(a[23].addr, a[0].addr + 23 * 4 * KiB);
  // Every other buffer freed, last to first: 12 holes of 4 KiB (the youngest the lowest) and the
  // page's 1,952 KiB tail.
  for (int i = 22; i >= 0; i -= 2) d.cuda_free(a[static_cast<std::size_t>(i)]);
  EXPECT_EQ(d.charged(), 2 * MiB);
  // 4 KiB requests take the 4 KiB holes, oldest first: buffer 22's, then 20's, ... then 0's.
  for (int i = 22; i >= 0; i -= 2) {
    const auto x = d.cuda_malloc(4 * KiB);
    ASSERT_TRUE(x);
    EXPECT_EQ(x->addr, a[static_cast<std::size_t>(i)].addr) << "hole of buffer " << i;
    a[static_cast<std::size_t>(i)] = *x;
  }
  const auto tail = d.cuda_malloc(4 * KiB);  // no 4 KiB hole left: the tail's start
  ASSERT_TRUE(tail);
  EXPECT_EQ(tail->addr, a[23].addr + 4 * KiB);
  // The holes merge back: with the odd buffers and the tail freed, the even ones freed leave one
  // hole of the whole page, which is given back.
  d.cuda_free(*tail);
  for (int i = 1; i < 24; i += 2) d.cuda_free(a[static_cast<std::size_t>(i)]);
  EXPECT_EQ(d.charged(), 2 * MiB);
  for (int i = 0; i < 24; i += 2) d.cuda_free(a[static_cast<std::size_t>(i)]);
  EXPECT_EQ(d.charged(), 0u);
  // The slot's next page starts with one hole again: 512 requests of 4 KiB fill exactly one page.
  for (int i = 0; i < 512; ++i) ASSERT_TRUE(d.cuda_malloc(4 * KiB));
  EXPECT_EQ(d.charged(), 2 * MiB);
  ASSERT_TRUE(d.cuda_malloc(512));
  EXPECT_EQ(d.charged(), 4 * MiB);
}

TEST(SimDevice, SmallBuffersArePackedIntoSharedPages) {
  SimDevice d(device_spec(1 * GiB));
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
  SimDevice d(device_spec(1 * GiB));
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
  SimDevice d(device_spec(10 * MiB));
  ASSERT_TRUE(d.cuda_malloc(8 * MiB));
  EXPECT_FALSE(d.cuda_malloc(2 * MiB + 1));  // needs 4 MiB, 2 MiB free
  EXPECT_EQ(d.charged(), 8 * MiB);          // a failed call charges nothing
  EXPECT_TRUE(d.cuda_malloc(2 * MiB));
  EXPECT_FALSE(d.cuda_malloc(1));           // no page left for a small buffer either
  EXPECT_FALSE(d.cuda_malloc(~Bytes{0}));   // absurd sizes fail, never wrap
}

TEST(SimDevice, MappedPagesAreChargedExactly) {
  SimDevice d(device_spec(100 * MiB));
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

// The rule written the plain way (every hole in one list, scanned), against SimDevice's indexed
// one, on 200,000 random small allocations and frees: the same address for every allocation and
// the same charge after every call.
TEST(SimDevice, TheIndexedBestFitIsThePlainOne) {
  struct Hole {
    DeviceAddr addr;
    Bytes size;
    std::uint64_t seq;
  };
  std::vector<Hole> holes;
  std::vector<std::pair<DeviceAddr, std::uint32_t>> pages;  // base, live
  std::uint64_t seq = 0;
  Bytes charged = 0;
  DeviceAddr next_page = 0;
  auto page_of = [&](DeviceAddr a) {
    for (std::size_t i = 0; i < pages.size(); ++i) {
      if (a >= pages[i].first && a < pages[i].first + kDevicePage) return i;
    }
    return pages.size();
  };
  auto plain_malloc = [&](Bytes r) -> DeviceAddr {
    std::size_t best = holes.size();
    for (std::size_t i = 0; i < holes.size(); ++i) {
      if (holes[i].size >= r && (best == holes.size() || holes[i].size < holes[best].size ||
                                 (holes[i].size == holes[best].size && holes[i].seq < holes[best].seq))) {
        best = i;
      }
    }
    if (best == holes.size()) {
      pages.emplace_back(next_page, 1);
      charged += kDevicePage;
      holes.push_back({next_page + r, kDevicePage - r, seq++});
      next_page += kDevicePage;
      return pages.back().first;
    }
    const DeviceAddr a = holes[best].addr;
    ++pages[page_of(a)].second;
    if (holes[best].size > r) {
      holes[best] = {a + r, holes[best].size - r, seq++};
    } else {
      holes.erase(holes.begin() + static_cast<std::ptrdiff_t>(best));
    }
    return a;
  };
  auto plain_free = [&](DeviceAddr a, Bytes r) {
    const std::size_t pg = page_of(a);
    DeviceAddr lo = a;
    DeviceAddr hi = a + r;
    for (std::size_t i = 0; i < holes.size();) {
      const bool same_page = page_of(holes[i].addr) == pg;
      if (same_page && holes[i].addr + holes[i].size == lo) {
        lo = holes[i].addr;
        holes.erase(holes.begin() + static_cast<std::ptrdiff_t>(i));
        i = 0;
      } else if (same_page && holes[i].addr == hi) {
        hi += holes[i].size;
        holes.erase(holes.begin() + static_cast<std::ptrdiff_t>(i));
        i = 0;
      } else {
        ++i;
      }
    }
    if (--pages[pg].second == 0) {
      charged -= kDevicePage;
      pages.erase(pages.begin() + static_cast<std::ptrdiff_t>(pg));
      return;
    }
    holes.push_back({lo, hi - lo, seq++});
  };

  SimDevice d(device_spec(1024 * GiB));
  std::uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  struct Live {
    DeviceAlloc real;
    DeviceAddr plain;
  };
  std::vector<Live> live;
  for (int i = 0; i < 200000; ++i) {
    if (live.empty() || (live.size() < 400 && next() % 100 < 55)) {
      const Bytes size = next() % 8 == 0 ? 1 + next() % (2 * MiB - 513) : 1 + next() % (64 * KiB);
      const auto a = d.cuda_malloc(size);
      ASSERT_TRUE(a);
      const DeviceAddr p = plain_malloc(a->size);
      // Pages sit at other addresses in the two; an allocation's offset in its page must agree.
      ASSERT_EQ(a->addr % kDevicePage, p % kDevicePage) << "op " << i;
      live.push_back({*a, p});
    } else {
      const std::size_t k = next() % live.size();
      d.cuda_free(live[k].real);
      plain_free(live[k].plain, live[k].real.size);
      live[k] = live.back();
      live.pop_back();
    }
    ASSERT_EQ(d.charged(), charged) << "op " << i;
  }
}

// The recording of ci/gpu-check.sh on an H200 (driver 580.159.04): three seeded programs of
// 1,500 cudaMalloc / cudaFree calls each, with the device's free-memory drop after every call.
// The simulated device must reproduce every reading.
TEST(SimDevice, ReproducesEveryReadingOfTheH200Recording) {
  const std::string path = std::string(VF_SOURCE_DIR) + "/reports/gpu/h200-2026-12-04-sequences.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str());
  const nlohmann::json& seqs = doc["sections"]["calibration"]["sequences_raw"];
  ASSERT_EQ(seqs.size(), 3u);
  std::size_t checked = 0;
  for (const nlohmann::json& seq : seqs) {
    SimDevice d(device_spec(1024 * GiB));
    const nlohmann::json& ops = seq["ops"];
    std::vector<DeviceAlloc> allocs(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const nlohmann::json& op = ops[i];  // [alloc, size or alloc op, ptr, free drop]
      if (op[0].get<int>() == 1) {
        const auto a = d.cuda_malloc(op[1].get<Bytes>());
        ASSERT_TRUE(a);
        allocs[i] = *a;
      } else {
        d.cuda_free(allocs[op[1].get<std::size_t>()]);
      }
      ASSERT_EQ(static_cast<std::int64_t>(d.charged()), op[3].get<std::int64_t>())
          << seq["name"].get<std::string>() << " op " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4500u);
}

}  // namespace
}  // namespace vf::sim

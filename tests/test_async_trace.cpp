// The async pool model against its own recorded behaviour: 3,000 generated op sequences (mallocs
// of the campaign's size mix, frees in random order, record_stream, stream_wait, synchronize,
// empty_cache, trim_to, threshold and reuse-policy changes) over twelve pool configurations, each
// sequence digested into one 64-bit hash of everything a caller can observe after every op:
// malloc's answer, the address given, every stat, held bytes per stream, the largest free range,
// the free-range count and the OOM text.
//
// tests/data/async-trace-digests.txt holds the digests the pool gave when they were recorded.
// A change to the pool's data structures must leave every digest as it is (issue #15: an indexed
// pool, "same traces, same verdicts"). A change to its *rules* changes digests on purpose: record
// anew, and say why in the commit:
//
//   VF_RECORD_ASYNC_TRACES=1 build/tests/test_sim --gtest_filter='AsyncTrace.*'
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/core/splitmix.h"
#include "harness/sim/async_pool.h"
#include "tests/sim_test_util.h"

namespace vf::sim {
namespace {

constexpr int kSequences = 3000;
constexpr int kOpsPerSequence = 400;
constexpr int kConfigs = 12;

using Rng = SplitMix64;

// FNV-1a over 64-bit words.
struct Digest {
  std::uint64_t h = 0xcbf29ce484222325ull;
  void add(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  }
  void add(const std::string& s) {
    add(s.size());
    for (const char c : s) {
      h ^= static_cast<unsigned char>(c);
      h *= 0x100000001b3ull;
    }
  }
};

// Config `c` of the twelve: granularity 2 or 32 MiB (the measured default), release threshold never / 0 / 64 MiB, each
// reuse policy on or off, coin probability, memory fraction, and a card small enough to OOM.
AsyncOptions trace_config(int c) {
  AsyncOptions o;
  o.pool_granularity = c % 2 == 0 ? 2 * MiB : kDefaultPoolGranularity;
  o.release_threshold = c % 3 == 0 ? kReleaseNever : c % 3 == 1 ? 0 : 64 * MiB;
  o.reuse_follow_event_dependencies = c % 4 != 1;
  o.reuse_allow_opportunistic = c % 5 != 2;
  o.reuse_allow_internal_dependencies = c % 6 != 3;
  o.opportunistic_probability = c % 7 == 4 ? 1.0 : 0.5;
  o.memory_fraction = c == 11 ? 0.7 : 1.0;
  return o;
}

Bytes draw_size(Rng& rng) {
  const std::uint64_t bucket = rng.below(100);
  if (bucket < 3) return 0;
  if (bucket < 55) {
    const unsigned shift = 8 + static_cast<unsigned>(rng.below(12));
    return (Bytes{1} << shift) + rng.below(Bytes{1} << shift);
  }
  if (bucket < 70) {
    constexpr Bytes kCommon[] = {6144, 4096, 12288, 65536, 262144, 2 * MiB, 32 * MiB};
    return kCommon[rng.below(7)];
  }
  if (bucket < 94) return 1 * MiB + rng.below(9 * MiB);
  return 10 * MiB + rng.below(150 * MiB);
}

void observe(const AsyncPoolAllocator& a, Digest& d, StreamId streams) {
  const AllocStats& s = a.stats();
  for (const Stat* st : {&s.requested, &s.allocated, &s.active, &s.reserved}) {
    d.add(st->current);
    d.add(st->peak);
  }
  d.add(s.num_ooms);
  d.add(s.num_device_alloc);
  d.add(s.num_device_free);
  for (StreamId st = 0; st <= streams; ++st) d.add(a.held_for_other_streams(st, 0));
  d.add(a.largest_free_range());
  d.add(a.free_range_count());
}

std::uint64_t run_sequence(int index) {
  Rng rng{0xa5f1ce00u + static_cast<std::uint64_t>(index)};
  const int c = index % kConfigs;
  const Bytes total = (rng.below(4) == 0 ? 1 : 8) * GiB;
  SimDevice device(test::spec_of(total));
  AsyncPoolAllocator a(device, trace_config(c), rng.next());
  const StreamId streams = static_cast<StreamId>(rng.below(4));  // offload streams 1..streams
  const std::size_t slots = 8 + rng.below(120);
  std::vector<bool> live(slots, false);
  Digest d;
  for (int op = 0; op < kOpsPerSequence; ++op) {
    const std::uint64_t kind = rng.below(100);
    const auto slot = static_cast<BlockKey>(rng.below(slots));
    const auto stream = static_cast<StreamId>(streams == 0 ? 0 : rng.below(streams + 1));
    if (kind < 80) {
      if (live[slot]) {
        a.free(slot);
        live[slot] = false;
      } else {
        live[slot] = a.malloc(slot, draw_size(rng), stream);
        d.add(live[slot] ? 1 : 0);
        if (live[slot]) d.add(a.address(slot).value_or(~DeviceAddr{0}));
        if (!live[slot] && a.last_oom()) d.add(a.last_oom()->detail);
      }
    } else if (kind < 86) {
      if (live[slot]) a.record_stream(slot, stream);
    } else if (kind < 93) {
      a.stream_wait(stream, static_cast<StreamId>(rng.below(streams + 1)));
    } else if (kind < 96) {
      a.synchronize();
    } else if (kind < 97) {
      a.empty_cache();
    } else if (kind < 98) {
      a.trim_to(rng.below(512) * MiB);
    } else if (kind < 99) {
      a.set_release_threshold(rng.below(2) == 0 ? kReleaseNever : rng.below(256) * MiB);
    } else {
      // Drawn one by one (the order of a call's arguments is the compiler's), in the order the
      // digests were recorded in.
      const bool internal = rng.below(2) == 0;
      const bool opportunistic = rng.below(2) == 0;
      const bool follow = rng.below(2) == 0;
      a.set_reuse_policy(follow, opportunistic, internal);
    }
    observe(a, d, streams);
  }
  return d.h;
}

std::string digests_path() { return std::string(VF_SOURCE_DIR) + "/tests/data/async-trace-digests.txt"; }

TEST(AsyncTrace, EveryRecordedSequenceGivesItsRecordedTrace) {
  std::vector<std::uint64_t> got(kSequences);
  for (int i = 0; i < kSequences; ++i) got[i] = run_sequence(i);

  if (std::getenv("VF_RECORD_ASYNC_TRACES") != nullptr) {
    std::ofstream out(digests_path());
    out << "# async pool trace digests: tests/test_async_trace.cpp (one per sequence, in order)\n";
    for (const std::uint64_t h : got) out << fmt::format("{:016x}\n", h);
    ASSERT_TRUE(out.good()) << "cannot write " << digests_path();
    GTEST_SKIP() << "recorded " << kSequences << " digests to " << digests_path();
  }

  std::ifstream in(digests_path());
  ASSERT_TRUE(in) << "cannot read " << digests_path();
  std::vector<std::uint64_t> want;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    want.push_back(std::stoull(line, nullptr, 16));
  }
  ASSERT_EQ(want.size(), got.size()) << "the digest file holds another number of sequences: record anew";
  int differ = 0;
  for (int i = 0; i < kSequences; ++i) {
    if (got[i] == want[i]) continue;
    if (++differ <= 5) ADD_FAILURE() << "sequence " << i << " (config " << i % kConfigs << ") traces differently";
  }
  EXPECT_EQ(differ, 0) << differ << " of " << kSequences << " sequences differ";
}

}  // namespace
}  // namespace vf::sim

// malloc+free pairs per second of every allocator model, on a fixed-seed mix shaped like model
// loads and activations: many small tensors (biases, norms, scales), some 1-10 MiB, a few large
// weights, freed in random order while about 64 blocks stay live. Each iteration frees one live
// block and allocates a new one in its place: one malloc+free pair.
//
//   cmake --build build --target vf_bench_allocators && build/bench/vf_bench_allocators
//
// Target (issue "Allocator models"): caching >= 5 million pairs/s on one core.
#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "bench/alloc_mix.h"
#include "harness/sim/allocator.h"
#include "harness/sim/replay.h"

namespace vf::sim {
namespace {

using bench::kLive;
using bench::make_steps;
using bench::Step;

void run(benchmark::State& state, AllocatorMode mode, std::vector<std::pair<std::string, std::string>> options,
         unsigned streams) {
  AllocatorConfig cfg;
  cfg.mode = mode;
  cfg.options = std::move(options);
  bench::PairReplay replay(std::move(cfg), streams);
  std::int64_t pairs = 0;
  std::int64_t ooms = 0;
  for (auto _ : state) {
    ooms += replay.pair() ? 0 : 1;
    ++pairs;
  }
  state.SetItemsProcessed(pairs);
  state.counters["reserved_MiB"] = to_mib(replay.allocator().stats().reserved.current);
  state.counters["peak_reserved_MiB"] = to_mib(replay.allocator().stats().reserved.peak);
  state.counters["ooms"] = static_cast<double>(ooms);
}

void BM_Raw(benchmark::State& s) { run(s, AllocatorMode::raw, {}, 1); }
void BM_Caching(benchmark::State& s) { run(s, AllocatorMode::caching, {}, 1); }
void BM_CachingTwoStreams(benchmark::State& s) { run(s, AllocatorMode::caching, {}, 2); }
void BM_CachingMaxSplit(benchmark::State& s) {
  run(s, AllocatorMode::caching, {{"max_split_size_mb", "64"}, {"roundup_power2_divisions", "4"}}, 1);
}
void BM_CachingExpandable(benchmark::State& s) { run(s, AllocatorMode::caching_expandable, {}, 1); }
void BM_Async(benchmark::State& s) { run(s, AllocatorMode::async, {}, 1); }
void BM_AsyncTwoStreams(benchmark::State& s) { run(s, AllocatorMode::async, {}, 2); }
void BM_Async32MiB(benchmark::State& s) { run(s, AllocatorMode::async, {{"pool_granularity", "32MiB"}}, 1); }

// alloc-replay's path per event: read one JSONL line (the fast reader), replay it through
// `caching`, format its DEBUG line. Items are events (issue #15: >= 1 M events/s through
// caching on one core; `vramfuzz alloc-replay` of 2 M events <= 2 s and <= 100 MB, README).
void BM_TraceReplay(benchmark::State& state) {
  const std::vector<Step> steps = make_steps(1);
  std::string text;
  std::array<bool, kLive> live{};
  std::array<std::uint64_t, kLive> id{};
  std::uint64_t next_id = 0;
  for (const Step& st : steps) {
    if (live[st.slot]) text += fmt::format("{{\"op\":\"free\",\"id\":{}}}\n", id[st.slot]);
    id[st.slot] = next_id++;
    live[st.slot] = true;
    text += fmt::format("{{\"op\":\"alloc\",\"id\":{},\"size\":{},\"stream\":0,\"name\":\"t{}\"}}\n", id[st.slot], st.size, id[st.slot]);
  }
  DeviceSpec spec;
  spec.total = 80 * GiB;
  AllocatorConfig cfg;
  cfg.mode = AllocatorMode::caching;
  std::int64_t events = 0;
  for (auto _ : state) {
    TraceReader reader(text, "bench.jsonl");
    Replayer replayer(cfg, spec, 0);
    fmt::memory_buffer out;
    Bytes before = 0;
    for (TraceEvent e; reader.next(e);) {
      const ReplayRow& row = replayer.step(e);
      append_replay_debug_line(out, row, before);
      before = row.reserved;
      if (out.size() > (1u << 16)) out.clear();
      ++events;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(events);
}

BENCHMARK(BM_Raw);
BENCHMARK(BM_Caching);
BENCHMARK(BM_CachingTwoStreams);
BENCHMARK(BM_CachingMaxSplit);
BENCHMARK(BM_CachingExpandable);
BENCHMARK(BM_Async);
BENCHMARK(BM_AsyncTwoStreams);
BENCHMARK(BM_Async32MiB);
BENCHMARK(BM_TraceReplay)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vf::sim

BENCHMARK_MAIN();

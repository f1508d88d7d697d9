// vf_alloc_pairs MODE PAIRS [STREAMS]: replays PAIRS malloc+free pairs of the allocator
// benchmarks' mix (alloc_mix.h) through one allocator model and prints pairs per second. It
// exists to be counted: run under callgrind, its instructions over PAIRS are a model's cost per
// pair, a figure that does not move with a shared host's speed (README "Performance").
//
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null build/bench/vf_alloc_pairs caching 500000
//
// MODE: raw, caching, caching-expandable or async. Exit 2 on a bad argument.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "bench/alloc_mix.h"
#include "harness/sim/allocator.h"

int main(int argc, char** argv) {
  using namespace vf;
  using namespace vf::sim;
  const auto usage = [] {
    std::fprintf(stderr, "usage: vf_alloc_pairs raw|caching|caching-expandable|async PAIRS [STREAMS]\n");
    return 2;
  };
  if (argc < 3 || argc > 4) return usage();
  const std::string_view m = argv[1];
  AllocatorConfig cfg;
  if (m == "raw") cfg.mode = AllocatorMode::raw;
  else if (m == "caching") cfg.mode = AllocatorMode::caching;
  else if (m == "caching-expandable") cfg.mode = AllocatorMode::caching_expandable;
  else if (m == "async") cfg.mode = AllocatorMode::async;
  else return usage();
  char* end = nullptr;
  const long long pairs = std::strtoll(argv[2], &end, 10);
  if (*end != '\0' || pairs <= 0) return usage();
  long long streams = 1;
  if (argc == 4) {
    streams = std::strtoll(argv[3], &end, 10);
    if (*end != '\0' || streams < 1 || streams > 64) return usage();
  }
  bench::PairReplay replay(cfg, static_cast<unsigned>(streams));
  long long ooms = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (long long k = 0; k < pairs; ++k) ooms += replay.pair() ? 0 : 1;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %lld pairs, %.2f M pairs/s, %lld OOMs\n", argv[1], pairs, static_cast<double>(pairs) / secs / 1e6, ooms);
  return 0;
}

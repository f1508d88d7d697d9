// vf_scale_case MODULES MODE [CASES]: BM_ScaleModules' case (bench/scale_fixture.h), phase by
// phase. One case warms up (the walk's order memoized, the recycled tables grown), then CASES
// cases run (default 5); it prints each phase's time per module, the fastest of those cases:
//
//   taskset -c 1 build/bench/vf_scale_case 1000000 raw 5
//
// Where the benchmark says how much the cost per module grows from 10,000 to 1,000,000 modules,
// this says in which phase. Run under callgrind, only the measured cases are counted (divide by
// CASES x MODULES), so the instructions per module are a figure a shared host's speed and caches
// do not move: equal instructions per module at both sizes mean no step grows faster than
// linear, and what the clock adds at 1,000,000 modules is waiting on memory (README
// "Performance").
//
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null --collect-atstart=no
//     --toggle-collect='vf::measured_case*' build/bench/vf_scale_case 1000000 raw 1   (one line)
//
// MODE: raw, caching, caching-expandable or async. Exit 2 on a bad argument.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "bench/scale_fixture.h"
#include "harness/exec.h"
#include "harness/lower.h"
#include "harness/oracle.h"
#include "harness/predict.h"

namespace vf {

struct PhaseTimes {
  double plan = 0, lower = 0, execute = 0, judge = 0;
};

namespace {
PhaseTimes run_phases(const Scenario& s, SimBackend& backend) {
  using clock = std::chrono::steady_clock;
  const auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const auto t0 = clock::now();
  const Plan plan = predict(s);
  const auto t1 = clock::now();
  const Program program = lower(s, plan);
  const auto t2 = clock::now();
  const ExecResult exec = backend.execute(s, program, ExecOptions{false});
  const auto t3 = clock::now();
  const Verdict verdict = judge(s, plan, program, exec);
  const auto t4 = clock::now();
  if (exec.ops_executed != program.ops.size()) {
    std::fprintf(stderr, "vf_scale_case: the case stopped at op %zu of %zu (%s): the fixture must run its whole program\n",
                 static_cast<std::size_t>(exec.ops_executed), program.ops.size(), verdict.message.c_str());
    std::exit(3);
  }
  return PhaseTimes{seconds(t0, t1), seconds(t1, t2), seconds(t2, t3), seconds(t3, t4)};
}
}  // namespace

// Two functions, not inlined, and not alike enough to be folded into one: callgrind's
// --toggle-collect counts the measured cases alone.
[[gnu::noinline]] void warm_up_case(const Scenario& s, SimBackend& backend) { run_phases(s, backend); }
[[gnu::noinline]] PhaseTimes measured_case(const Scenario& s, SimBackend& backend) { return run_phases(s, backend); }

}  // namespace vf

int main(int argc, char** argv) {
  using namespace vf;
  const auto usage = [](const char* why) {
    if (why != nullptr) std::fprintf(stderr, "vf_scale_case: %s\n", why);
    std::fprintf(stderr, "usage: vf_scale_case MODULES raw|caching|caching-expandable|async [CASES]\n");
    return 2;
  };
  if (argc < 3 || argc > 4) return usage(nullptr);
  char* end = nullptr;
  const long long modules = std::strtoll(argv[1], &end, 10);
  if (*end != '\0' || modules < 1 || modules > 10'000'000) return usage("MODULES must be a whole number from 1 to 10,000,000");
  const auto mode = parse_allocator_mode(argv[2]);
  if (!mode) return usage("unknown allocator mode (MODE)");
  long long cases = 5;
  if (argc == 4) {
    cases = std::strtoll(argv[3], &end, 10);
    if (*end != '\0' || cases < 1 || cases > 1'000'000) return usage("CASES must be a whole number from 1 to 1,000,000");
  }
  const auto n = static_cast<std::size_t>(modules);
  const Scenario s = scale_scenario(n, *mode);
  SimBackend backend;
  warm_up_case(s, backend);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  PhaseTimes best{kInf, kInf, kInf, kInf};
  double best_total = kInf;
  for (long long i = 0; i < cases; ++i) {
    const PhaseTimes t = measured_case(s, backend);
    best.plan = std::min(best.plan, t.plan);
    best.lower = std::min(best.lower, t.lower);
    best.execute = std::min(best.execute, t.execute);
    best.judge = std::min(best.judge, t.judge);
    best_total = std::min(best_total, t.plan + t.lower + t.execute + t.judge);
  }
  const double per = 1e9 / static_cast<double>(n);
  std::printf("%zu modules, %s, ns per module (fastest of %lld cases after a warm-up): plan %.1f, lower %.1f, execute %.1f, judge %.1f, case %.1f\n",
              n, argv[2], cases, best.plan * per, best.lower * per, best.execute * per, best.judge * per, best_total * per);
  return 0;
}

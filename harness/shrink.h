// The shrinker: turns a finding into the smallest scenario that still fails the same way.
// Domain passes, biggest first (drop models and stages; bisect the module list; drop tensors;
// then numeric passes: device, workload, streams, dtypes, allocator options). A candidate counts
// only if it keeps the bug's identity (the same signature) and a real margin (overshoot >=
// max(1 MiB, half the original)), so the result is not a knife-edge. Every candidate is cached
// and never run twice; execution and time budgets return the best so far. The final case is
// re-run k times and labelled flaky when it does not reproduce reliably.
// Reference: ../shared/reference/pbt-fuzz-anchors.md §4, §6.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/campaign.h"

namespace vf {

struct ShrinkOptions {
  std::uint64_t max_execs = 400;  // --shrink-execs: candidate executions (cache hits are free)
  double max_seconds = 120;       // --shrink-time
  std::uint32_t confirm_runs = 1; // re-runs of the final case (5 on cuda); runs > 1 vary the seed
  double flaky_below = 0.8;       // reproduction rate under which the repro is labelled flaky
  std::function<bool()> should_stop;  // true: stop now and return the best so far (SIGINT/SIGTERM)
};

// How big a case is: what a person has to read.
struct CaseSize {
  std::size_t models = 0;
  std::size_t modules = 0;
  // Of those, the ones identical to the module before them (the "repeat" runs a rounding-sum
  // repro is written with): a repro of 370 modules with 369 repeats reads as two rows.
  std::size_t repeats = 0;
  std::size_t tensors = 0;
  Bytes bytes = 0;  // model bytes
  bool operator==(const CaseSize&) const = default;
};
CaseSize case_size(const Scenario& s);

struct ShrinkResult {
  Scenario minimal;
  CaseResult result;              // of the minimal case, with its trace
  std::string signature;
  std::int64_t original_overshoot = 0;
  std::int64_t largest_overshoot = 0;  // the worst any interesting candidate reached
  std::int64_t margin = 0;             // the overshoot every accepted candidate had to keep
  CaseSize original_size;
  CaseSize final_size;
  std::uint64_t executions = 0;   // candidates actually run (the original included)
  std::uint64_t cache_hits = 0;
  std::uint64_t accepted = 0;
  double seconds = 0;
  bool budget_exhausted = false;
  std::uint32_t confirm_runs = 0;
  std::uint32_t reproduced = 0;
  bool flaky = false;
  std::vector<std::string> log;   // one line per accepted step ("modules: dropped 8 of 16 ...")
  // False only for a repro read back from a version that did not record the original's repeats
  // (read_repro_lineage): its repro.json then leaves them out rather than say 0.
  bool original_repeats_known = true;
};

// `s` must be a finding on `backend` (its verdict is recomputed first; InputError if it passes).
ShrinkResult shrink(const Scenario& s, Backend& backend, const ShrinkOptions& opt);

// Re-runs `s` `runs` times (run i > 0 with the seed varied) and counts how often `signature`
// comes back.
std::uint32_t count_reproductions(const Scenario& s, Backend& backend, const std::string& signature, std::uint32_t runs);

}  // namespace vf

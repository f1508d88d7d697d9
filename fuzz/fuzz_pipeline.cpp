// libFuzzer target 5: the whole pipeline. The shared choice-driven generator reads its draws from
// the input (FuzzedDataProvider, fdp_choices.h), then generate -> plan with the `exact` predictor
// (the drawn policy's placement, the live peak of the lowered program) and the allocator mode's
// overhead bound as the reserve (harness/overhead.h) -> lower -> sim -> oracle.
//
// With that reserve nothing may fail: a violation (a stage's reserved peak above its live peak
// plus the bound) or an OOM where the plan fits is a bug in an allocator model, the lowering, the
// predictor, the oracle or the bound itself. So is a program that breaks check_program, an error
// verdict, and any exception but InputError. Each prints the case (a vramfuzz.finding/1 document
// with its trace, which `vramfuzz run` / `shrink` take) and the bound's breakdown to stderr, then
// __builtin_trap(). `vramfuzz fuzz-import CRASH` turns the crash input into a shrunk repro.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "fuzz/fdp_choices.h"
#include "harness/campaign.h"
#include "harness/core/error.h"
#include "harness/overhead.h"

namespace {

[[noreturn]] void fail(const vf::Scenario& s, const vf::CaseResult* r, const std::string& why) {
  std::string doc;
  if (r) {
    vf::SimBackend backend;  // again, with the trace the finding document shows around the peak
    const vf::CaseResult traced = vf::run_case(s, backend, true);
    doc = vf::case_json(s, traced, 0, 0, s.seed, "");
    doc += vf::overhead_breakdown(s, traced.program).summary() + "\n";
  } else {
    doc = vf::scenario_to_json(s) + "\n";
  }
  std::fprintf(stderr, "fuzz_pipeline: %s\n%s", why.c_str(), doc.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Built catalog models are immutable and cached by (name, storage): sharing the cache across
  // inputs changes no result, only the time the first use of each model takes.
  static vf::Catalog catalog;
  FuzzedDataProvider fdp(data, size);
  vf::Scenario s;
  try {
    s = vf::pipeline_case(fdp, catalog);
  } catch (const vf::InputError&) {
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_pipeline: the generator threw: %s\n", e.what());
    __builtin_trap();
  }
  const vf::PipelineRun run = vf::run_pipeline_case(s);
  if (!run.rejected.empty()) return 0;
  if (!run.broken.empty()) fail(s, nullptr, run.broken);
  const vf::CaseResult& r = run.result;
  if (r.verdict.kind == vf::VerdictKind::error) fail(s, &r, "error verdict: " + r.verdict.message);
  if (r.verdict.finding()) fail(s, &r, r.verdict.signature + ": " + r.verdict.message);
  return 0;
}

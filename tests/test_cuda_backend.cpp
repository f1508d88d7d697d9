// The cuda backend's orchestration on the fake runtime (harness/cuda/runtime_fake.h), no GPU
// needed. The fake is built on the simulator, so for every allocator mode the backend must
// measure exactly what the sim backend computes: that agreement, op for op, is the main check of
// the backend's wiring (streams, events, frees, pools, the caching model on a device layer).
// Also here: the ballast arithmetic, peak resets, OOM and sticky-error handling, leak detection,
// pinned-buffer reuse, --transfer skip, --isolate surviving a crashing child, and the GPU check
// run end to end on the fake with its JSON schema validated.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/campaign.h"
#include "harness/core/error.h"
#include "harness/cuda/backend.h"
#include "harness/cuda/device_layer.h"
#include "harness/cuda/gpu_check.h"
#include "harness/cuda/isolate.h"
#include "harness/cuda/runtime_fake.h"
#include "harness/generate.h"
#include "harness/oracle.h"
#include "harness/sim/caching.h"
#include "tests/run_cli.h"

namespace vf::cuda {
namespace {

const std::string kExample = std::string(VF_SOURCE_DIR) + "/docs/examples/flux2-te-fp8-fp32-12gib.json";

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout + stderr
};

CliRun run_cli(const std::vector<std::string>& args, int timeout_s = 120) {
  const test::Proc p = test::run_process(VF_CLI, args, std::filesystem::temp_directory_path(), timeout_s);
  // The process itself must end normally (its children may crash: the isolate test makes them).
  EXPECT_FALSE(p.timed_out) << test::describe(p);
  EXPECT_EQ(p.signal, 0) << test::describe(p);
  EXPECT_EQ(p.err.find("terminate called"), std::string::npos) << test::describe(p);
  return CliRun{p.exit_code, p.out + p.err};
}

class CudaBackendTest : public ::testing::Test {
 protected:
  // A generated case at `vram`, with a context of whole 2 MiB pages so the ballast leaves
  // exactly the free memory the simulator's device has (cudaMalloc charges whole pages).
  Scenario generated(AllocatorMode mode, std::uint64_t seed, Bytes vram = 24 * GiB) {
    PrngChoices c(seed);
    GenConfig g;
    g.allocator = mode;
    g.vram = vram;
    g.policy = "comfy:dec2025";
    Scenario s = generate_scenario(c, g, catalog_);
    s.device.context_overhead = 256 * MiB;
    return s;
  }
  Scenario example(std::string_view policy = "comfy:dec2025") {
    Scenario s = load_case_file(kExample, catalog_);
    s.policy = parse_policy(policy, "test");
    return s;
  }
  static CudaBackendConfig quiet(Transfer t = Transfer::copy) {
    CudaBackendConfig c;
    c.transfer = t;
    c.sample_interval_ms = 0.2;
    c.nvml_interval_ms = 1;
    return c;
  }
  Catalog catalog_;
};

void expect_same_measurements(const ExecResult& sim, const ExecResult& real, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_FALSE(real.error) << *real.error;
  EXPECT_EQ(real.ops_executed, sim.ops_executed);
  EXPECT_EQ(real.reserved_peak, sim.reserved_peak);
  EXPECT_EQ(real.reserved_peak_op, sim.reserved_peak_op);
  EXPECT_EQ(real.stage_reserved_peak, sim.stage_reserved_peak);
  EXPECT_EQ(real.stage_reserved_peak_op, sim.stage_reserved_peak_op);
  EXPECT_EQ(real.live_peak, sim.live_peak);
  EXPECT_EQ(real.allocated_peak, sim.allocated_peak);
  EXPECT_EQ(real.device_peak, sim.device_peak);
  ASSERT_EQ(real.oom.has_value(), sim.oom.has_value());
  if (sim.oom) {
    EXPECT_EQ(real.oom->op, sim.oom->op);
    EXPECT_EQ(real.oom->request, sim.oom->request);
  }
  ASSERT_EQ(real.trace.size(), sim.trace.size());
  for (std::size_t i = 0; i < sim.trace.size(); ++i) {
    ASSERT_EQ(real.trace[i].reserved, sim.trace[i].reserved) << "op " << sim.trace[i].op;
    ASSERT_EQ(real.trace[i].allocated, sim.trace[i].allocated) << "op " << sim.trace[i].op;
    ASSERT_EQ(real.trace[i].device_used, sim.trace[i].device_used) << "op " << sim.trace[i].op;
  }
}

// ---- ballast ----------------------------------------------------------------------------------

TEST_F(CudaBackendTest, BallastMakesAnH200AConsumerCard) {
  FakeRuntime fake(FakeConfig{});  // 141 GiB, 512 MiB context
  CudaBackend backend(fake, quiet());
  Scenario s = example();
  s.device.total = 24 * GiB;
  s.device.context_overhead = 512 * MiB;
  const CaseResult r = run_case(s, backend, false);
  ASSERT_TRUE(r.exec.device);
  const DeviceReport& d = *r.exec.device;
  // Exactly 24 GiB minus the context is free to the case, whatever the real card is.
  EXPECT_EQ(d.free_before, 24 * GiB - 512 * MiB);
  EXPECT_EQ(d.total, 141 * GiB);
  EXPECT_EQ(d.free_at_start - d.ballast, d.free_before);
  EXPECT_EQ(d.ballast % kBallastStep, 0u);
  EXPECT_EQ(d.leaked, 0u);
  EXPECT_EQ(d.free_after_cleanup, d.free_before);

  // Memory used by others comes out of the free memory too; the ballast only grows by it.
  s.device.used_by_others = 1 * GiB;
  const CaseResult r2 = run_case(s, backend, false);
  EXPECT_EQ(r2.exec.device->free_before, 23 * GiB - 512 * MiB);
  EXPECT_EQ(r2.exec.device->ballast, d.ballast + 1 * GiB);

  // The same card again: the ballast is kept, not re-allocated.
  const std::uint64_t mallocs = fake.counters().mallocs;
  const CaseResult r3 = run_case(s, backend, false);
  EXPECT_EQ(r3.exec.device->free_at_start, r3.exec.device->free_before);
  EXPECT_EQ(fake.counters().mallocs - mallocs, static_cast<std::uint64_t>(std::count_if(
                                                   r3.program.ops.begin(), r3.program.ops.end(),
                                                   [](const Op& op) { return op.kind == OpKind::alloc; })));
}

TEST_F(CudaBackendTest, BallastLeavesLessThanOnePageAboveAnUnalignedTarget) {
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet());
  Scenario s = example();
  s.device.context_overhead = kDefaultContextOverhead;  // 528.81 MiB: not a whole page
  const CaseResult r = run_case(s, backend, false);
  const Bytes target = s.device.available();
  EXPECT_GE(r.exec.device->free_before, target);
  EXPECT_LT(r.exec.device->free_before - target, kBallastStep);
}

TEST_F(CudaBackendTest, ACardLargerThanTheDeviceIsAnError) {
  FakeConfig fc;
  fc.total = 16 * GiB;
  FakeRuntime fake(fc);
  CudaBackend backend(fake, quiet());
  Scenario s = example();
  s.device.total = 24 * GiB;
  const CaseResult r = run_case(s, backend, false);
  EXPECT_EQ(r.verdict.kind, VerdictKind::error);
  ASSERT_TRUE(r.exec.error);
  EXPECT_NE(r.exec.error->find("emulating"), std::string::npos) << *r.exec.error;
  EXPECT_FALSE(r.exec.fatal);
}

// ---- the fake agrees with sim op for op -------------------------------------------------------

TEST_F(CudaBackendTest, EveryModeMeasuresWhatTheSimComputes) {
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet(Transfer::skip));
  SimBackend sim;
  int ooms = 0;
  int cases = 0;
  for (const AllocatorMode mode : kAllAllocatorModes) {
    for (std::uint64_t seed = 1; seed <= 12; ++seed) {
      // Small cards too, so OOMs (and the caching retry ladder) are exercised.
      const Scenario s = generated(mode, seed * 7919 + static_cast<std::uint64_t>(mode), seed % 3 == 0 ? 8 * GiB : 24 * GiB);
      const Plan plan = predict(s);
      const Program p = lower(s, plan);
      const ExecResult a = sim.execute(s, p, ExecOptions{true});
      const ExecResult b = backend.execute(s, p, ExecOptions{true});
      expect_same_measurements(a, b, fmt::format("{} seed {} ({})", allocator_mode_name(mode), seed, s.name));
      EXPECT_TRUE(b.warnings.empty()) << b.warnings.front();
      EXPECT_EQ(b.device->leaked, 0u);
      const Verdict va = judge(s, plan, p, a);
      const Verdict vb = judge(s, plan, p, b);
      EXPECT_EQ(va.signature, vb.signature);
      ooms += a.oom ? 1 : 0;
      ++cases;
    }
  }
  EXPECT_GT(ooms, 0) << "no case ran out of memory: the OOM paths were not compared";
  EXPECT_EQ(cases, 48);
}

// Dynamic VRAM on the fake: aimdo's VBAR pages and cast buffers are real cuMemCreate / cuMemMap
// mappings, the hooks wrap the real cudaMalloc / cudaMallocAsync / segment calls, and the run
// measures what the simulator computes (the fake's clock is the modelled one).
TEST_F(CudaBackendTest, DynamicVramMeasuresWhatTheSimComputes) {
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet(Transfer::skip));
  SimBackend sim;
  int cases = 0, refused = 0, evicted = 0;
  for (const AllocatorMode mode : {AllocatorMode::raw, AllocatorMode::caching, AllocatorMode::async}) {
    for (std::uint64_t seed = 1; seed <= 10; ++seed) {
      PrngChoices c(seed * 104729 + static_cast<std::uint64_t>(mode));
      GenConfig g;
      g.allocator = mode;
      g.vram = seed % 3 == 0 ? 8 * GiB : 16 * GiB;
      g.policy = "comfy:sep2026";
      Scenario s = generate_scenario(c, g, catalog_);
      s.device.context_overhead = 256 * MiB;
      const Plan plan = predict(s);
      const Program p = lower(s, plan);
      const ExecResult a = sim.execute(s, p, ExecOptions{true});
      const ExecResult b = backend.execute(s, p, ExecOptions{true});
      const std::string what = fmt::format("{} seed {} ({})", allocator_mode_name(mode), seed, s.name);
      expect_same_measurements(a, b, what);
      ASSERT_TRUE(a.dynamic && b.dynamic) << what;
      EXPECT_EQ(b.dynamic->faults, a.dynamic->faults) << what;
      EXPECT_EQ(b.dynamic->copies, a.dynamic->copies) << what;
      EXPECT_EQ(b.dynamic->refused, a.dynamic->refused) << what;
      EXPECT_EQ(b.dynamic->pages_evicted, a.dynamic->pages_evicted) << what;
      EXPECT_EQ(b.dynamic->vbar_peak, a.dynamic->vbar_peak) << what;
      EXPECT_EQ(b.dynamic->cast_peak, a.dynamic->cast_peak) << what;
      EXPECT_EQ(b.dynamic->elapsed_us, a.dynamic->elapsed_us) << what;
      for (std::size_t i = 0; i < a.trace.size() && i < b.trace.size(); ++i) {
        ASSERT_EQ(b.trace[i].vbar, a.trace[i].vbar) << what << " op " << a.trace[i].op;
        ASSERT_EQ(b.trace[i].cast, a.trace[i].cast) << what << " op " << a.trace[i].op;
      }
      EXPECT_EQ(judge(s, plan, p, a).signature, judge(s, plan, p, b).signature) << what;
      EXPECT_TRUE(b.warnings.empty()) << what << ": " << b.warnings.front();
      EXPECT_EQ(b.device->leaked, 0u) << what;
      refused += a.dynamic->refused > 0;
      evicted += a.dynamic->pages_evicted > 0;
      ++cases;
    }
  }
  EXPECT_EQ(cases, 30);
  EXPECT_GT(refused, 0) << "no fault was refused: the cast buffers were not compared";
  EXPECT_GT(evicted, 0) << "no page was evicted: eviction was not compared";
}

TEST_F(CudaBackendTest, DynamicVramMapsVbarPagesOf32MiBAndGivesThemAllBack) {
  // The FLUX.2 text encoder on an emulated 12 GiB card: its VBAR is 384 pages; every page it maps
  // is one cuMemCreate of 32 MiB, every cast chunk one of 16 MiB, and all of them are released.
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet());
  Scenario s = example("comfy:sep2026");
  s.allocator.mode = AllocatorMode::async;
  s.device.context_overhead = 256 * MiB;
  const FakeCounters before = fake.counters();
  const CaseResult r = run_case(s, backend, false);
  ASSERT_FALSE(r.exec.error) << *r.exec.error;
  ASSERT_TRUE(r.exec.dynamic);
  const DynamicReport& d = *r.exec.dynamic;
  const FakeCounters after = fake.counters();
  const std::uint64_t cast_chunks = d.cast_peak / (16 * MiB);
  EXPECT_GT(d.pages_mapped, 0u);
  EXPECT_GE(after.vmm_creates - before.vmm_creates, d.pages_mapped + cast_chunks);
  EXPECT_EQ(after.vmm_creates - before.vmm_creates, after.vmm_releases - before.vmm_releases);
  EXPECT_EQ(r.exec.device->leaked, 0u);
  EXPECT_GT(after.h2d_copies, before.h2d_copies);  // the slices were copied from the pinned buffer
  EXPECT_EQ(r.verdict.kind, VerdictKind::pass) << r.verdict.message;
}

TEST_F(CudaBackendTest, AsyncPoolAttributesComeFromTheOptions) {
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet());
  SimBackend sim;
  Scenario s = generated(AllocatorMode::async, 42);
  s.allocator.options = {{"release_threshold", "0"}, {"reuse_allow_opportunistic", "False"}};
  const Plan plan = predict(s);
  const Program p = lower(s, plan);
  expect_same_measurements(sim.execute(s, p, ExecOptions{true}), backend.execute(s, p, ExecOptions{true}), "threshold 0");
  EXPECT_EQ(fake.counters().pools_created, fake.counters().pools_destroyed);  // a pool per case, destroyed
}

// ---- peaks ------------------------------------------------------------------------------------

TEST_F(CudaBackendTest, PoolHighWatermarksResetBetweenCases) {
  FakeRuntime fake(FakeConfig{});
  CudaBackendConfig cfg = quiet();
  cfg.dedicated_pool = false;  // the default pool lives across cases: only the reset separates them
  CudaBackend backend(fake, cfg);
  Scenario big = generated(AllocatorMode::async, 3);
  Scenario small = generated(AllocatorMode::async, 3);
  small.models.resize(1);
  small.stages = default_stages(1);
  const CaseResult a = run_case(big, backend, false);
  const CaseResult b = run_case(small, backend, false);
  ASSERT_FALSE(b.exec.error);
  EXPECT_EQ(a.exec.device->pool_reserved_high, a.exec.reserved_peak);
  EXPECT_EQ(b.exec.device->pool_reserved_high, b.exec.reserved_peak);
  EXPECT_EQ(b.exec.device->pool_used_high, b.exec.allocated_peak);

  // Writing 0 to a high watermark resets it to the current value.
  Pool pool;
  ASSERT_TRUE(fake.default_pool(pool));
  Stream st;
  ASSERT_TRUE(fake.stream_create(st));
  ASSERT_TRUE(fake.pool_set(pool, PoolAttr::used_high, 0));
  DevPtr p1 = 0;
  DevPtr p2 = 0;
  ASSERT_TRUE(fake.malloc_async(p1, 64 * MiB, pool, st));
  ASSERT_TRUE(fake.malloc_async(p2, 64 * MiB, pool, st));
  ASSERT_TRUE(fake.free_async(p2, st));
  std::uint64_t high = 0;
  std::uint64_t used = 0;
  ASSERT_TRUE(fake.pool_get(pool, PoolAttr::used_high, high));
  EXPECT_EQ(high, 128 * MiB);
  ASSERT_TRUE(fake.pool_set(pool, PoolAttr::used_high, 0));
  ASSERT_TRUE(fake.pool_get(pool, PoolAttr::used_high, high));
  ASSERT_TRUE(fake.pool_get(pool, PoolAttr::used_current, used));
  EXPECT_EQ(high, used);
  EXPECT_EQ(high, 64 * MiB);
  EXPECT_FALSE(fake.pool_set(pool, PoolAttr::used_high, 5));  // only 0 is valid
  (void)fake.last_error();
  ASSERT_TRUE(fake.free_async(p1, st));
}

TEST_F(CudaBackendTest, TheSamplingThreadSeesTheDeviceView) {
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet());
  const CaseResult r = run_case(example(), backend, false);
  ASSERT_TRUE(r.exec.device);
  EXPECT_GT(r.exec.device->samples, 0u);
  EXPECT_LE(r.exec.device->sampled_used_peak, r.exec.device_peak);
  ASSERT_TRUE(r.exec.device->nvml_process_peak);
  EXPECT_GT(*r.exec.device->nvml_process_peak, r.exec.device->ballast);  // NVML sees the whole process
}

// ---- faults -----------------------------------------------------------------------------------

TEST_F(CudaBackendTest, AnOomAtOpNIsTheOomVerdictAtOpN) {
  for (const AllocatorMode mode : {AllocatorMode::raw, AllocatorMode::async}) {
    SCOPED_TRACE(allocator_mode_name(mode));
    FakeRuntime fake(FakeConfig{});
    CudaBackend backend(fake, quiet());
    Scenario s = example();
    s.allocator.mode = mode;
    const CaseResult warm = run_case(s, backend, false);  // fits; the ballast stays in place after it
    ASSERT_EQ(warm.verdict.kind, VerdictKind::pass) << warm.verdict.message;
    // raw and async call the device once per (non-empty) alloc op: the 5th one fails.
    std::uint32_t expected = 0;
    int seen = 0;
    for (std::uint32_t i = 0; i < warm.program.ops.size() && seen < 5; ++i) {
      const Op& op = warm.program.ops[i];
      if (op.kind == OpKind::alloc && warm.program.buffers[op.buffer].bytes > 0) {
        expected = i;
        ++seen;
      }
    }
    fake.arm_oom(5);
    const CaseResult r = run_case(s, backend, false);
    ASSERT_TRUE(r.exec.oom);
    EXPECT_FALSE(r.exec.error);
    EXPECT_EQ(r.exec.oom->op, expected);
    EXPECT_EQ(r.exec.oom->request, warm.program.buffers[warm.program.ops[expected].buffer].bytes);
    EXPECT_EQ(r.verdict.kind, VerdictKind::oom);
    EXPECT_EQ(r.verdict.op, expected);
    EXPECT_EQ(r.exec.ops_executed, expected + 1);
    EXPECT_FALSE(r.exec.fatal);
    EXPECT_TRUE(fake.last_error().ok());  // the OOM was cleared
    // Everything the case held came back; the next case is clean.
    EXPECT_EQ(r.exec.device->leaked, 0u);
    EXPECT_EQ(run_case(s, backend, false).verdict.kind, VerdictKind::pass);
  }
}

TEST_F(CudaBackendTest, TheCachingModelsRetryLadderAbsorbsAOneOffOom) {
  // PyTorch's allocator frees its cache and retries once before it gives up: a single failed
  // cudaMalloc on the real device is recovered the way the model says.
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet());
  Scenario s = example();
  s.allocator.mode = AllocatorMode::caching;
  const CaseResult warm = run_case(s, backend, false);
  ASSERT_EQ(warm.verdict.kind, VerdictKind::pass);
  fake.arm_oom(5);
  const CaseResult r = run_case(s, backend, false);
  EXPECT_FALSE(r.exec.oom);
  EXPECT_EQ(r.exec.final_stats.num_alloc_retries, warm.exec.final_stats.num_alloc_retries + 1);
  EXPECT_EQ(r.verdict.kind, VerdictKind::pass);
  EXPECT_EQ(r.exec.device->leaked, 0u);
}

TEST_F(CudaBackendTest, AStickyErrorEndsTheCaseAndPoisonsTheBackend) {
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet());
  const Scenario s = example();
  fake.arm_sticky(3);
  const CaseResult r = run_case(s, backend, false);
  EXPECT_EQ(r.verdict.kind, VerdictKind::error);
  ASSERT_TRUE(r.exec.error);
  EXPECT_NE(r.exec.error->find("illegal memory access"), std::string::npos) << *r.exec.error;
  EXPECT_TRUE(r.exec.fatal);
  EXPECT_TRUE(backend.poisoned());
  const CaseResult again = run_case(s, backend, false);
  EXPECT_TRUE(again.exec.fatal);
  EXPECT_NE(again.exec.error->find("unusable"), std::string::npos);
}

TEST_F(CudaBackendTest, StickyErrorsExitThreeAndStopTheCampaign) {
  const CliRun run = run_cli({"run", kExample, "--backend", "fake:sticky_launch=2"});
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(run.output.find("illegal memory access"), std::string::npos) << run.output;
  const CliRun fuzz = run_cli({"fuzz", "--cases", "6", "--backend", "fake:sticky_launch=2", "--vram", "24GiB"});
  EXPECT_EQ(fuzz.exit_code, 3) << fuzz.output;
  EXPECT_NE(fuzz.output.find("fuzz: 1 cases"), std::string::npos) << fuzz.output;
}

TEST_F(CudaBackendTest, ABaselineThatDoesNotComeBackIsALeakWarning) {
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet());
  const Scenario s = generated(AllocatorMode::async, 5);
  fake.set_leak_on_trim(8 * MiB);
  const CaseResult r = run_case(s, backend, false);
  ASSERT_TRUE(r.exec.device);
  EXPECT_GE(r.exec.device->leaked, 8 * MiB);
  ASSERT_FALSE(r.exec.warnings.empty());
  EXPECT_NE(r.exec.warnings.front().find("did not come back"), std::string::npos);
  EXPECT_FALSE(r.exec.error);  // a leak is reported, not an error of the case
  // The next case refits the ballast: its card is exact again.
  fake.set_leak_on_trim(0);
  const CaseResult next = run_case(s, backend, false);
  EXPECT_EQ(next.exec.device->free_before, s.device.available());
  EXPECT_EQ(next.exec.device->leaked, 0u);
}

// ---- transfers --------------------------------------------------------------------------------

TEST_F(CudaBackendTest, PinnedBufferIsAllocatedOnceAndReused) {
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet());
  const Scenario s = example();
  const CaseResult a = run_case(s, backend, false);
  const CaseResult b = run_case(s, backend, false);
  EXPECT_EQ(backend.pinned_allocations(), 1u);
  EXPECT_EQ(fake.counters().host_allocs, 1u);
  Bytes largest = 0;
  std::uint64_t copies = 0;
  for (const Op& op : a.program.ops) {
    if (op.kind != OpKind::h2d) continue;
    largest = std::max(largest, a.program.buffers[op.buffer].bytes);
    copies += a.program.buffers[op.buffer].bytes > 0 ? 1 : 0;
  }
  EXPECT_GE(backend.pinned_bytes(), largest);
  EXPECT_EQ(a.exec.device->h2d_copies, copies);
  EXPECT_EQ(fake.counters().h2d_copies, a.exec.device->h2d_copies + b.exec.device->h2d_copies);
  EXPECT_GT(a.exec.device->launches, 0u);
}

TEST_F(CudaBackendTest, TransferSkipIssuesNoCopies) {
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet(Transfer::skip));
  const CaseResult r = run_case(example(), backend, false);
  EXPECT_EQ(fake.counters().h2d_copies, 0u);
  EXPECT_EQ(fake.counters().host_allocs, 0u);
  EXPECT_EQ(r.exec.device->h2d_copies, 0u);
  EXPECT_GT(r.exec.device->memsets, 0u);
  EXPECT_GT(fake.counters().memsets, r.exec.device->memsets);  // the warm-up's memset too
}

// ---- isolation --------------------------------------------------------------------------------

TEST_F(CudaBackendTest, ExecResultsRoundTripThroughJson) {
  FakeRuntime fake(FakeConfig{});
  CudaBackend backend(fake, quiet());
  const Scenario s = example("comfy:oct2025");  // an OOM, so every optional part is there
  const Program p = lower(s, predict(s));
  ExecResult r = backend.execute(s, p, ExecOptions{true});
  r.warnings.push_back("a warning");
  const ExecResult back = exec_result_from_json(exec_result_to_json(r), "test");
  EXPECT_EQ(exec_result_to_json(back), exec_result_to_json(r));
  ASSERT_TRUE(back.oom);
  EXPECT_EQ(back.trace.size(), r.trace.size());
  EXPECT_THROW(exec_result_from_json("{\"schema\": \"other\"}", "x"), InputError);
}

TEST_F(CudaBackendTest, IsolateRunsTheCaseInAChildAndSurvivesItsCrash) {
  const Scenario s = example();
  const Program p = lower(s, predict(s));
  FakeRuntime fake(FakeConfig{});
  CudaBackend in_process(fake, quiet());
  const ExecResult expected = in_process.execute(s, p, ExecOptions{});

  IsolateConfig ok;
  ok.command = {VF_CLI, "exec-case", "--backend", "fake"};
  IsolatedBackend isolated(ok);
  const ExecResult child = isolated.execute(s, p, ExecOptions{});
  ASSERT_FALSE(child.error) << *child.error;
  EXPECT_EQ(child.reserved_peak, expected.reserved_peak);
  EXPECT_EQ(child.stage_reserved_peak, expected.stage_reserved_peak);

  IsolateConfig crash;
  crash.command = {VF_CLI, "exec-case", "--backend", "fake:abort_launch=1"};
  IsolatedBackend crashing(crash);
  const ExecResult dead = crashing.execute(s, p, ExecOptions{});
  ASSERT_TRUE(dead.error);
  EXPECT_NE(dead.error->find("signal 6"), std::string::npos) << *dead.error;
  EXPECT_FALSE(dead.fatal);
  // The parent is unharmed: the next case runs.
  EXPECT_FALSE(isolated.execute(s, p, ExecOptions{}).error);

  // The campaign goes on after crashing children (each case an error verdict), exit 3.
  const CliRun fuzz = run_cli({"fuzz", "--cases", "3", "--backend", "fake:abort_launch=1", "--isolate", "--vram", "24GiB"});
  EXPECT_EQ(fuzz.exit_code, 3) << fuzz.output;
  EXPECT_NE(fuzz.output.find("fuzz: 3 cases"), std::string::npos) << fuzz.output;
}

// ---- CLI and factory --------------------------------------------------------------------------

TEST_F(CudaBackendTest, RunFlagsReachTheBackend) {
  const CliRun skip =
      run_cli({"run", kExample, "--policy", "comfy:dec2025", "--backend", "fake", "--transfer", "skip", "--vram", "16GiB"});
  EXPECT_EQ(skip.exit_code, 0) << skip.output;
  EXPECT_NE(skip.output.find("16 GiB device"), std::string::npos) << skip.output;
  EXPECT_NE(skip.output.find("measured on cuda"), std::string::npos) << skip.output;
  const CliRun bad = run_cli({"run", kExample, "--backend", "fake", "--transfer", "sometimes"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  const CliRun isolated = run_cli({"run", kExample, "--policy", "comfy:dec2025", "--backend", "fake", "--isolate"});
  EXPECT_EQ(isolated.exit_code, 0) << isolated.output;
}

TEST_F(CudaBackendTest, NoGpuIsOneLineAndExitThree) {
  std::string why;
  if (cuda_usable(&why)) GTEST_SKIP() << "a GPU is usable here; the no-GPU path cannot be checked";
  EXPECT_EQ(why.find('\n'), std::string::npos);
  EXPECT_THROW((void)open_cuda_runtime(), InfraError);
  EXPECT_EQ(best_backend(), "sim");
  const CliRun run = run_cli({"run", kExample, "--backend", "cuda", "--isolate"});
  EXPECT_EQ(run.exit_code, 3) << run.output;
}

TEST_F(CudaBackendTest, BallastFollowsADriverThatChargesMoreThanItIsAsked) {
  // Every cudaMalloc charges 3 MiB more than asked: sizing chunks from the sizes alone would end
  // 3 MiB per chunk below the target (a smaller card than the scenario's: false OOMs). The fit
  // measures after each chunk: never below the target, and within a step plus the extra charge.
  FakeConfig cfg;
  cfg.malloc_overcharge = 3 * MiB;
  FakeRuntime fake(cfg);
  CudaBackend backend(fake, quiet());
  Scenario s = example();
  s.device.total = 24 * GiB;
  s.device.context_overhead = 512 * MiB;
  const CaseResult r = run_case(s, backend, false);
  ASSERT_TRUE(r.exec.device);
  const Bytes target = 24 * GiB - 512 * MiB;
  EXPECT_GE(r.exec.device->free_before, target);
  EXPECT_LT(r.exec.device->free_before - target, kBallastStep + 3 * MiB);
  EXPECT_NE(r.verdict.kind, VerdictKind::error) << r.verdict.message;
}

// ---- the device layer -------------------------------------------------------------------------

TEST(CudaDeviceLayer, PagesAreMappedOnePerModelPageAndGiveBackEverything) {
  FakeRuntime fake(FakeConfig{});
  ASSERT_TRUE(fake.init_device(0));
  const Bytes before = fake.charged();
  DeviceSpec spec;
  spec.total = 24 * GiB;
  {
    CudaDeviceLayer layer(fake, spec);
    const auto va = layer.reserve_va(200 * MiB, 2 * MiB);
    ASSERT_TRUE(layer.map_pages(va, 60 * MiB, 20 * MiB));
    EXPECT_EQ(fake.charged() - before, 60 * MiB);
    layer.unmap_pages(va + 20 * MiB, 20 * MiB, 20 * MiB);  // a page in the middle
    EXPECT_EQ(fake.charged() - before, 40 * MiB);
    EXPECT_THROW(layer.unmap_pages(va + 20 * MiB, 20 * MiB, 20 * MiB), CudaFault);  // not mapped any more
    const auto seg = layer.segment_malloc(3 * MiB);
    ASSERT_TRUE(seg);
    EXPECT_EQ(fake.charged() - before, 44 * MiB);
    std::string note;
    EXPECT_EQ(layer.release_all(&note), 43 * MiB);  // what it held as asked for (the fake charged 44)
    EXPECT_NE(note.find("1 segment"), std::string::npos) << note;
  }
  EXPECT_EQ(fake.charged(), before);
  // Out of memory is a `false`, and nothing stays mapped.
  FakeConfig small;
  small.total = 1 * GiB;
  FakeRuntime tiny(small);
  ASSERT_TRUE(tiny.init_device(0));
  CudaDeviceLayer layer(tiny, spec);
  const Bytes held = tiny.charged();
  const auto va = layer.reserve_va(2 * GiB, 2 * MiB);
  EXPECT_FALSE(layer.map_pages(va, 1000 * MiB, 20 * MiB));  // 50 pages; the 26th does not fit
  EXPECT_EQ(tiny.charged(), held);
  EXPECT_TRUE(tiny.last_error().ok());
}

TEST(CudaDeviceLayer, AFailedSetAccessLeavesNothingMappedAndTheRangeFreeable) {
  // The second page's cuMemSetAccess fails after its cuMemMap worked: that page must be unmapped
  // too (its memory would stay charged, and cuMemAddressFree refuses a range still mapped), and
  // the first page rolled back.
  FakeConfig cfg;
  cfg.set_access_fault = 2;
  FakeRuntime fake(cfg);
  ASSERT_TRUE(fake.init_device(0));
  const Bytes before = fake.charged();
  DeviceSpec spec;
  spec.total = 24 * GiB;
  CudaDeviceLayer layer(fake, spec);
  const auto va = layer.reserve_va(200 * MiB, 2 * MiB);
  EXPECT_THROW((void)layer.map_pages(va, 60 * MiB, 20 * MiB), CudaFault);
  EXPECT_EQ(fake.charged(), before);
  EXPECT_EQ(fake.last_error().err, Err::invalid);  // not sticky: cleared by reading it
  EXPECT_TRUE(fake.last_error().ok());
  EXPECT_NO_THROW(layer.release_va(va, 200 * MiB));
}

TEST(FakeRuntime, SpecsParseAndRejectTypos) {
  const FakeConfig c = parse_fake_spec(
      "fake:total=80GiB,context=300MiB,sticky_launch=4,leak_on_trim=2MiB,set_access_fault=3,overcharge=1MiB", "--backend");
  EXPECT_EQ(c.set_access_fault, 3u);
  EXPECT_EQ(c.malloc_overcharge, 1 * MiB);
  EXPECT_EQ(c.total, 80 * GiB);
  EXPECT_EQ(c.context_cost, 300 * MiB);
  EXPECT_EQ(c.sticky_at_launch, 4u);
  EXPECT_EQ(c.leak_on_trim, 2 * MiB);
  EXPECT_THROW(parse_fake_spec("fake:totl=1GiB", "--backend"), InputError);
  EXPECT_THROW(parse_fake_spec("fake:total", "--backend"), InputError);
  EXPECT_FALSE(is_fake_spec("fakes"));
}

// ---- the GPU check on the fake ----------------------------------------------------------------

TEST(GpuCheck, RunsEverySectionOnTheFakeAndWritesTheSchema) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("vf-gpu-check-{}", ::getpid());
  std::filesystem::remove_all(dir);
  const CliRun run = run_cli({"gpu-check", "--out", dir.string(), "--fake", "1", "--quick", "--cases", "2", "--fuzz-time", "4s"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream in(dir / "gpu-check.json");
  ASSERT_TRUE(in) << "no gpu-check.json";
  const nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["schema"], "vramfuzz.gpu-check/1");
  EXPECT_EQ(doc["runtime"]["kind"], "fake");
  for (const char* name : {"calibration", "kernels", "agreement", "fuzz"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(doc["sections"].contains(name));
    const auto& s = doc["sections"][name];
    EXPECT_TRUE(s["status"] == "ok" || s["status"] == "partial") << s.dump();
    EXPECT_TRUE(s.contains("seconds"));
  }
  const auto& cal = doc["sections"]["calibration"];
  EXPECT_EQ(cal["context"]["context_overhead"], 512 * MiB + 2 * MiB);  // the fake's context + module
  EXPECT_EQ(cal["suggested"]["context_overhead"], 512 * MiB + 2 * MiB);
  EXPECT_EQ(cal["context"]["own_buffers_model_charge"], 4 * MiB);  // a 512 B tensor's page + the 2 MiB scratch
  EXPECT_EQ(cal["context"]["own_buffers_measured_charge"], 4 * MiB);
  EXPECT_EQ(cal["context"]["other_processes_before_context"]["processes"], 0);
  EXPECT_FALSE(cal.contains("errors"));
  EXPECT_EQ(cal["cudamalloc"][0]["charged"], 2 * MiB);                  // 1 B costs a page
  EXPECT_EQ(cal["async_pool"].size(), 3u);
  EXPECT_EQ(cal["suggested"]["pool_granularity"], 2 * MiB);
  for (const auto& p : cal["async_pool"]) {
    EXPECT_EQ(p["fit"]["step"], 2 * MiB) << p["fit"].dump();  // the fake's pool is the sim's at 2 MiB
    EXPECT_GE(p["fit"]["steps_compared"].get<int>(), 50);
  }
  EXPECT_EQ(cal["vmm_granularity"]["minimum"], 2 * MiB);
  EXPECT_TRUE(cal["nvml"].contains("latency_running_processes"));
  const auto& ker = doc["sections"]["kernels"];
  EXPECT_EQ(ker["correctness"].size(), 24u);
  EXPECT_EQ(ker["correctness_summary"]["mismatches"], 0);
  EXPECT_EQ(ker["correctness_summary"]["unwritten"], 0);
  EXPECT_GE(ker["bandwidth"].size(), 11u);
  const auto& agr = doc["sections"]["agreement"];
  ASSERT_EQ(agr["modes"].size(), 7u);  // the classic path in 4 modes, dynamic VRAM in 3
  for (const char* dynamic : {"sep2026/raw", "sep2026/caching", "sep2026/async"}) EXPECT_TRUE(agr["modes"].contains(dynamic)) << dynamic;
  for (const auto& [mode, m] : agr["modes"].items()) {
    SCOPED_TRACE(mode);
    EXPECT_GE(m["cases"].get<int>(), 1);
    EXPECT_EQ(m["exact"], m["cases"]);  // the fake is the sim: every peak agrees
    EXPECT_EQ(m["errors"], 0);
  }
  EXPECT_GE(doc["sections"]["fuzz"]["cases"].get<int>(), 1);
  EXPECT_TRUE(std::filesystem::exists(dir / "gpu-check.md"));

  // A section run alone merges into the same file; `report` re-renders the Markdown.
  const CliRun again = run_cli({"gpu-check", "--out", dir.string(), "--fake", "1", "--quick", "--section", "calibration"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  std::ifstream in2(dir / "gpu-check.json");
  const nlohmann::json doc2 = nlohmann::json::parse(in2);
  EXPECT_TRUE(doc2["sections"].contains("fuzz"));
  EXPECT_EQ(run_cli({"gpu-check", "--out", dir.string(), "--section", "report"}).exit_code, 0);
  std::filesystem::remove_all(dir);
}

// Memory another process holds is in every device-wide reading: the check measures it but does
// not suggest a context overhead that would carry it into the simulator's defaults.
TEST(GpuCheck, DoesNotSuggestAContextOverheadWhileAnotherProcessHoldsMemory) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("vf-gpu-check-others-{}", ::getpid());
  std::filesystem::remove_all(dir);
  const CliRun run = run_cli({"gpu-check", "--out", dir.string(), "--fake", "fake:others=3GiB", "--quick", "--section", "calibration"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream in(dir / "gpu-check.json");
  const nlohmann::json cal = nlohmann::json::parse(in)["sections"]["calibration"];
  EXPECT_EQ(cal["context"]["other_processes_before_context"]["used"], 3 * GiB);
  EXPECT_EQ(cal["context"]["context_overhead"], 3 * GiB + 512 * MiB + 2 * MiB);  // device-wide: others included
  EXPECT_TRUE(cal["suggested"]["context_overhead"].is_null());
  EXPECT_NE(cal["suggested"]["context_overhead_note"].get<std::string>().find("1 other process(es) held 3221225472 B"),
            std::string::npos);
  EXPECT_EQ(cal["suggested"]["pool_granularity"], 2 * MiB);  // the pool sweep is not device-wide
  std::filesystem::remove_all(dir);
}

// ci/gpu-check.sh's hard limit sends SIGTERM (then SIGKILL 10 s later): the running section stops
// at its next check and writes what it measured, marked partial and stopped by the signal.
TEST(GpuCheck, SigtermStopsTheSectionAndKeepsWhatItMeasured) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("vf-gpu-check-term-{}", ::getpid());
  std::filesystem::remove_all(dir);
  const std::string cmd = fmt::format("timeout -s TERM 3 '{}' gpu-check --out '{}' --fake 1 --section agreement --cases 100000 "
                                      ">/dev/null 2>&1",
                                      VF_CLI, dir.string());
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 124);  // timeout's "the time limit was reached"
  std::ifstream in(dir / "gpu-check.json");
  ASSERT_TRUE(in);
  const nlohmann::json agr = nlohmann::json::parse(in)["sections"]["agreement"];
  EXPECT_EQ(agr["status"], "partial");
  EXPECT_NE(agr.value("stopped_by", "").find("SIGTERM"), std::string::npos) << agr.dump().substr(0, 400);
  ASSERT_TRUE(agr["modes"].contains("raw"));
  EXPECT_GE(agr["modes"]["raw"]["cases"].get<int>(), 1);
  EXPECT_EQ(agr["modes"]["raw"]["rows"].size(), agr["modes"]["raw"]["cases"].get<std::size_t>());
  EXPECT_TRUE(agr["modes"]["raw"]["stopped_by_time_box"].get<bool>());
  std::filesystem::remove_all(dir);
}

// ---- fit_pool_step: the growth step that reproduces a pool sweep --------------------------------

using Json = nlohmann::ordered_json;

const std::vector<Bytes> kSweepSizes = {512, 4 * KiB, 1 * MiB, 1 * MiB, 1 * MiB, 1 * MiB, 2 * MiB, 3 * MiB, 17 * MiB, 33 * MiB, 100 * MiB,
                                        1 * MiB, 1 * MiB, 1 * MiB, 1 * MiB};

Json sweep_of(const std::vector<Bytes>& reserved, const Json& threshold = "UINT64_MAX") {
  Json steps = Json::array();
  for (std::size_t i = 0; i < reserved.size(); ++i) steps.push_back({{"size", kSweepSizes[i]}, {"reserved", reserved[i]}});
  return {{"release_threshold", threshold}, {"reserved_at_start", 0}, {"steps", steps}};
}

// A driver growing the pool like the simulator with 32 MiB chunks: 32 MiB for the first 512 B,
// then every request is served from the open chunk or grows by whole chunks (a request straddles
// the free tail and new chunks).
TEST(FitPoolStep, FindsTheStepThatReproducesEveryRequest) {
  std::vector<Bytes> reserved;
  Bytes used = 0;
  Bytes res = 0;
  for (Bytes size : kSweepSizes) {
    used += round_up(size, 512);
    res = std::max(res, round_up(used, 32 * MiB));
    reserved.push_back(res);
  }
  ASSERT_EQ(reserved[0], 32 * MiB);
  ASSERT_EQ(reserved[10], 160 * MiB);  // 159 MiB + 4.5 KiB used after the 100 MiB request
  const Json fit = fit_pool_step(sweep_of(reserved));
  EXPECT_EQ(fit["steps_compared"], kSweepSizes.size());
  EXPECT_EQ(fit["candidates"], 64);  // 2 MiB .. 128 MiB
  EXPECT_EQ(fit["matches"], Json::array({32 * MiB}));
  EXPECT_EQ(fit["step"], 32 * MiB);
}

// The review's counter-example to the gcd of the growths: small requests grow the pool by 32 MiB,
// a request that does not fit grows it by its own size rounded to 2 MiB. The growths (32, 34,
// 100 MiB) have a gcd of 2 MiB, which would have "confirmed" the placeholder; no step reproduces
// the sweep, so none is suggested and the closest candidate shows where the model parts.
TEST(FitPoolStep, SuggestsNothingWhenNoStepReproducesTheSweep) {
  std::vector<Bytes> reserved;
  Bytes used = 0;
  Bytes res = 0;
  for (Bytes size : kSweepSizes) {
    const Bytes r = round_up(size, 512);
    if (used + r > res) res += size < 32 * MiB ? 32 * MiB : round_up(r, 2 * MiB);
    used += r;
    reserved.push_back(res);
  }
  ASSERT_EQ(reserved[8], 32 * MiB);   // 24.5 MiB used: still the first chunk
  ASSERT_EQ(reserved[9], 66 * MiB);   // 33 MiB: its own 34 MiB
  ASSERT_EQ(reserved[10], 166 * MiB); // 100 MiB: its own 100 MiB
  const Json fit = fit_pool_step(sweep_of(reserved));
  EXPECT_TRUE(fit["matches"].empty());
  EXPECT_TRUE(fit["step"].is_null());
  ASSERT_TRUE(fit["closest"].is_object());
  EXPECT_EQ(fit["closest"]["step"], 32 * MiB);
  EXPECT_EQ(fit["closest"]["matched_requests"], 9);
  EXPECT_EQ(fit["closest"]["first_mismatch"]["device_reserved"], 66 * MiB);
  EXPECT_EQ(fit["closest"]["first_mismatch"]["model_reserved"], 64 * MiB);
}

// A request that failed on the device ends the comparison there; a sweep with nothing to compare
// suggests nothing.
TEST(FitPoolStep, StopsAtAFailedRequest) {
  Json sweep = sweep_of({2 * MiB, 2 * MiB, 2 * MiB}, 0);
  sweep["steps"].push_back({{"size", 64 * GiB}, {"error", "cudaErrorMemoryAllocation"}});
  const Json fit = fit_pool_step(sweep);
  EXPECT_EQ(fit["steps_compared"], 3);
  EXPECT_EQ(fit["step"], 2 * MiB);
  const Json none = fit_pool_step(Json{{"release_threshold", "UINT64_MAX"}, {"steps", Json::array()}});
  EXPECT_TRUE(none["step"].is_null());
  EXPECT_EQ(none["note"], "no request of the sweep succeeded");
}

}  // namespace
}  // namespace vf::cuda

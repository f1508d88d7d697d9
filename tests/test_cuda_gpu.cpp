// The cuda backend on a real GPU (label `gpu`; built only with nvcc). Small scenarios on both
// backends, simulated and measured allocator peaks compared. Without a usable GPU every test is
// SKIPPED with the reason, never passed. ci/gpu-check.sh measures the same at scale.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "harness/campaign.h"
#include "harness/core/error.h"
#include "harness/cuda/backend.h"
#include "harness/cuda/runtime.h"
#include "harness/oracle.h"

namespace vf::cuda {
namespace {

const std::string kExample = std::string(VF_SOURCE_DIR) + "/docs/examples/flux2-te-fp8-fp32-12gib.json";

class CudaGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_usable(&why)) {
      GTEST_SKIP() << why << "; the cuda backend was NOT tested on a device";
    }
    CudaBackendConfig cfg;
    cfg.transfer = Transfer::skip;
    backend_ = std::make_unique<CudaBackend>(open_cuda_runtime(), cfg);
  }
  Scenario example(AllocatorMode mode) {
    Scenario s = load_case_file(kExample, catalog_);
    s.policy = parse_policy("comfy:dec2025", "test");
    s.allocator.mode = mode;
    s.allocator.options.clear();
    return s;
  }
  Catalog catalog_;
  std::unique_ptr<CudaBackend> backend_;
};

TEST_F(CudaGpu, SimAndDevicePeaksAgreeOnASmallScenario) {
  SimBackend sim;
  for (const AllocatorMode mode : kAllAllocatorModes) {
    SCOPED_TRACE(allocator_mode_name(mode));
    const Scenario s = example(mode);
    const CaseResult a = run_case(s, sim, false);
    const ExecResult b = backend_->execute(s, a.program, ExecOptions{});
    ASSERT_FALSE(b.error) << *b.error;
    ASSERT_TRUE(b.device);
    const double diff = (static_cast<double>(b.reserved_peak) - static_cast<double>(a.exec.reserved_peak)) / MiB;
    std::printf("%-20s sim %10.2f MiB  device %10.2f MiB  diff %+8.2f MiB  (%s)\n", std::string(allocator_mode_name(mode)).c_str(),
                to_mib(a.exec.reserved_peak), to_mib(b.reserved_peak), diff, b.environment.c_str());
    EXPECT_EQ(b.oom.has_value(), a.exec.oom.has_value());
    EXPECT_EQ(b.device->leaked, 0u) << (b.warnings.empty() ? "" : b.warnings.front());
    if (mode == AllocatorMode::caching || mode == AllocatorMode::caching_expandable) {
      // The same model drives the real memory: its reserved bytes are the same by construction,
      // and the device had them.
      EXPECT_EQ(b.reserved_peak, a.exec.reserved_peak);
      EXPECT_EQ(b.stage_reserved_peak, a.exec.stage_reserved_peak);
    } else {
      // The driver decides: raw page packing and the async pool's growth step are what the
      // simulator models (and gpu-check calibrates). Within 64 MiB or 2% on this small case.
      const double tolerance = std::max(64.0, 0.02 * to_mib(a.exec.reserved_peak));
      EXPECT_LE(std::abs(diff), tolerance);
    }
  }
}

TEST_F(CudaGpu, TheBallastEmulatesTheScenarioCard) {
  const Scenario s = example(AllocatorMode::raw);
  const CaseResult r = run_case(s, *backend_, false);
  ASSERT_TRUE(r.exec.device);
  EXPECT_GE(r.exec.device->free_before, s.device.available());
  EXPECT_LT(r.exec.device->free_before - s.device.available(), kBallastStep);
  EXPECT_GT(r.exec.device->samples, 0u);
}

TEST_F(CudaGpu, CopiesAndKernelsRunOnRealBuffers) {
  CudaBackendConfig cfg;
  cfg.transfer = Transfer::copy;
  backend_.reset();  // one backend (one ballast) at a time
  CudaBackend copying(open_cuda_runtime(), cfg);
  const CaseResult r = run_case(example(AllocatorMode::caching), copying, false);
  ASSERT_FALSE(r.exec.error) << *r.exec.error;
  EXPECT_GT(r.exec.device->h2d_copies, 0u);
  EXPECT_GT(r.exec.device->launches, 0u);
  EXPECT_EQ(copying.pinned_allocations(), 1u);
}

}  // namespace
}  // namespace vf::cuda

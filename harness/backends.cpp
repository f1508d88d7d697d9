// make_backend: the one place that knows every backend. Built into vf_backends (with vf_cuda),
// so the pipeline library vf_harness stays free of anything CUDA.
#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/cuda/backend.h"
#include "harness/cuda/isolate.h"
#include "harness/cuda/runtime_fake.h"
#include "harness/exec.h"

namespace vf {

std::string best_backend() { return cuda::cuda_usable(nullptr) ? "cuda" : "sim"; }

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  if (name == "auto") return make_backend(best_backend(), options);
  const bool known = name == "sim" || name == "cuda" || cuda::is_fake_spec(name);
  if (!known) throw InputError("--backend", fmt::format("unknown backend \"{}\" (use sim, cuda or auto)", name));
  const cuda::Transfer transfer = cuda::parse_transfer(options.transfer, "--transfer");
  if (options.isolate) {
    // Each case in a child process of this very binary (harness/cuda/isolate.h). The parent
    // checks the device is usable first, so "no GPU" stays a one-line exit 3 here.
    std::string why;
    if (name == "cuda" && !cuda::cuda_usable(&why)) throw InfraError(fmt::format("cuda backend: {}", why));
    cuda::IsolateConfig cfg;
    cfg.command = {cuda::self_executable(), "exec-case", "--backend", std::string(name), "--transfer", options.transfer};
    cfg.name = cuda::is_fake_spec(name) ? "cuda" : std::string(name);
    return std::make_unique<cuda::IsolatedBackend>(std::move(cfg));
  }
  if (name == "sim") return std::make_unique<SimBackend>();
  cuda::CudaBackendConfig cfg;
  cfg.transfer = transfer;
  if (name == "cuda") return std::make_unique<cuda::CudaBackend>(cuda::open_cuda_runtime(), cfg);
  // The cuda backend on the simulator-backed fake runtime: the whole orchestration without a GPU.
  return std::make_unique<cuda::CudaBackend>(std::make_unique<cuda::FakeRuntime>(cuda::parse_fake_spec(name, "--backend")),
                                             cfg);
}

}  // namespace vf

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/exec.h"

namespace vf {

std::string best_backend() { return "sim"; }

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "sim") return std::make_unique<SimBackend>();
  if (name == "auto") return make_backend(best_backend());
  if (name == "cuda") {
#ifdef VF_HAVE_CUDA
    throw InfraError("the cuda backend is not implemented yet in this build; use --backend sim");
#else
    throw InfraError("this build has no CUDA backend (configured without nvcc); use --backend sim");
#endif
  }
  throw InputError("--backend", fmt::format("unknown backend \"{}\" (use sim, cuda or auto)", name));
}

}  // namespace vf

// `--isolate`: every case runs in a child process (the same binary's hidden `exec-case`
// subcommand, posix_spawn'ed), so a crash, an abort, a hang or a sticky CUDA error costs one case
// and not the campaign. The scenario goes to the child through a temporary file; the child
// predicts and lowers it again (pure functions: the same program, checked by its op count) and
// writes its ExecResult back as JSON (`vramfuzz.exec-result/1`). A child that dies without a
// result is the case's `error` verdict, never a dead campaign. Works with any backend name.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "harness/exec.h"

namespace vf::cuda {

inline constexpr std::string_view kExecResultSchema = "vramfuzz.exec-result/1";

std::string exec_result_to_json(const ExecResult& r);
// Throws InputError(origin) when the text is not an exec result.
ExecResult exec_result_from_json(std::string_view text, std::string_view origin);

struct IsolateConfig {
  // The child's argv up to its own arguments, e.g. {"/proc/self/exe", "exec-case", "--backend",
  // "cuda"}; the backend appends --scenario FILE --result FILE --ops N [--trace].
  std::vector<std::string> command;
  std::string name = "cuda";  // what name() reports (the backend the child runs)
  double timeout_seconds = 900;
};

class IsolatedBackend final : public Backend {
 public:
  explicit IsolatedBackend(IsolateConfig cfg) : cfg_(std::move(cfg)) {}
  std::string_view name() const override { return cfg_.name; }
  ExecResult execute(const Scenario& s, const Program& p, const ExecOptions& opt) override;

 private:
  IsolateConfig cfg_;
};

// The path of the running executable (/proc/self/exe resolved), for the child's argv.
std::string self_executable();

}  // namespace vf::cuda

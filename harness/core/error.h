// Error kinds and the exit codes they map to. Every user-visible failure goes through one of
// these, so the CLI can keep the contract: 0 nothing found, 1 findings, 2 bad input, 3 fault.
#pragma once

#include <stdexcept>
#include <string>

namespace vf {

enum ExitCode : int {
  kExitOk = 0,        // ran, nothing found
  kExitFindings = 1,  // ran, found violations / OOMs (or a replay reproduced)
  kExitBadInput = 2,  // malformed scenario, unknown dtype, overflowing size, bad flag ...
  kExitInfra = 3,     // the harness itself could not do its job (no GPU, I/O failure, sticky CUDA error)
};

// Bad input. `path` names the offending field the way a user would write it
// (`models[0].tensors[3].shape`), or the flag (`--vram`), or a file and byte offset.
class InputError : public std::runtime_error {
 public:
  InputError(std::string path, const std::string& message)
      : std::runtime_error(path.empty() ? message : path + ": " + message), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The harness could not run the case: missing device, I/O error, broken invariant of a backend.
class InfraError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace vf

// Progress of a long command on stderr: on a terminal, one line redrawn in place (cases/s,
// findings, new signatures, elapsed vs budget) that log lines print around; elsewhere (CI logs,
// pipes) a plain log line every ~10 s.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/sinks/sink.h>

namespace vf::cli {

enum class ProgressMode { tty, plain, off };
// "auto" (tty when stderr is a terminal and TERM is not dumb, else plain), "tty", "plain", "off".
ProgressMode parse_progress_mode(const std::string& text);

struct ProgressState {
  std::uint64_t cases = 0;
  std::uint64_t findings = 0;
  std::uint64_t signatures = 0;
  std::uint64_t new_signatures = 0;
  double elapsed = 0;
};

class Progress {
 public:
  // `label` prefixes the line ("fuzz", "calibrate"); the budget is cases or seconds (0: none).
  Progress(ProgressMode mode, std::string label, std::uint64_t case_budget, double seconds_budget);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void update(const ProgressState& s);  // rate-limited
  void finish();                        // clears the line; log lines print normally again

  // Used by the log sink wrapper: erase the line before a log line, draw it again after.
  void clear();
  void redraw();

 private:
  std::string line() const;
  ProgressMode mode_;
  std::string label_;
  std::uint64_t case_budget_;
  double seconds_budget_;
  ProgressState last_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
  std::chrono::steady_clock::time_point last_log_;
  std::vector<std::shared_ptr<spdlog::sinks::sink>> saved_sinks_;
};

}  // namespace vf::cli

#include "harness/cli/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/core/error.h"

namespace vf::cli {
namespace {

// Forwards to the logger's own sink, with the progress line taken down while the message prints.
class AroundProgressSink final : public spdlog::sinks::sink {
 public:
  AroundProgressSink(std::shared_ptr<spdlog::sinks::sink> inner, Progress* progress)
      : inner_(std::move(inner)), progress_(progress) {}
  void log(const spdlog::details::log_msg& msg) override {
    progress_->clear();
    inner_->log(msg);
    inner_->flush();
    progress_->redraw();
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override { inner_->set_formatter(std::move(f)); }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
  Progress* progress_;
};

constexpr double kPlainEverySeconds = 10;
constexpr auto kRedrawEvery = std::chrono::milliseconds(100);

}  // namespace

ProgressMode parse_progress_mode(const std::string& text) {
  if (text == "tty") return ProgressMode::tty;
  if (text == "plain") return ProgressMode::plain;
  if (text == "off") return ProgressMode::off;
  if (text != "auto") throw InputError("--progress", fmt::format("expected auto, tty, plain or off, got \"{}\"", text));
  const char* term = std::getenv("TERM");
  const bool dumb = term == nullptr || std::strcmp(term, "dumb") == 0;
  return ::isatty(STDERR_FILENO) && !dumb ? ProgressMode::tty : ProgressMode::plain;
}

Progress::Progress(ProgressMode mode, std::string label, std::uint64_t case_budget, double seconds_budget)
    : mode_(mode),
      label_(std::move(label)),
      case_budget_(case_budget),
      seconds_budget_(seconds_budget),
      last_log_(std::chrono::steady_clock::now()) {
  if (mode_ != ProgressMode::tty) return;
  auto logger = spdlog::default_logger();
  saved_sinks_ = logger->sinks();
  for (auto& s : logger->sinks()) s = std::make_shared<AroundProgressSink>(s, this);
}

Progress::~Progress() { finish(); }

std::string Progress::line() const {
  const ProgressState& s = last_;
  const double rate = s.elapsed > 0 ? static_cast<double>(s.cases) / s.elapsed : 0.0;
  std::string budget;
  if (seconds_budget_ > 0) {
    budget = fmt::format("{:.0f}/{:.0f} s", s.elapsed, seconds_budget_);
  } else if (case_budget_ > 0) {
    budget = fmt::format("{}/{} cases, {:.0f} s", s.cases, case_budget_, s.elapsed);
  } else {
    budget = fmt::format("{:.0f} s", s.elapsed);
  }
  return fmt::format("{}: {} cases ({:.0f}/s), {} findings, {} signatures, {} new | {}", label_, s.cases, rate, s.findings,
                     s.signatures, s.new_signatures, budget);
}

void Progress::update(const ProgressState& s) {
  last_ = s;
  const auto now = std::chrono::steady_clock::now();
  if (mode_ == ProgressMode::tty) {
    if (now - last_draw_ < kRedrawEvery) return;
    last_draw_ = now;
    redraw();
  } else if (mode_ == ProgressMode::plain) {
    if (std::chrono::duration<double>(now - last_log_).count() < kPlainEverySeconds) return;
    last_log_ = now;
    spdlog::info("{}", line());
  }
}

void Progress::clear() {
  if (mode_ != ProgressMode::tty || !shown_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  shown_ = false;
}

void Progress::redraw() {
  if (mode_ != ProgressMode::tty || last_.cases == 0) return;
  std::fputs(("\r\033[K" + line()).c_str(), stderr);
  std::fflush(stderr);
  shown_ = true;
}

void Progress::finish() {
  clear();
  if (!saved_sinks_.empty()) {
    spdlog::default_logger()->sinks() = saved_sinks_;
    saved_sinks_.clear();
  }
  mode_ = ProgressMode::off;
}

}  // namespace vf::cli

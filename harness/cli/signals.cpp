// The one piece of process-wide mutable state in vramfuzz: a signal handler can only talk to the
// program through a variable, and only a `volatile std::sig_atomic_t` (or a lock-free atomic) may
// be written from it. Everything else reads it through stop_requested(); nothing but the handler
// writes it. Campaigns take the check as a callback (CampaignConfig::should_stop), so the library
// itself has no global state and several campaigns can still run in one process.
#include "harness/cli/signals.h"

#include <signal.h>

#include <csignal>

namespace vf::cli {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal == sig) {
    // The second of the same signal: no more waiting.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking wait returns EINTR and sees the flag
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool stop_requested() { return g_stop_signal != 0; }
int stop_signal() { return g_stop_signal; }

}  // namespace vf::cli

// Clean stops on SIGINT / SIGTERM: the first signal asks the running command to stop after the
// current case (every report is still written, the exit code is the usual one); a second one of
// the same kind ends the process at once, as people expect from a second Ctrl-C.
#pragma once

namespace vf::cli {

// Installs the handlers (idempotent). Call before a long-running command starts.
void install_stop_handlers();
// True once SIGINT or SIGTERM arrived.
bool stop_requested();
// The signal that asked (0 when none).
int stop_signal();

}  // namespace vf::cli

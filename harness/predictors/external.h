// `--policy exec:COMMAND`: a predictor in another process, spoken to over the
// `vramfuzz.predictor/1` protocol (protocol.h, docs/predictor-protocol.md). The process is started
// once per command (through /bin/sh -c, in its own process group), says hello, and then answers
// one request per case; its plan is lowered and executed like a built-in one.
//
// Failures are the case's, not the campaign's: a predictor that does not answer within the
// timeout, exits, or writes a line that is not a reply gives that case an `error` verdict naming
// what went wrong, and is killed and started again for the next case. One that fails on
// `max_failures` cases in a row is given up: every later request fails with `fatal` set, which
// stops a campaign with exit 3 after writing what it found. With requests pipelined (SentAhead
// below), a failure is charged to the request the predictor was on: one that dies or stalls on a
// request sent before the awaited one fails that request (at its own claim), and the awaited case
// is asked again of a fresh process, uncounted.
//
// A file never starts a command: a scenario or repro names its external predictor by the name
// its hello gave, and only a predictor started from the user's flags (`--policy exec:...`) under
// that name can run it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "harness/core/error.h"
#include "harness/predict.h"
#include "harness/predictors/protocol.h"
#include "harness/scenario.h"

namespace vf {

// A request that got no plan. `fatal`: the predictor has been given up (or cannot be started at
// all), so no later case can run either.
class PredictorError : public InfraError {
 public:
  PredictorError(const std::string& message, bool fatal) : InfraError(message), fatal_(fatal) {}
  bool fatal() const { return fatal_; }

 private:
  bool fatal_;
};

struct ExternalSettings {
  double reply_timeout_s = 60.0;  // per request
  double hello_timeout_s = 120.0; // from the start to the hello line (imports can be slow)
  unsigned max_failures = 3;      // failed cases in a row before the predictor is given up
};
// For every predictor started after the call (`--predictor-timeout`).
void set_external_settings(const ExternalSettings& s);
const ExternalSettings& external_settings();

// Starts the predictor `command` (or finds it, started before) and returns its hello. InputError
// (exit 2) when the command is empty; PredictorError (fatal) when it cannot be started or its
// hello is missing or malformed; InputError when another command already said hello under the
// same name (a scenario could not tell them apart).
const PredictorHello& start_external(const std::string& command);

// Whether a predictor started from the flags said hello under `name`.
const PredictorHello* find_external(const std::string& name);

// The command a predictor said hello as `name` was started by ("" if none): what a re-run's
// --policy needs (exec:COMMAND), where a case records only the name.
std::string external_command(const std::string& name);

// For a command that runs one case file (run, plan, replay, shrink): InputError (exit 2) naming
// `policy.overrides.KEY` when the file sets an override its (started) predictor's hello says it
// does not apply. A campaign's corpus replay leaves the check to predict_external instead (that
// case's error verdict: undetermined).
void require_overrides_applied(const Scenario& s);

// A request sent ahead of its claim (pipelining): a campaign sends the next case's request before
// it lowers and executes this one, so the predictor plans while vramfuzz executes. Move-only;
// destroyed unclaimed, it is abandoned (the reply, when it comes, is dropped). Replies still
// arrive in the order the requests were sent, so a predictor needs nothing new to be pipelined.
class SentAhead {
 public:
  SentAhead() = default;
  SentAhead(SentAhead&& o) noexcept { *this = std::move(o); }
  SentAhead& operator=(SentAhead&& o) noexcept;
  SentAhead(const SentAhead&) = delete;
  SentAhead& operator=(const SentAhead&) = delete;
  ~SentAhead() { abandon(); }
  bool sent() const { return id_ != 0; }
  // Sent, and its reply still to be had: not lost with a process that has died since.
  bool live() const;
  // Drops it now (its reply will not be claimed).
  void abandon();

 private:
  friend SentAhead send_external_ahead(const Scenario& s);
  friend Plan predict_external(const Scenario& s, SentAhead* ahead);
  std::string name_;        // the predictor's
  std::uint64_t id_ = 0;    // the request's; 0: nothing sent
  std::uint64_t run_ = 0;   // which start of the process it went to
};

// How many cases past the one being run a campaign or `diff` generates and sends to an external
// predictor: enough that neither side waits on the other's slower cases.
inline constexpr std::size_t kCasesSentAhead = 4;

// Sends `s`'s request to its external predictor now, to be claimed by predict_external(s, &it)
// with the same `s`. Sends nothing (an empty SentAhead) where s is not external or cannot be sent
// as it is (no such predictor, given up, not running, an override it does not apply):
// predict_external then sends it, or says why not, at the claim. Never throws PredictorError.
SentAhead send_external_ahead(const Scenario& s);

// The plan of the predictor `s.policy` names. PredictorError when it gave none (see above);
// InputError when no predictor of that name was started from the flags. With `ahead` (made by
// send_external_ahead from this same `s`) the reply to that request is claimed, if the process it
// went to still runs; otherwise the request is sent now.
Plan predict_external(const Scenario& s, SentAhead* ahead = nullptr);

// What a predictor started from the flags has been sent since it started (or since the last
// stop_external_predictors): requests, those claimed after being sent ahead, and those sent ahead
// and abandoned. Zeros for a name no predictor said hello under.
struct ExternalCounts {
  std::uint64_t requests = 0;
  std::uint64_t claimed_ahead = 0;
  std::uint64_t abandoned = 0;
};
ExternalCounts external_counts(const std::string& name);

// Closes every predictor's stdin and waits briefly for each to exit (then kills it). Called at
// exit; safe to call more than once.
void stop_external_predictors();

}  // namespace vf

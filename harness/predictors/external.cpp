#include "harness/predictors/external.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <algorithm>
#include <map>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/core/json_in.h"

namespace vf {

namespace {

ExternalSettings g_settings;

// The longest line a predictor may write: a plan for a million-module model is tens of MB.
constexpr std::size_t kMaxLineBytes = std::size_t{1} << 30;
// What each pipe asks to hold (F_SETPIPE_SZ; Linux caps it at /proc/sys/fs/pipe-max-size).
constexpr int kPipeBytes = 1 << 20;

using Clock = std::chrono::steady_clock;

std::string shown(std::string_view s, std::size_t max = 120) {
  std::string out;
  for (const char c : s.substr(0, max)) out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
  if (s.size() > max) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("stopped (wait status {})", status);
}

// One predictor process: its pipes, its pending output, its hello.
class Process {
 public:
  explicit Process(std::string command) : command_(std::move(command)) {}
  ~Process() { stop(); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  bool running() const { return pid_ > 0; }

  // Starts it and reads its hello. PredictorError (fatal) on failure.
  PredictorHello start() {
    // A predictor that exits while we write must not kill vramfuzz: EPIPE instead of SIGPIPE.
    static const bool ignored = [] {
      ::signal(SIGPIPE, SIG_IGN);
      return true;
    }();
    (void)ignored;
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) throw PredictorError(fmt::format("cannot start the predictor: pipe: {}", std::strerror(errno)), true);
    if (::pipe2(out, O_CLOEXEC) != 0) {
      ::close(in[0]);
      ::close(in[1]);
      throw PredictorError(fmt::format("cannot start the predictor: pipe: {}", std::strerror(errno)), true);
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      for (const int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
      throw PredictorError(fmt::format("cannot start the predictor: fork: {}", std::strerror(err)), true);
    }
    if (pid == 0) {
      // Only async-signal-safe calls until exec.
      ::setpgid(0, 0);
      ::signal(SIGPIPE, SIG_DFL);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execl("/bin/sh", "sh", "-c", command_.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here: whichever runs first
    ::close(in[0]);
    ::close(out[1]);
    pid_ = pid;
    to_ = in[1];
    from_ = out[0];
    ::fcntl(to_, F_SETFL, ::fcntl(to_, F_GETFL) | O_NONBLOCK);
    ::fcntl(from_, F_SETFL, ::fcntl(from_, F_GETFL) | O_NONBLOCK);
    ++runs_;
    // Room for a request or two to wait in the pipes while the other side is busy (best effort:
    // the default 64 KiB stays where the system refuses).
    ::fcntl(to_, F_SETPIPE_SZ, kPipeBytes);
    ::fcntl(from_, F_SETPIPE_SZ, kPipeBytes);
    std::string line;
    const std::string got = read_line(line, deadline_in(g_settings.hello_timeout_s), g_settings.hello_timeout_s, 0);
    if (!got.empty()) {
      kill_now();
      throw PredictorError(fmt::format("predictor `{}` said no hello: {}", shown(command_), got), true);
    }
    nlohmann::json doc;
    try {
      doc = parse_json_unique(line);
    } catch (const std::exception& e) {
      kill_now();
      throw PredictorError(fmt::format("predictor `{}`: its first line is not JSON ({}): \"{}\"", shown(command_), e.what(), shown(line)), true);
    }
    try {
      return parse_hello(doc, "hello");
    } catch (const InputError& e) {
      kill_now();
      throw PredictorError(fmt::format("predictor `{}`: {}", shown(command_), e.what()), true);
    }
  }

  // Queues request `id` (one line, '\n'-terminated) and writes as much of it as the pipe takes now;
  // the rest goes out while a reply is awaited. Requests are answered in the order sent.
  void send(std::uint64_t id, const std::string& request) {
    out_.append(request);
    queued_ += request.size();
    in_flight_.push_back(InFlight{id, queued_ - request.size(), queued_, false});
    if (broken_.empty()) flush();
  }

  // Waits for the reply to request `id` (sent, not yet claimed) into `line`, writing what is still
  // queued meanwhile. The replies to requests sent before it are kept for their own claims (or
  // dropped, if abandoned). Each request gets `timeout_s` from the reply before it: the predictor
  // answers in order, so a request queued behind others starts when they are done. "" on
  // success, else what went wrong (the process is then killed, every request in flight lost, and
  // failed_on() says which request the predictor was on).
  std::string await(std::uint64_t id, std::string& line, double timeout_s) {
    failed_on_ = 0;
    if (const auto it = replies_.find(id); it != replies_.end()) {
      line = std::move(it->second);
      replies_.erase(it);
      return "";
    }
    for (;;) {
      const std::uint64_t head = in_flight_.empty() ? 0 : in_flight_.front().id;
      std::string got;
      if (std::string err = read_line(got, deadline_in(timeout_s), timeout_s, id); !err.empty()) {
        failed_on_ = head;
        return err;
      }
      if (in_flight_.empty()) {
        kill_now();
        return fmt::format("wrote a line no request asked for: \"{}\"", shown(got));
      }
      const InFlight f = in_flight_.front();
      if (written_ < f.end) {
        // A reply before the whole request was written to the pipe: a protocol error on its own.
        // (What the pipe holds unread cannot be told apart from what the predictor has read.)
        kill_now();
        failed_on_ = f.id;
        return fmt::format("replied before reading the whole request ({} of {} bytes)", written_ - f.begin, f.end - f.begin);
      }
      in_flight_.pop_front();
      if (f.id == id) {
        line = std::move(got);
        return "";
      }
      if (!f.abandoned) replies_[f.id] = std::move(got);
    }
  }

  // The request the predictor was working on when the last await failed (0: none, or no request).
  std::uint64_t failed_on() const { return failed_on_; }

  // Request `id` will not be claimed: its reply, kept or still to come, is dropped.
  void abandon(std::uint64_t id) {
    replies_.erase(id);
    for (InFlight& f : in_flight_) {
      if (f.id == id) f.abandoned = true;
    }
  }

  // Whether request `id` of this process's current run has a reply kept or still to come.
  bool pending(std::uint64_t id) const {
    if (replies_.count(id)) return true;
    return std::any_of(in_flight_.begin(), in_flight_.end(), [id](const InFlight& f) { return f.id == id && !f.abandoned; });
  }

  // Counts the process's starts: a request sent before a restart was lost with the process.
  std::uint64_t run() const { return runs_; }

  // Kills the process group at once and reaps it.
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);
    int status = 0;
    while (!reaped_ && ::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    close_fds();
  }

  // Closes its stdin, gives it a moment to exit on its own, then kills it.
  void stop() {
    if (pid_ <= 0) return;
    if (reaped_) {
      kill_now();
      return;
    }
    if (to_ >= 0) ::close(to_);
    to_ = -1;
    const auto until = Clock::now() + std::chrono::milliseconds(2000);
    int status = 0;
    while (Clock::now() < until) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno != EINTR)) {
        // Reaped: kill whatever it left behind in its group. Not ours to reap (ECHILD): its pid
        // may already be another process's, so nothing is signalled.
        if (r == pid_) ::kill(-pid_, SIGKILL);
        pid_ = -1;
        close_fds();
        return;
      }
      // Replies to requests sent ahead and not needed are read and dropped, so that a predictor
      // still answering them is not blocked on a full pipe instead of reaching its end of input.
      if (from_ >= 0) {
        char chunk[65536];
        while (Clock::now() < until && ::read(from_, chunk, sizeof chunk) > 0) {
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill_now();
  }

 private:
  struct InFlight {
    std::uint64_t id;
    std::uint64_t begin, end;  // its bytes in the stream written to the process
    bool abandoned;
  };

  static Clock::time_point deadline_in(double seconds) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }

  // Writes queued bytes until the pipe is full. A failed write (EPIPE: the process closed its
  // stdin or exited) is kept in broken_ for the next read_line to report.
  void flush() {
    while (out_pos_ < out_.size()) {
      const ssize_t w = ::write(to_, out_.data() + out_pos_, out_.size() - out_pos_);
      if (w > 0) {
        out_pos_ += static_cast<std::size_t>(w);
        written_ += static_cast<std::uint64_t>(w);
      } else if (w < 0 && errno == EINTR) {
        continue;
      } else {
        if (w < 0 && errno != EAGAIN) broken_ = std::strerror(errno);
        break;
      }
    }
    if (out_pos_ == out_.size() || !broken_.empty()) {
      out_.clear();
      out_pos_ = 0;
    } else if (out_pos_ > (std::size_t{1} << 20) && out_pos_ > out_.size() / 2) {
      out_.erase(0, out_pos_);
      out_pos_ = 0;
    }
  }

  // Reads the process's next line into `line` by `deadline`, writing what is queued meanwhile.
  // `awaited`: the request whose reply is wanted (0: the hello), for the messages. "" on success,
  // else what went wrong (the process is then killed).
  std::string read_line(std::string& line, Clock::time_point deadline, double timeout_s, std::uint64_t awaited) {
    std::size_t scanned = 0;
    char chunk[65536];
    for (;;) {
      if (const auto nl = buffer_.find('\n', scanned); nl != std::string::npos) {
        line.assign(buffer_, 0, nl);
        buffer_.erase(0, nl + 1);
        return "";
      }
      scanned = buffer_.size();
      if (buffer_.size() > kMaxLineBytes) {
        kill_now();
        return fmt::format("wrote a line longer than {} MiB without a newline", kMaxLineBytes >> 20);
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        std::string earlier;
        if (!in_flight_.empty() && in_flight_.front().id != awaited) {
          earlier = fmt::format("; it had not answered request {} either, sent before it", in_flight_.front().id);
        }
        kill_now();
        return fmt::format("no reply within {:g} s (--predictor-timeout){}", timeout_s, earlier);
      }
      if (!broken_.empty()) {
        // Writing failed (EPIPE). The end of its stdout says it died, unless something it started
        // keeps that open: then its exit does. What it wrote before is read first either way.
        if (!reaped_ && ::waitpid(pid_, &reaped_status_, WNOHANG) == pid_) reaped_ = true;
        if (reaped_) {
          ssize_t got = 0;
          while ((got = ::read(from_, chunk, sizeof chunk)) > 0) buffer_.append(chunk, static_cast<std::size_t>(got));
          if (buffer_.find('\n', scanned) != std::string::npos) continue;
          return died(fmt::format("stopped reading its stdin ({})", broken_));
        }
      }
      const int wait_ms = static_cast<int>(std::min<std::int64_t>(
          1 + std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count(), broken_.empty() ? 1000 : 50));
      pollfd fds[2];
      int n = 0;
      fds[n++] = pollfd{from_, POLLIN, 0};
      if (out_pos_ < out_.size() && broken_.empty()) fds[n++] = pollfd{to_, POLLOUT, 0};
      const int r = ::poll(fds, static_cast<nfds_t>(n), wait_ms);
      if (r < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        kill_now();
        return fmt::format("poll failed: {}", std::strerror(err));
      }
      if (n == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) flush();
      if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
        const ssize_t got = ::read(from_, chunk, sizeof chunk);
        if (got > 0) {
          buffer_.append(chunk, static_cast<std::size_t>(got));
        } else if (got == 0) {
          // A write that failed (EPIPE: it closed its stdin or exited) is reported once the replies
          // it wrote before are read; its status says which.
          if (!broken_.empty()) return died(fmt::format("stopped reading its stdin ({})", broken_));
          return died(buffer_.empty() ? "closed its stdout"
                                      : fmt::format("closed its stdout after \"{}\" without a newline", shown(buffer_)));
        } else if (errno != EAGAIN && errno != EINTR) {
          const int err = errno;
          kill_now();
          return fmt::format("read failed: {}", std::strerror(err));
        }
      }
    }
  }

  // The process is gone (or going): its exit status, reaped within a second, completes `what`.
  std::string died(const std::string& what) {
    int status = reaped_status_;
    pid_t r = reaped_ ? pid_ : 0;
    const auto until = Clock::now() + std::chrono::milliseconds(1000);
    while (!reaped_ && (r = ::waitpid(pid_, &status, WNOHANG)) == 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::string msg = what;
    if (r == pid_) {
      msg += "; it " + describe_status(status);
      ::kill(-pid_, SIGKILL);
      pid_ = -1;
      close_fds();
    } else {
      kill_now();
    }
    return msg;
  }

  void close_fds() {
    if (to_ >= 0) ::close(to_);
    if (from_ >= 0) ::close(from_);
    to_ = from_ = -1;
    pid_ = -1;
    buffer_.clear();
    out_.clear();
    out_pos_ = 0;
    written_ = queued_ = 0;
    broken_.clear();
    reaped_ = false;
    reaped_status_ = 0;
    in_flight_.clear();
    replies_.clear();
  }

  std::string command_;
  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
  std::string buffer_;  // read, not yet a whole line
  std::string out_;     // queued for writing from out_pos_
  std::size_t out_pos_ = 0;
  std::uint64_t written_ = 0, queued_ = 0;  // bytes written to and queued for the process
  std::string broken_;                      // why writing failed
  bool reaped_ = false;                     // after broken_: it has exited and been waited for
  int reaped_status_ = 0;
  std::deque<InFlight> in_flight_;          // sent, reply not yet read: the order of the replies
  std::map<std::uint64_t, std::string> replies_;  // read before their claim
  std::uint64_t runs_ = 0;
  std::uint64_t failed_on_ = 0;
};

struct Predictor {
  std::string command;
  PredictorHello hello;
  std::unique_ptr<Process> process;
  unsigned failures = 0;  // cases in a row
  bool given_up = false;
  std::string last_failure;
  std::uint64_t next_id = 1;
  SpecRefs refs;  // the specs this process holds (hello.spec_refs); none after a restart
  // For the closing line: how much of the pipelining worked, and how long vramfuzz waited.
  // `abandoned`: sent ahead and then not needed (a shrink candidate after an accepted one).
  std::uint64_t requests = 0, claimed_ahead = 0, abandoned = 0;
  Clock::duration waited{};
};

class Registry {
 public:
  ~Registry() { stop_all(); }
  std::map<std::string, std::unique_ptr<Predictor>> by_command;
  std::map<std::string, Predictor*> by_name;
  void stop_all() {
    for (auto& [cmd, p] : by_command) {
      if (p->process) p->process->stop();
    }
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

[[noreturn]] void fail_case(Predictor& p, const std::string& what) {
  p.last_failure = what;
  if (++p.failures >= g_settings.max_failures) {
    p.given_up = true;
    if (p.process) p.process->kill_now();
    throw PredictorError(fmt::format("external predictor \"{}\" failed on {} cases in a row, given up; the last: {}", p.hello.name,
                                     p.failures, what),
                         true);
  }
  throw PredictorError(fmt::format("external predictor \"{}\": {}", p.hello.name, what), false);
}

}  // namespace

void set_external_settings(const ExternalSettings& s) { g_settings = s; }
const ExternalSettings& external_settings() { return g_settings; }

const PredictorHello& start_external(const std::string& command) {
  if (command.empty()) throw InputError("--policy", "exec: needs a command (exec:COMMAND, e.g. exec:\"vramfuzz predict-serve\")");
  Registry& reg = registry();
  if (const auto it = reg.by_command.find(command); it != reg.by_command.end()) return it->second->hello;
  auto p = std::make_unique<Predictor>();
  p->command = command;
  p->process = std::make_unique<Process>(command);
  p->hello = p->process->start();
  if (const auto it = reg.by_name.find(p->hello.name); it != reg.by_name.end()) {
    throw InputError("--policy", fmt::format("`{}` and `{}` both say hello as \"{}\": a case names its predictor by that name, so "
                                             "one campaign cannot hold both",
                                             shown(it->second->command), shown(command), p->hello.name));
  }
  spdlog::info("external predictor \"{}\" {} (runtime comfy:{}) started: {}", p->hello.name, p->hello.version,
               preset_name(p->hello.runtime), shown(command));
  Predictor* raw = p.get();
  reg.by_name[p->hello.name] = raw;
  reg.by_command[command] = std::move(p);
  return raw->hello;
}

const PredictorHello* find_external(const std::string& name) {
  Registry& reg = registry();
  const auto it = reg.by_name.find(name);
  return it == reg.by_name.end() ? nullptr : &it->second->hello;
}

std::string external_command(const std::string& name) {
  Registry& reg = registry();
  const auto it = reg.by_name.find(name);
  return it == reg.by_name.end() ? std::string() : it->second->command;
}

void require_overrides_applied(const Scenario& s) {
  if (s.policy.predictor != PredictorKind::external) return;
  const PredictorHello* h = find_external(s.policy.external_name);
  if (!h) return;  // predicting says what to give
  if (const std::string* key = h->unapplied(s.policy)) throw InputError("policy.overrides." + *key, unhonoured_override_message(*h, *key));
}

namespace {

// The predictor `s` names, running and able to take `s`; throws (InputError, PredictorError) why
// not. A restart here resets what the process holds.
Predictor& ready_predictor(const Scenario& s) {
  Registry& reg = registry();
  const auto it = reg.by_name.find(s.policy.external_name);
  if (it == reg.by_name.end()) {
    throw InputError("policy", fmt::format("this case was made with the external predictor \"{}\"{}; vramfuzz never starts a command a "
                                           "file names: give it with --predictor COMMAND (replay, shrink) or --policy exec:COMMAND (run, or "
                                           "another --policy)",
                                           s.policy.external_name,
                                           s.policy.external_version.empty() ? "" : " " + s.policy.external_version));
  }
  Predictor& p = *it->second;
  if (p.hello.runtime != s.policy.preset) {
    throw InputError("policy.runtime", fmt::format("the case is for the runtime comfy:{}; the predictor \"{}\" plans for comfy:{}",
                                                   preset_name(s.policy.preset), p.hello.name, preset_name(p.hello.runtime)));
  }
  if (p.given_up) {
    throw PredictorError(fmt::format("external predictor \"{}\" was given up after {} failed cases in a row; the last: {}", p.hello.name,
                                     p.failures, p.last_failure),
                         true);
  }
  if (!p.process->running()) {
    PredictorHello again;
    try {
      again = p.process->start();
    } catch (const PredictorError& e) {
      fail_case(p, fmt::format("restart failed: {}", e.what()));
    }
    if (again.name != p.hello.name || again.runtime != p.hello.runtime) {
      p.given_up = true;
      p.process->kill_now();
      throw PredictorError(fmt::format("external predictor `{}` came back as \"{}\" (runtime comfy:{}) after a restart, not \"{}\" "
                                       "(comfy:{})",
                                       shown(p.command), again.name, preset_name(again.runtime), p.hello.name, preset_name(p.hello.runtime)),
                           true);
    }
    p.hello.spec_refs = again.spec_refs;
    p.hello.overrides = again.overrides;
    p.refs.reset();
    spdlog::info("external predictor \"{}\" restarted", p.hello.name);
  }
  // A case (read from a file) that sets an override this predictor says it does not apply: it
  // cannot be planned as written. The case's error, not the process's failure.
  if (const std::string* key = p.hello.unapplied(s.policy)) throw PredictorError(unhonoured_override_message(p.hello, *key), false);
  return p;
}

std::uint64_t send_request(Predictor& p, const Scenario& s) {
  const std::uint64_t id = p.next_id++;
  ++p.requests;
  p.process->send(id, p.hello.spec_refs ? request_line(s, id, p.refs) : request_line(s, id));
  return id;
}

}  // namespace

SentAhead& SentAhead::operator=(SentAhead&& o) noexcept {
  if (this != &o) {
    abandon();
    name_ = std::move(o.name_);
    id_ = std::exchange(o.id_, 0);
    run_ = o.run_;
  }
  return *this;
}

namespace {

// The process of predictor `name` if it is still the start `run` (nullptr once it has restarted).
Process* process_in_run(const std::string& name, std::uint64_t run) {
  Registry& reg = registry();
  const auto it = reg.by_name.find(name);
  return it != reg.by_name.end() && it->second->process->run() == run ? it->second->process.get() : nullptr;
}

}  // namespace

void SentAhead::abandon() {
  if (id_ == 0) return;
  // Counted only where its process still runs: one lost with a process that died is not a
  // request "sent ahead but not needed".
  if (Process* p = process_in_run(name_, run_)) {
    p->abandon(id_);
    if (const auto it = registry().by_name.find(name_); it != registry().by_name.end()) ++it->second->abandoned;
  }
  id_ = 0;
}

bool SentAhead::live() const {
  if (id_ == 0) return false;
  const Process* p = process_in_run(name_, run_);
  return p && p->pending(id_);
}

SentAhead send_external_ahead(const Scenario& s) {
  SentAhead out;
  if (s.policy.predictor != PredictorKind::external) return out;
  Registry& reg = registry();
  const auto it = reg.by_name.find(s.policy.external_name);
  if (it == reg.by_name.end()) return out;
  Predictor& p = *it->second;
  if (p.given_up || !p.process->running() || p.hello.runtime != s.policy.preset || p.hello.unapplied(s.policy)) return out;
  out.name_ = p.hello.name;
  out.run_ = p.process->run();
  out.id_ = send_request(p, s);
  return out;
}

Plan predict_external(const Scenario& s, SentAhead* ahead) {
  Predictor& p = ready_predictor(s);
  std::uint64_t id = 0;
  if (ahead && ahead->name_ == p.hello.name && ahead->live()) {
    id = std::exchange(ahead->id_, 0);
    ++p.claimed_ahead;
  } else {
    if (ahead) ahead->abandon();  // lost with the process it went to
    id = send_request(p, s);
  }
  std::string line;
  const auto waiting = Clock::now();
  std::string err = p.process->await(id, line, g_settings.reply_timeout_s);
  if (!err.empty() && p.process->failed_on() != 0 && p.process->failed_on() != id) {
    // It failed on a request sent before this one (another case's, or one sent ahead and
    // abandoned): that request's failure, not this case's. Its own claim, if it has one, sends
    // it again and is judged by it; this case is asked again of a fresh process, uncounted.
    spdlog::warn("external predictor \"{}\" failed on request {}, sent before this case's: {}; restarted", p.hello.name,
                 p.process->failed_on(), err);
    ready_predictor(s);
    id = send_request(p, s);
    err = p.process->await(id, line, g_settings.reply_timeout_s);
  }
  p.waited += Clock::now() - waiting;
  if (!err.empty()) fail_case(p, err);
  std::shared_ptr<const JsonDoc> doc;
  try {
    doc = parse_json_doc_unique(line);
  } catch (const std::exception& e) {
    p.process->kill_now();  // its output can no longer be trusted to be in step
    fail_case(p, fmt::format("its reply is not JSON ({}): \"{}\"", e.what(), shown(line)));
  }
  const JsonIn j(std::move(doc), "reply");
  try {
    if (!j.is_object()) j.fail("expected an object");
    const std::string type = j.at("type").str();
    if (type == "error") {
      j.expect_object({"type", "id", "message"});
      if (j.at("id").u64() != id) {
        p.process->kill_now();  // out of step, as for a plan
        j.at("id").fail(fmt::format("is not the request's id {}", id));
      }
      // The predictor could not plan this case, and said so: the case's error, not a failure of
      // the process (it is in step and keeps running).
      p.failures = 0;
      throw PredictorError(fmt::format("external predictor \"{}\" could not plan the case: {}", p.hello.name, shown(j.at("message").str(), 2000)),
                           false);
    }
    if (type != "plan") j.at("type").fail(fmt::format("expected \"plan\" or \"error\", got \"{}\"", shown(type, 40)));
    j.expect_object({"type", "id", "plan", "log"});
    if (j.at("id").u64() != id) {
      p.process->kill_now();
      j.at("id").fail(fmt::format("is not the request's id {}", id));
    }
    if (const auto log = j.opt("log")) {
      log->expect_array();
      for (std::size_t k = 0; k < log->size(); ++k) spdlog::debug("[{}] {}", p.hello.name, shown(log->at(k).str(), 400));
    }
    Plan plan = plan_from_json(j.at("plan"), s);
    p.failures = 0;
    return plan;
  } catch (const InputError& e) {
    fail_case(p, fmt::format("malformed reply: {}", e.what()));
  }
}

ExternalCounts external_counts(const std::string& name) {
  Registry& reg = registry();
  const auto it = reg.by_name.find(name);
  if (it == reg.by_name.end()) return {};
  return {it->second->requests, it->second->claimed_ahead, it->second->abandoned};
}

void stop_external_predictors() {
  Registry& reg = registry();
  for (auto& [cmd, p] : reg.by_command) {
    if (p->requests == 0) continue;
    // Whether the predictor kept up: waiting that is a large part of a run's time is the
    // predictor's own cost (docs/predictor-protocol.md, "Cost").
    spdlog::info("external predictor \"{}\": {} requests, {} of them sent ahead of their claim{}; {:.2f} s waiting for replies",
                 p->hello.name, p->requests, p->claimed_ahead,
                 p->abandoned == 0 ? std::string() : fmt::format(" and {} sent ahead but not needed", p->abandoned),
                 std::chrono::duration<double>(p->waited).count());
    p->requests = p->claimed_ahead = p->abandoned = 0;
    p->waited = {};
  }
  reg.stop_all();
}

}  // namespace vf

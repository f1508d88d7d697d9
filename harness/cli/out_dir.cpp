#include "harness/cli/out_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "harness/core/error.h"

namespace vf::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kLockFile = ".vramfuzz.lock";

bool is_shard_dir(const std::string& name) {
  return name.size() > 6 && name.rfind("shard-", 0) == 0 && name.find_first_not_of("0123456789", 6) == std::string::npos;
}

long read_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  char* end = nullptr;
  const long pid = std::strtol(buf, &end, 10);
  return pid > 0 ? pid : -1;
}

}  // namespace

std::vector<std::string> earlier_run_artifacts(const std::string& dir, bool results) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  if (results) {
    for (const char* f : {"summary.json", "junit.xml", "summary.md", "report.html", "run.json"}) {
      if (fs::exists(fs::path(dir) / f, ec)) out.emplace_back(f);
    }
  }
  for (const char* d : {"findings", "calibrate"}) {
    if (fs::exists(fs::path(dir) / d, ec)) out.push_back(std::string(d) + "/");
  }
  if (!results) return out;  // a merge's OUT: shard-N/ are the usual inputs of `merge OUT/shard-* --out OUT`
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (is_shard_dir(name) && e.is_directory(ec)) shards.push_back(name + "/");
  }
  std::sort(shards.begin(), shards.end());
  out.insert(out.end(), shards.begin(), shards.end());
  return out;
}

OutDir::OutDir(const std::string& dir, const Options& options) : dir_(dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) throw InputError(options.flag, fmt::format("{} exists and is not a directory", dir));
  fs::create_directories(dir, ec);
  if (ec) throw InputError(options.flag, fmt::format("cannot create the directory {}: {}", dir, ec.message()));
  const std::string lock = (fs::path(dir) / kLockFile).string();
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw InputError(options.flag, fmt::format("cannot write into {}: {}", dir, std::strerror(errno)));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const long pid = read_pid(fd_);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      throw InputError(options.flag, fmt::format("another vramfuzz{} is writing into {}: two runs would mix their findings; wait for it "
                                                 "or choose another directory",
                                                 pid > 0 ? fmt::format(" (pid {})", pid) : "", dir));
    }
    throw InputError(options.flag, fmt::format("cannot lock {}: {}", lock, std::strerror(err)));
  }
  // Ours now: the pid for the message a second writer gets.
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw InputError(options.flag, fmt::format("cannot write into {}: {}", dir, std::strerror(err)));
  }
  // A directory the lock file could be opened in may still refuse new files (a read-only
  // bind mount over an existing lock file): create and remove one, as each finding will.
  const std::string probe = (fs::path(dir) / fmt::format(".vramfuzz.probe.{}", ::getpid())).string();
  const int pfd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (pfd < 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw InputError(options.flag, fmt::format("cannot write into {}: {}", dir, std::strerror(err)));
  }
  ::close(pfd);
  ::unlink(probe.c_str());

  const std::vector<std::string> earlier = earlier_run_artifacts(dir, options.refuse_results);
  if (earlier.empty()) return;
  if (!options.clean) {
    ::close(fd_);
    fd_ = -1;
    throw InputError(options.flag, fmt::format("{} holds the results of an earlier run ({}): the new summary would not list them; "
                                               "choose another directory, or give --clean to remove them first",
                                               dir, fmt::join(earlier, ", ")));
  }
  for (const std::string& name : earlier) {
    fs::remove_all(fs::path(dir) / name, ec);
    if (ec) throw InfraError(fmt::format("--clean: cannot remove {}: {}", (fs::path(dir) / name).string(), ec.message()));
  }
  spdlog::info("{} {}: removed the earlier run's {}", options.flag, dir, fmt::join(earlier, ", "));
}

OutDir::~OutDir() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (a lock, not a flag)
}

long out_dir_writer(const std::string& dir) {
  const std::string lock = (fs::path(dir) / kLockFile).string();
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  long pid = 0;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    pid = errno == EWOULDBLOCK ? read_pid(fd) : 0;
  } else {
    ::flock(fd, LOCK_UN);
  }
  ::close(fd);
  return pid;
}

void refuse_repro_overwrite(const std::string& dir, const std::string& flag, bool force) {
  if (force) return;
  std::error_code ec;
  std::vector<std::string> there;
  for (const char* f : {"repro.json", "repro.md"}) {
    if (fs::exists(fs::path(dir) / f, ec)) there.push_back((fs::path(dir) / f).string());
  }
  if (there.empty()) return;
  throw InputError(flag, fmt::format("{} already there: give another --out, or --force to replace {}", fmt::join(there, " and "),
                                     there.size() == 1 ? "it" : "them"));
}

}  // namespace vf::cli

// The output directory of a run (`fuzz --out`, `calibrate --out`, `merge --out`), taken before
// the first case so nothing found is lost to it later:
//   * created, and checked to be a writable directory (a file, a read-only directory or one
//     without permission is refused up front, not at the first finding or the final report);
//   * locked for one writer: flock on OUT/.vramfuzz.lock, held until the process exits (released
//     by the kernel even on SIGKILL); a second run into the same OUT is refused, naming the pid;
//   * refused when it holds the results of an earlier run (summary.json, the reports, findings/,
//     calibrate/, shard-N/, run.json; for a merge only findings/ and calibrate/, which a merged
//     summary never lists), unless `clean` is given: then exactly those are removed first
//     (nothing else in OUT is touched).
// InputError naming the flag for each refusal (exit 2).
#pragma once

#include <string>
#include <vector>

namespace vf::cli {

class OutDir {
 public:
  struct Options {
    std::string flag = "--out";  // names the flag in errors
    bool clean = false;          // --clean: remove an earlier run's results instead of refusing
    bool refuse_results = true;  // false (merge): only a campaign's findings/ and calibrate/ count as stale
  };
  OutDir(const std::string& dir, const Options& options);
  ~OutDir();
  OutDir(const OutDir&) = delete;
  OutDir& operator=(const OutDir&) = delete;

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int fd_ = -1;
};

// The files and folders of a run in `dir` that exist (relative names): what OutDir refuses or
// cleans. findings/ and calibrate/ always; with `results` also summary.json, the reports,
// run.json and shard-N/.
std::vector<std::string> earlier_run_artifacts(const std::string& dir, bool results);

// The pid of a live vramfuzz holding `dir`'s lock, or 0 when nobody does (a killed run's lock
// file stays, but its lock went with the process).
long out_dir_writer(const std::string& dir);

// Refuses (InputError naming `flag`) to write repro.json / repro.md into `dir` when either is
// there already, unless `force`: a shrink next to a campaign's finding would replace its repro.
void refuse_repro_overwrite(const std::string& dir, const std::string& flag, bool force);

}  // namespace vf::cli

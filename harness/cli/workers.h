// `--devices 0,1,...`: one worker process per local GPU. Each worker is this same command line
// re-run with CUDA_VISIBLE_DEVICES=<device>, --shard k/N and --out OUT/shard-k, so the workers
// split the case space exactly as `--shard` does on separate machines; the parent waits for them
// (passing SIGINT/SIGTERM on, once) and the caller merges OUT/shard-*/summary.json into OUT. On
// sim the device ids only name the workers: it is a way to use several CPU cores.
#pragma once

#include <string>
#include <vector>

namespace vf::cli {

struct WorkerRun {
  std::vector<std::string> dirs;  // OUT/shard-k of every worker, in shard order
  std::vector<int> exit_codes;    // per worker; 3 when it died of a signal
};

// Parses "0,1,3" (at least one id; each non-empty, no duplicates); InputError(flag) otherwise.
std::vector<std::string> parse_device_list(const std::string& text, const std::string& flag);

// Runs the workers and waits for all of them. Each worker's stdout goes to OUT/shard-k/stdout.log;
// its stderr (logs, prefixed with the shard) is this process's stderr.
WorkerRun run_workers(const std::vector<std::string>& devices, const std::string& out_dir);

// Parses "I/N" (0 <= I < N); InputError(flag) otherwise.
std::pair<unsigned, unsigned> parse_shard(const std::string& text, const std::string& flag);

}  // namespace vf::cli

// vramfuzz alloc-replay: a user's allocation trace through any allocator model.
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "harness/cli/commands.h"
#include "harness/core/error.h"
#include "harness/sim/replay.h"

namespace vf::cli {
namespace {

struct AllocReplayFlags {
  std::string trace;
  std::string allocator = "caching";
  std::vector<std::string> options;
  std::string device = "24GiB";
  std::string used_by_others = "0";
  std::string context = "0";
  std::uint64_t seed = 0;
  bool table = false;
};

int do_alloc_replay(const AllocReplayFlags& f) {
  AllocatorConfig config;
  config.mode = parse_allocator_mode_field(f.allocator, "--allocator");
  for (const std::string& kv : f.options) config.options.push_back(split_kv(kv, "--option"));
  // parse_alloc_options refuses a key given twice, naming it as the flag.
  sim::validate_allocator_config(config, [](std::string_view key) { return fmt::format("--option {}", key); });
  DeviceSpec device;
  device.name = "sim";
  device.total = parse_device_total(f.device, "--device");
  device.used_by_others = parse_size(f.used_by_others, "--used-by-others");
  device.context_overhead = parse_size(f.context, "--context");
  // The flag that leaves nothing: the others' memory alone, or the context on top of it.
  if (device.used_by_others >= device.total) {
    throw InputError("--used-by-others", fmt::format("{} is all of the {} device: nothing is left for the trace",
                                                     format_mib(device.used_by_others), format_size(device.total)));
  }
  if (device.available() == 0) {
    throw InputError("--context", fmt::format("{} on top of {} used by others is all of the {} device: nothing is left for the trace",
                                              format_mib(device.context_overhead), format_mib(device.used_by_others),
                                              format_size(device.total)));
  }
  // One event at a time, written as it goes: memory stays flat however long the trace is. A bad
  // line stops the replay there with exit 2 (the rows before it are already written).
  sim::TraceReader reader(f.trace);
  sim::Replayer replayer(config, device, f.seed);
  fmt::memory_buffer out;
  const auto flush = [&out] {
    if (out.size() > 0 && std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) {
      throw InfraError(fmt::format("cannot write the replay to stdout: {}", std::strerror(errno)));
    }
    out.clear();
  };
  if (f.table) sim::append_replay_table_header(out, replayer.mode(), f.seed, device);
  Bytes before = 0;
  try {
    for (sim::TraceEvent e; reader.next(e);) {
      const sim::ReplayRow& row = replayer.step(e);
      if (f.table) {
        sim::append_replay_table_row(out, row);
      } else {
        sim::append_replay_debug_line(out, row, before);
      }
      before = row.reserved;
      if (out.size() >= (1u << 16)) flush();
    }
  } catch (const InputError&) {
    flush();  // every row before the bad line is written, then its error
    throw;
  }
  const sim::ReplayResult r = replayer.summary();
  if (f.table) {
    sim::append_replay_table_peaks(out, r);  // the table ends with its own "# peaks:" line
  } else {
    fmt::format_to(fmt::appender(out), "peaks: requested {}, allocated {}, reserved {}, device used {}; {} OOM(s)\n", format_mib(r.stats.requested.peak),
                       format_mib(r.stats.allocated.peak), format_mib(r.stats.reserved.peak), format_mib(r.peak_device_used),
                       r.oom_count);
  }
  flush();
  return r.oom_count > 0 ? kExitFindings : kExitOk;
}

}  // namespace

void add_alloc_replay(CLI::App& app, Action& action) {
  auto f = std::make_shared<AllocReplayFlags>();
  CLI::App* cmd = app.add_subcommand("alloc-replay", "replay a JSONL allocation trace through an allocator model");
  cmd->add_option("trace", f->trace, "trace file: one JSON event per line (docs/allocators.md)")->required();
  cmd->add_option("--allocator", f->allocator, "raw | caching | caching-expandable | async (or native, cudaMallocAsync)")
      ->capture_default_str();
  cmd->add_option("--option", f->options, "allocator option key=value (repeatable, each key once), e.g. pool_granularity=32MiB");
  cmd->add_option("--device", f->device, "device total")->capture_default_str();
  cmd->add_option("--used-by-others", f->used_by_others, "memory other processes hold")->capture_default_str();
  cmd->add_option("--context", f->context, "CUDA context of the process")->capture_default_str();
  cmd->add_option("--seed", f->seed, "seed of allocator-side choices (async opportunistic reuse)")->capture_default_str()->transform(kNonNegative);
  cmd->add_flag("--table", f->table, "a column table instead of the DEBUG lines");
  cmd->callback([f, &action] { action = [f] { return do_alloc_replay(*f); }; });
}

}  // namespace vf::cli

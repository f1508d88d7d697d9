// `alloc-replay`: run a user's allocation trace (JSONL, one event per line) on a simulated
// device and allocator mode, and print what the allocator would have reserved after each event.
// The format is documented in docs/allocators.md ("Trace replay"):
//   {"op":"alloc","id":7,"size":1048577,"stream":0}    size: bytes or "320MiB"; stream default 0
//   {"op":"free","id":7}
//   {"op":"record_stream","id":7,"stream":1}
//   {"op":"sync"}   {"op":"wait","stream":0,"on":1}   {"op":"empty_cache"}
// Blank lines and lines starting with '#' are skipped. Every event may carry a "name" label.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "harness/scenario.h"
#include "harness/sim/allocator.h"

namespace vf::sim {

// Streams a trace may name: 0 (compute) .. kMaxTraceStream.
inline constexpr StreamId kMaxTraceStream = 63;

struct TraceEvent {
  enum class Op : std::uint8_t { alloc, free, record_stream, sync, wait, empty_cache };
  Op op = Op::sync;
  std::uint64_t id = 0;  // alloc / free / record_stream: the trace's own id (any 64-bit value)
  Bytes size = 0;        // alloc
  StreamId stream = 0;   // alloc, record_stream; wait: the waiting stream
  StreamId on = 0;       // wait: the stream waited on
  std::size_t line = 0;  // 1-based line in the file
  std::string name;      // optional label ("module", tensor name)
};

std::string_view trace_op_name(TraceEvent::Op op);

// Parses JSONL text; `origin` names it in errors ("trace.jsonl:12: size: ..."). Besides the
// syntax it checks the trace is consistent: no alloc of a live id, no free / record_stream of
// an id that is not live. Throws InputError.
std::vector<TraceEvent> parse_trace_text(std::string_view text, std::string_view origin);
// Reads and parses a file; a missing or unreadable file is an InputError naming the path.
std::vector<TraceEvent> parse_trace_file(const std::string& path);

// The state after one event.
struct ReplayRow {
  std::size_t index = 0;  // 0-based event number
  std::size_t line = 0;
  TraceEvent::Op op = TraceEvent::Op::sync;
  std::uint64_t id = 0;
  Bytes size = 0;           // alloc: bytes asked; free: bytes the id had asked for
  StreamId stream = 0;
  std::string name;
  Bytes requested = 0;      // allocator stats after the event (current values)
  Bytes allocated = 0;
  Bytes reserved = 0;
  Bytes device_used = 0;    // what NVML would show: others + context + our physical memory
  bool oom = false;         // this alloc failed
  bool skipped = false;     // free / record_stream of an id whose alloc failed
};

struct ReplayResult {
  AllocatorMode mode = AllocatorMode::raw;  // the model that ran
  std::uint64_t seed = 0;
  DeviceSpec device;
  std::vector<ReplayRow> rows;
  AllocStats stats;         // final stats; peaks are the run's peaks
  Bytes peak_device_used = 0;
  std::size_t oom_count = 0;
  std::vector<std::pair<std::size_t, OomInfo>> ooms;  // event index, details
};

// Replays `events` from an empty allocator on a fresh device. Bad options throw InputError
// ("allocator.options.<key>"). A failed alloc is recorded and the replay goes on.
ReplayResult replay_trace(const std::vector<TraceEvent>& events, const AllocatorConfig& config,
                          const DeviceSpec& device, std::uint64_t seed);

// The origin discussion's style, one line per event, MiB:
//   [DEBUG 3] reserved: 2240.00 MiB (+ 320.00 MiB), allocated: 2240.00 MiB, module: 320.00 MiB
std::string format_replay_debug(const ReplayResult& result);
// A plain column table with a header and a peaks line.
std::string format_replay_table(const ReplayResult& result);

}  // namespace vf::sim

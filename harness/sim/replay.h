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
#include <fstream>
#include <memory>
#include <string>
#include <unordered_map>
#include <string_view>
#include <vector>

#include <fmt/format.h>

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

// The longest line a trace may have, file or text (an event is a short object; a longer line
// is refused rather than buffered).
inline constexpr std::size_t kMaxTraceLine = 1 << 20;

// One line that is neither blank nor a comment, as an event (no live-id checks: those need the
// lines before). `fast` reads the common form without building a JSON document and hands any
// other line to the full reader; false always uses the full reader (for tests).
TraceEvent parse_trace_line(std::string_view line, std::size_t line_no, std::string_view origin, bool fast = true);

// Reads a trace one event at a time: a file in 1 MiB chunks, so memory does not grow with the
// number of events (only with the ids live at once, for the consistency checks). Each event is
// checked as parse_trace_text describes; errors are InputErrors naming the line and field.
class TraceReader {
 public:
  // A file; a missing, unreadable or directory path is an InputError naming it.
  explicit TraceReader(const std::string& path);
  // Text in memory (not copied: it must outlive the reader); `origin` names it in errors.
  TraceReader(std::string_view text, std::string_view origin);
  // The next event; false at the end of the trace.
  bool next(TraceEvent& e);

 private:
  bool next_line(std::string_view& line);

  std::unique_ptr<std::ifstream> in_;  // null: reading text_
  std::string buf_;                    // file: read but not yet consumed from pos_
  std::string_view text_;
  std::size_t pos_ = 0;
  bool done_ = false;
  std::string origin_;
  std::size_t line_no_ = 0;
  std::unordered_map<std::uint64_t, std::size_t> live_;  // id -> line of its alloc
};

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

// OOM details a replay keeps (the count goes on).
inline constexpr std::size_t kKeptReplayOoms = 1000;

struct ReplayResult {
  AllocatorMode mode = AllocatorMode::raw;  // the model that ran
  std::uint64_t seed = 0;
  DeviceSpec device;
  std::vector<ReplayRow> rows;  // replay_trace only (a streaming Replayer hands them out one by one)
  AllocStats stats;         // final stats; peaks are the run's peaks
  Bytes peak_device_used = 0;
  std::size_t oom_count = 0;
  std::vector<std::pair<std::size_t, OomInfo>> ooms;  // event index, details: the first kKeptReplayOoms
};

// Replays events one at a time from an empty allocator on a fresh device. Bad options throw
// InputError ("allocator.options.<key>"). A failed alloc is recorded and the replay goes on.
class Replayer {
 public:
  Replayer(const AllocatorConfig& config, const DeviceSpec& device, std::uint64_t seed);
  // Runs one event and returns the state after it (valid until the next call).
  const ReplayRow& step(const TraceEvent& e);
  // Final stats, peaks and OOMs so far; no rows.
  ReplayResult summary() const;
  AllocatorMode mode() const { return alloc_->mode(); }

 private:
  // Trace ids may be sparse or huge: each live id gets a small dense key, reused after its free.
  struct Slot {
    BlockKey key;
    bool allocated;  // false: its alloc OOMed
    Bytes size;
  };
  SimDevice device_;
  std::unique_ptr<Allocator> alloc_;
  ReplayResult result_;
  ReplayRow row_;
  std::size_t index_ = 0;
  std::unordered_map<std::uint64_t, Slot> ids_;
  std::vector<BlockKey> spare_keys_;
  BlockKey next_key_ = 0;
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
// The same one piece at a time, appended to `out`: a DEBUG line (`reserved_before`: the row
// before's reserved, 0 for the first), the table's header, one row, its peaks line.
void append_replay_debug_line(fmt::memory_buffer& out, const ReplayRow& row, Bytes reserved_before);
void append_replay_table_header(fmt::memory_buffer& out, AllocatorMode mode, std::uint64_t seed, const DeviceSpec& device);
void append_replay_table_row(fmt::memory_buffer& out, const ReplayRow& row);
void append_replay_table_peaks(fmt::memory_buffer& out, const ReplayResult& summary);

}  // namespace vf::sim

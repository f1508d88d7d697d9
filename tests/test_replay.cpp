// Trace replay: the JSONL format, its errors, the replay rows, the two output formats, and the
// origin discussion's table reproduced under `async` with 32 MiB pool granularity.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/sim/replay.h"
#include "tests/sim_test_util.h"

namespace vf::sim {
namespace {

using test::spec_of;

AllocatorConfig replay_config(AllocatorMode mode, std::vector<std::pair<std::string, std::string>> options = {}) {
  AllocatorConfig c;
  c.mode = mode;
  c.options = std::move(options);
  return c;
}

std::string replay_error(std::string_view text) {
  try {
    parse_trace_text(text, "t.jsonl");
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an InputError for: " << text;
  return {};
}

// The fast line reader takes only what the full JSON reader takes, with the same event; on
// every other line it steps aside and the full reader words the error. Both readers, line by
// line, on the common forms and on lines one detail away from them.
TEST(TraceReplay, TheFastLineReaderAgreesWithTheFullOneOnEveryLine) {
  const std::vector<std::string> lines = {
      R"({"op":"alloc","id":7,"size":1048577,"stream":0})",
      R"({"op":"alloc","id":7,"size":1048577})",
      R"( { "op" : "alloc" , "id" : 7 , "size" : "320MiB" , "name" : "blocks.0.weight" } )",
      "{\"op\":\"alloc\",\t\"id\":18446744073709551615,\"size\":1}",
      R"({"op":"alloc","id":1844674407370955161,"size":1})",
      R"({"op":"alloc","id":99999999999999999999,"size":1})",
      R"({"op":"alloc","id":07,"size":1})",
      R"({"op":"alloc","id":-1,"size":1})",
      R"({"op":"alloc","id":1.0,"size":1})",
      R"({"op":"alloc","id":1,"size":1e3})",
      R"({"op":"alloc","id":1,"size":"12XB"})",
      R"({"op":"alloc","id":1,"size":"1.5GiB"})",
      R"({"op":"alloc","id":1,"size":1,"size":2})",
      R"({"op":"alloc","id":1,"size":1,"stream":64})",
      R"({"op":"alloc","id":1,"size":1,"stream":"1"})",
      R"({"op":"alloc","id":1,"size":1,"on":1})",
      R"({"op":"alloc","id":"1","size":1})",
      R"({"op":"alloc","size":1})",
      R"({"op":"alloc","id":1})",
      R"({"op":"alloc","id":1,"size":null})",
      R"({"op":"alloc","id":1,"size":1,"name":"caf\u00e9"})",
      "{\"op\":\"alloc\",\"id\":1,\"size\":1,\"name\":\"caf\xc3\xa9\"}",
      "{\"op\":\"alloc\",\"id\":1,\"size\":1,\"name\":\"\xff\"}",
      R"({"op":"alloc","id":1,"size":1,"name":5})",
      R"({"op":"alloc","id":1,"size":1,"name":"a"} x)",
      R"({"op":"alloc","id":1,"size":1,})",
      R"({"op":"alloc","id":1,"size":1)",
      R"({"op":"alloc","id":1,"size":1}})",
      R"({"op":"ALLOC","id":1,"size":1})",
      R"({"op":1})",
      R"({"id":1})",
      R"({})",
      R"([])",
      R"({"op":"free","id":3})",
      R"({"op":"free","id":3,"stream":0})",
      R"({"op":"record_stream","id":3,"stream":2})",
      R"({"op":"record_stream","id":3})",
      R"({"op":"wait","stream":0,"on":1})",
      R"({"op":"wait","stream":0})",
      R"({"op":"wait","stream":0,"on":63})",
      R"({"op":"sync"})",
      R"({"op":"sync","id":1})",
      R"({"op":"empty_cache","name":"after load"})",
      R"({"op":"sync","a":1,"b":2,"c":3,"d":4,"e":5,"f":6})",
      R"({"op":"sync"}{"op":"sync"})",
  };
  auto run = [](const std::string& line, bool fast) {
    try {
      const TraceEvent e = parse_trace_line(line, 3, "t.jsonl", fast);
      return fmt::format("{} id={} size={} stream={} on={} line={} name={}", trace_op_name(e.op), e.id, e.size, e.stream, e.on, e.line,
                         e.name);
    } catch (const InputError& err) {
      return std::string("error: ") + err.what();
    }
  };
  int accepted = 0;
  for (const std::string& line : lines) {
    const std::string full = run(line, false);
    EXPECT_EQ(run(line, true), full) << line;
    accepted += full.starts_with("error") ? 0 : 1;
  }
  EXPECT_EQ(accepted, 14);  // the corpus holds both kinds
}

TEST(TraceParse, AllOpsCommentsAndBlankLines) {
  const std::string text =
      "# a comment\n"
      "\n"
      "{\"op\":\"alloc\",\"id\":7,\"size\":1048577,\"stream\":0}\n"
      "  {\"op\":\"alloc\",\"id\":8,\"size\":\"320MiB\",\"name\":\"blocks.0\"}\r\n"
      "{\"op\":\"record_stream\",\"id\":7,\"stream\":1}\n"
      "{\"op\":\"wait\",\"stream\":0,\"on\":1}\n"
      "{\"op\":\"sync\"}\n"
      "{\"op\":\"free\",\"id\":7}\n"
      "{\"op\":\"empty_cache\"}";  // no trailing newline
  const auto ev = parse_trace_text(text, "t.jsonl");
  ASSERT_EQ(ev.size(), 7u);
  EXPECT_EQ(ev[0].op, TraceEvent::Op::alloc);
  EXPECT_EQ(ev[0].line, 3u);
  EXPECT_EQ(ev[0].size, 1048577u);
  EXPECT_EQ(ev[1].size, 320 * MiB);
  EXPECT_EQ(ev[1].stream, 0u);  // default stream
  EXPECT_EQ(ev[1].name, "blocks.0");
  EXPECT_EQ(ev[2].op, TraceEvent::Op::record_stream);
  EXPECT_EQ(ev[2].stream, 1u);
  EXPECT_EQ(ev[3].op, TraceEvent::Op::wait);
  EXPECT_EQ(ev[3].stream, 0u);
  EXPECT_EQ(ev[3].on, 1u);
  EXPECT_EQ(ev[4].op, TraceEvent::Op::sync);
  EXPECT_EQ(ev[5].op, TraceEvent::Op::free);
  EXPECT_EQ(ev[6].op, TraceEvent::Op::empty_cache);
  EXPECT_EQ(ev[6].line, 9u);
}

TEST(TraceParse, ErrorsNameTheLineAndTheField) {
  EXPECT_EQ(replay_error("{\"op\":\"alloc\",\"id\":1}"), "t.jsonl:1: size: missing");
  EXPECT_EQ(replay_error("\n{\"op\":\"alloc\",\"id\":1,\"size\":\"12XB\"}").rfind("t.jsonl:2: size: unknown unit", 0), 0u);
  EXPECT_EQ(replay_error("{\"op\":\"alloc\",\"id\":1,\"size\":1.5}").rfind("t.jsonl:1: size: expected whole bytes", 0), 0u);
  EXPECT_EQ(replay_error("{\"op\":\"alloc\",\"id\":-1,\"size\":1}"), "t.jsonl:1: id: must not be negative, got -1");
  EXPECT_EQ(replay_error("{\"op\":\"alloc\",\"id\":\"x\",\"size\":1}").rfind("t.jsonl:1: id: expected a non-negative integer", 0), 0u);
  EXPECT_EQ(replay_error("{\"op\":\"alloc\",\"id\":1,\"size\":1,\"stream\":64}"),
            "t.jsonl:1: stream: stream 64 is out of range (0..63)");
  EXPECT_EQ(replay_error("{\"op\":\"malloc\"}").rfind("t.jsonl:1: op: unknown op \"malloc\"", 0), 0u);
  EXPECT_EQ(replay_error("{\"op\":\"free\",\"id\":1,\"size\":3}"), "t.jsonl:1: size: not a field of \"free\"");
  EXPECT_EQ(replay_error("{\"id\":1}"), "t.jsonl:1: op: missing");
  EXPECT_EQ(replay_error("[1,2]").rfind("t.jsonl:1: each line must be a JSON object", 0), 0u);
  EXPECT_EQ(replay_error("{\"op\":\"sync\"}\n{\"op\":").rfind("t.jsonl:2: not valid JSON", 0), 0u);
  EXPECT_EQ(replay_error("{\"op\":\"wait\",\"stream\":1}"), "t.jsonl:1: on: missing");
  EXPECT_EQ(replay_error("{\"op\":\"sync\",\"name\":3}"), "t.jsonl:1: name: expected a string, got 3");
}

TEST(TraceParse, DuplicateKeysAndHugeNumbersAreInputErrors) {
  // nlohmann would keep the last "size": this line is neither 10 nor 20 bytes, it is an error.
  EXPECT_EQ(replay_error("{\"op\":\"alloc\",\"id\":1,\"size\":10,\"size\":20}"), "t.jsonl:1: size: key given twice on one line (keep one)");
  EXPECT_EQ(replay_error("{\"op\":\"sync\"}\n{\"op\":\"free\",\"op\":\"free\",\"id\":1}"), "t.jsonl:2: op: key given twice on one line (keep one)");
  // A number too large for a double is nlohmann's out_of_range, not a parse_error: still bad input.
  EXPECT_EQ(replay_error("{\"op\":\"alloc\",\"id\":1,\"size\":1e999}").rfind("t.jsonl:1: not valid JSON", 0), 0u);
  EXPECT_EQ(replay_error("{\"op\":\"alloc\",\"id\":1,\"size\":null}").rfind("t.jsonl:1: size: expected a non-negative integer, got null", 0), 0u);
}

TEST(TraceParse, LivenessIsChecked) {
  EXPECT_EQ(replay_error("{\"op\":\"alloc\",\"id\":1,\"size\":1}\n{\"op\":\"alloc\",\"id\":1,\"size\":1}"),
            "t.jsonl:2: id: id 1 is already live (allocated at line 1)");
  EXPECT_EQ(replay_error("{\"op\":\"free\",\"id\":5}"), "t.jsonl:1: id: id 5 is not live (never allocated or already freed)");
  EXPECT_EQ(replay_error("{\"op\":\"record_stream\",\"id\":5,\"stream\":1}"), "t.jsonl:1: id: id 5 is not live");
  // An id may be reused once freed.
  EXPECT_NO_THROW(parse_trace_text(
      "{\"op\":\"alloc\",\"id\":1,\"size\":1}\n{\"op\":\"free\",\"id\":1}\n{\"op\":\"alloc\",\"id\":1,\"size\":1}", "t"));
}

TEST(TraceParse, MissingFileIsAnInputError) {
  try {
    parse_trace_file("/nonexistent/trace.jsonl");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/nonexistent/trace.jsonl");
  }
}

TEST(TraceReplay, SparseLargeIdsAndRows) {
  const auto ev = parse_trace_text(
      "{\"op\":\"alloc\",\"id\":18446744073709551615,\"size\":\"1MiB\"}\n"
      "{\"op\":\"alloc\",\"id\":900000000000,\"size\":\"30MiB\"}\n"
      "{\"op\":\"free\",\"id\":18446744073709551615}\n"
      "{\"op\":\"alloc\",\"id\":3,\"size\":600}\n"
      "{\"op\":\"empty_cache\"}\n",
      "t");
  const ReplayResult r = replay_trace(ev, replay_config(AllocatorMode::caching), spec_of(1 * GiB), 0);
  ASSERT_EQ(r.rows.size(), 5u);
  EXPECT_EQ(r.mode, AllocatorMode::caching);
  EXPECT_EQ(r.rows[0].reserved, 2 * MiB);             // 1 MiB is small: 2 MiB segment
  EXPECT_EQ(r.rows[1].reserved, 32 * MiB);            // + its own 30 MiB segment
  EXPECT_EQ(r.rows[1].allocated, 31 * MiB);
  EXPECT_EQ(r.rows[2].op, TraceEvent::Op::free);
  EXPECT_EQ(r.rows[2].size, 1 * MiB);                 // a free row shows the size it had
  EXPECT_EQ(r.rows[2].allocated, 30 * MiB);
  EXPECT_EQ(r.rows[3].allocated, 30 * MiB + 1024);    // 600 B reuses the cached small segment
  EXPECT_EQ(r.rows[3].reserved, 32 * MiB);
  EXPECT_EQ(r.rows[4].reserved, 32 * MiB);            // both segments still in use
  EXPECT_EQ(r.rows[1].device_used, 32 * MiB);
  EXPECT_EQ(r.stats.reserved.peak, 32 * MiB);
  EXPECT_EQ(r.oom_count, 0u);
}

TEST(TraceReplay, OomIsRecordedAndTheReplayGoesOn) {
  const auto ev = parse_trace_text(
      "{\"op\":\"alloc\",\"id\":1,\"size\":\"40MiB\"}\n"
      "{\"op\":\"alloc\",\"id\":2,\"size\":\"40MiB\"}\n"
      "{\"op\":\"record_stream\",\"id\":2,\"stream\":1}\n"
      "{\"op\":\"free\",\"id\":2}\n"
      "{\"op\":\"free\",\"id\":1}\n"
      "{\"op\":\"alloc\",\"id\":2,\"size\":\"40MiB\"}\n",
      "t");
  const ReplayResult r = replay_trace(ev, replay_config(AllocatorMode::caching), spec_of(64 * MiB), 0);
  EXPECT_TRUE(r.rows[1].oom);
  EXPECT_TRUE(r.rows[2].skipped);
  EXPECT_TRUE(r.rows[3].skipped);
  EXPECT_FALSE(r.rows[5].oom);
  EXPECT_EQ(r.oom_count, 1u);
  ASSERT_EQ(r.ooms.size(), 1u);
  EXPECT_EQ(r.ooms[0].first, 1u);
  EXPECT_EQ(r.ooms[0].second.request, 40 * MiB);
  const std::string debug = format_replay_debug(r);
  EXPECT_NE(debug.find("[DEBUG 1] reserved: 40.00 MiB (+ 0.00 MiB), allocated: 40.00 MiB, module: 40.00 MiB OOM\n"),
            std::string::npos);
  EXPECT_NE(debug.find("free: 40.00 MiB (skipped: its alloc failed)"), std::string::npos);
}

TEST(TraceReplay, DebugAndTableFormats) {
  const auto ev = parse_trace_text(
      "{\"op\":\"alloc\",\"id\":1,\"size\":\"320MiB\",\"name\":\"blocks.0\"}\n"
      "{\"op\":\"free\",\"id\":1}\n"
      "{\"op\":\"empty_cache\"}\n",
      "t");
  const ReplayResult r = replay_trace(ev, replay_config(AllocatorMode::caching), spec_of(24 * GiB), 5);
  EXPECT_EQ(format_replay_debug(r),
            "[DEBUG 0] reserved: 320.00 MiB (+ 320.00 MiB), allocated: 320.00 MiB, module: 320.00 MiB (blocks.0)\n"
            "[DEBUG 1] reserved: 320.00 MiB (+ 0.00 MiB), allocated: 0.00 MiB, free: 320.00 MiB\n"
            "[DEBUG 2] reserved: 0.00 MiB (- 320.00 MiB), allocated: 0.00 MiB, empty_cache\n");
  const std::string table = format_replay_table(r);
  EXPECT_EQ(table.rfind("# mode caching seed 5 device 24 GiB", 0), 0u);
  EXPECT_NE(table.find("event"), std::string::npos);
  EXPECT_NE(table.find("reserved"), std::string::npos);
  EXPECT_NE(table.find("blocks.0"), std::string::npos);
  EXPECT_NE(table.find("# peaks: requested 320.00 MiB, allocated 320.00 MiB, reserved 320.00 MiB"), std::string::npos);
}

TEST(TraceReplay, SameSeedSameRows) {
  std::string text;
  for (int i = 0; i < 200; ++i) {
    text += fmt::format("{{\"op\":\"alloc\",\"id\":{},\"size\":{},\"stream\":{}}}\n", i, (i % 9 + 1) * 700000, i % 3);
    if (i % 2 == 1) text += fmt::format("{{\"op\":\"free\",\"id\":{}}}\n", i - 1);
    if (i % 17 == 0) text += fmt::format("{{\"op\":\"wait\",\"stream\":{},\"on\":{}}}\n", i % 3, (i + 1) % 3);
  }
  const auto ev = parse_trace_text(text, "t");
  const auto cfg = replay_config(AllocatorMode::async);
  const ReplayResult a = replay_trace(ev, cfg, spec_of(8 * GiB), 11);
  const ReplayResult b = replay_trace(ev, cfg, spec_of(8 * GiB), 11);
  EXPECT_EQ(format_replay_table(a), format_replay_table(b));
}

TEST(TraceReplay, BadOptionsAreInputErrors) {
  EXPECT_THROW(replay_trace({}, replay_config(AllocatorMode::async, {{"max_split_size_mb", "100"}}), spec_of(1 * GiB), 0),
               InputError);
}

// ---- The origin discussion's table --------------------------------------------------------------
// reference/origin-discussion.txt: FLUX.2 text encoder on an RTX 4090 with cudaMallocAsync.
// The thread prints reserved and allocated (MB = MiB) after each module's allocation.

struct DebugLine {
  std::size_t index;
  double reserved;   // MiB
  double allocated;  // MiB, as printed (two decimals)
};

// Every line the thread shows; 4..61 are elided there ("...") and follow the +320 MB pattern.
std::vector<DebugLine> origin_lines() {
  std::vector<DebugLine> lines;
  lines.push_back({0, 1280, 1280});
  for (std::size_t i = 1; i <= 63; ++i) lines.push_back({i, 1280.0 + 320.0 * static_cast<double>(i), 1280.0 + 320.0 * static_cast<double>(i)});
  lines.push_back({64, 21504, 21480});
  lines.push_back({65, 21536, 21520});
  lines.push_back({66, 21568, 21560});
  lines.push_back({67, 21600, 21600});
  lines.push_back({68, 21632, 21610});
  lines.push_back({69, 21632, 21610.01});
  lines.push_back({70, 21632, 21610.02});
  lines.push_back({71, 21632, 21610.03});
  return lines;
}

std::string fixture_path() { return std::string(VF_SOURCE_DIR) + "/tests/data/origin-flux2.jsonl"; }

TEST(OriginTable, AsyncWith32MiBGranularityReproducesEveryDebugLine) {
  const auto events = parse_trace_file(fixture_path());
  ASSERT_EQ(events.size(), 72u);
  DeviceSpec rtx4090;  // 24 GiB, default context
  rtx4090.total = 24 * GiB;
  const ReplayResult r =
      replay_trace(events, replay_config(AllocatorMode::async, {{"pool_granularity", "32MiB"}}), rtx4090, 0);
  ASSERT_EQ(r.rows.size(), 72u);
  EXPECT_EQ(r.oom_count, 0u);
  for (const DebugLine& want : origin_lines()) {
    const ReplayRow& row = r.rows[want.index];
    EXPECT_EQ(fmt::format("{:.2f}", to_mib(row.reserved)), fmt::format("{:.2f}", want.reserved)) << "DEBUG " << want.index;
    EXPECT_EQ(fmt::format("{:.2f}", to_mib(row.allocated)), fmt::format("{:.2f}", want.allocated)) << "DEBUG " << want.index;
  }
  // Reserved moves in whole 32 MiB chunks ahead of allocated: +64 for the first 40 MB module,
  // then +32 for each of the next three and for the 10 MB one, then nothing.
  const std::string debug = format_replay_debug(r);
  EXPECT_NE(debug.find("[DEBUG 3] reserved: 2240.00 MiB (+ 320.00 MiB), allocated: 2240.00 MiB, module: 320.00 MiB\n"),
            std::string::npos);
  EXPECT_NE(debug.find("[DEBUG 64] reserved: 21504.00 MiB (+ 64.00 MiB), allocated: 21480.00 MiB, module: 40.00 MiB\n"),
            std::string::npos);
  EXPECT_NE(debug.find("[DEBUG 65] reserved: 21536.00 MiB (+ 32.00 MiB), allocated: 21520.00 MiB, module: 40.00 MiB\n"),
            std::string::npos);
  EXPECT_NE(debug.find("[DEBUG 68] reserved: 21632.00 MiB (+ 32.00 MiB), allocated: 21610.00 MiB, module: 10.00 MiB\n"),
            std::string::npos);
  EXPECT_NE(debug.find("[DEBUG 71] reserved: 21632.00 MiB (+ 0.00 MiB), allocated: 21610.03 MiB, module: 0.01 MiB\n"),
            std::string::npos);
  for (const ReplayRow& row : r.rows) EXPECT_EQ(row.reserved % (32 * MiB), 0u) << "DEBUG " << row.index;
}

// The default step is the one measured on an H200 (32 MiB): the origin table comes out of a
// replay without options, row for row as with the option.
TEST(OriginTable, TheMeasuredDefaultGranularityReproducesTheTable) {
  const auto events = parse_trace_file(fixture_path());
  DeviceSpec rtx4090;
  rtx4090.total = 24 * GiB;
  const ReplayResult by_default = replay_trace(events, replay_config(AllocatorMode::async), rtx4090, 0);
  const ReplayResult with_option =
      replay_trace(events, replay_config(AllocatorMode::async, {{"pool_granularity", "32MiB"}}), rtx4090, 0);
  ASSERT_EQ(by_default.rows.size(), with_option.rows.size());
  for (std::size_t i = 0; i < by_default.rows.size(); ++i) {
    EXPECT_EQ(by_default.rows[i].reserved, with_option.rows[i].reserved) << "DEBUG " << i;
  }
  EXPECT_EQ(to_mib(by_default.rows[64].reserved), 21504.0);
}

TEST(OriginTable, TwoMiBGranularityDoesNotShowTheSteps) {
  const auto events = parse_trace_file(fixture_path());
  DeviceSpec rtx4090;
  rtx4090.total = 24 * GiB;
  const ReplayResult r = replay_trace(events, replay_config(AllocatorMode::async, {{"pool_granularity", "2MiB"}}), rtx4090, 0);
  // 40 MiB is a whole number of 2 MiB chunks: reserved == allocated, no 32 MiB steps.
  EXPECT_EQ(r.rows[64].reserved, r.rows[64].allocated);
  EXPECT_EQ(to_mib(r.rows[64].reserved), 21480.0);
  EXPECT_EQ(to_mib(r.rows[68].reserved), 21610.0);
  EXPECT_EQ(to_mib(r.rows[69].reserved), 21612.0);  // the first 10 KiB needs a fresh 2 MiB chunk
}

}  // namespace
}  // namespace vf::sim

#include "harness/sim/replay.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/core/error.h"
#include "harness/core/json_in.h"

namespace vf::sim {

std::string_view trace_op_name(TraceEvent::Op op) {
  switch (op) {
    case TraceEvent::Op::alloc: return "alloc";
    case TraceEvent::Op::free: return "free";
    case TraceEvent::Op::record_stream: return "record_stream";
    case TraceEvent::Op::sync: return "sync";
    case TraceEvent::Op::wait: return "wait";
    case TraceEvent::Op::empty_cache: return "empty_cache";
  }
  return "?";
}

namespace {

using json = nlohmann::json;

struct LineContext {
  std::string_view origin;
  std::size_t line;
  std::string at(std::string_view field) const { return fmt::format("{}:{}: {}", origin, line, field); }
  std::string here() const { return fmt::format("{}:{}", origin, line); }
};

const json& require(const json& obj, std::string_view field, const LineContext& ctx) {
  const auto it = obj.find(std::string(field));
  if (it == obj.end()) throw InputError(ctx.at(field), "missing");
  return *it;
}

std::uint64_t get_uint(const json& v, std::string_view field, const LineContext& ctx) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) throw InputError(ctx.at(field), fmt::format("must not be negative, got {}", json_excerpt(v)));
  throw InputError(ctx.at(field), fmt::format("expected a non-negative integer, got {}", json_excerpt(v)));
}

StreamId get_stream(const json& obj, std::string_view field, const LineContext& ctx, bool optional) {
  const auto it = obj.find(std::string(field));
  if (it == obj.end()) {
    if (optional) return 0;
    throw InputError(ctx.at(field), "missing");
  }
  const std::uint64_t s = get_uint(*it, field, ctx);
  if (s > kMaxTraceStream) {
    throw InputError(ctx.at(field), fmt::format("stream {} is out of range (0..{})", s, kMaxTraceStream));
  }
  return static_cast<StreamId>(s);
}

Bytes get_size(const json& v, const LineContext& ctx) {
  if (v.is_string()) return parse_size(v.get<std::string>(), ctx.at("size"));
  if (v.is_number_float()) {
    throw InputError(ctx.at("size"), fmt::format("expected whole bytes or a string like \"320MiB\", got {}", json_excerpt(v)));
  }
  return get_uint(v, "size", ctx);
}

// Fields each op accepts (besides "op" and "name").
bool field_allowed(TraceEvent::Op op, std::string_view key) {
  switch (op) {
    case TraceEvent::Op::alloc: return key == "id" || key == "size" || key == "stream";
    case TraceEvent::Op::free: return key == "id";
    case TraceEvent::Op::record_stream: return key == "id" || key == "stream";
    case TraceEvent::Op::wait: return key == "stream" || key == "on";
    case TraceEvent::Op::sync:
    case TraceEvent::Op::empty_cache: return false;
  }
  return false;
}

TraceEvent parse_event(const json& obj, const LineContext& ctx) {
  if (!obj.is_object()) throw InputError(ctx.here(), "each line must be a JSON object like {\"op\":\"alloc\",...}");
  const json& op_value = require(obj, "op", ctx);
  if (!op_value.is_string()) throw InputError(ctx.at("op"), fmt::format("expected a string, got {}", json_excerpt(op_value)));
  const std::string op = op_value.get<std::string>();
  TraceEvent e;
  e.line = ctx.line;
  if (op == "alloc") {
    e.op = TraceEvent::Op::alloc;
  } else if (op == "free") {
    e.op = TraceEvent::Op::free;
  } else if (op == "record_stream") {
    e.op = TraceEvent::Op::record_stream;
  } else if (op == "sync") {
    e.op = TraceEvent::Op::sync;
  } else if (op == "wait") {
    e.op = TraceEvent::Op::wait;
  } else if (op == "empty_cache") {
    e.op = TraceEvent::Op::empty_cache;
  } else {
    throw InputError(ctx.at("op"),
                     fmt::format("unknown op \"{}\" (alloc, free, record_stream, sync, wait, empty_cache)", op));
  }
  for (const auto& [key, value] : obj.items()) {
    if (key == "op") continue;
    if (key == "name") {
      if (!value.is_string()) throw InputError(ctx.at("name"), fmt::format("expected a string, got {}", json_excerpt(value)));
      e.name = value.get<std::string>();
      continue;
    }
    if (!field_allowed(e.op, key)) throw InputError(ctx.at(key), fmt::format("not a field of \"{}\"", op));
  }
  switch (e.op) {
    case TraceEvent::Op::alloc:
      e.id = get_uint(require(obj, "id", ctx), "id", ctx);
      e.size = get_size(require(obj, "size", ctx), ctx);
      e.stream = get_stream(obj, "stream", ctx, true);
      break;
    case TraceEvent::Op::free: e.id = get_uint(require(obj, "id", ctx), "id", ctx); break;
    case TraceEvent::Op::record_stream:
      e.id = get_uint(require(obj, "id", ctx), "id", ctx);
      e.stream = get_stream(obj, "stream", ctx, false);
      break;
    case TraceEvent::Op::wait:
      e.stream = get_stream(obj, "stream", ctx, false);
      e.on = get_stream(obj, "on", ctx, false);
      break;
    case TraceEvent::Op::sync:
    case TraceEvent::Op::empty_cache: break;
  }
  return e;
}

}  // namespace

std::vector<TraceEvent> parse_trace_text(std::string_view text, std::string_view origin) {
  std::vector<TraceEvent> events;
  std::unordered_map<std::uint64_t, std::size_t> live;  // id -> line of its alloc
  std::size_t line_no = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t end = std::min(text.find('\n', pos), text.size());
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line[first] == '#') continue;  // blank or comment
    const LineContext ctx{origin, line_no};
    json obj;
    try {
      obj = parse_json_unique(line);
    } catch (const JsonDuplicateKey& err) {
      // nlohmann would keep the last value: {"op":"alloc","id":1,"size":10,"size":20} is not 20.
      throw InputError(ctx.at(err.path()), "key given twice on one line (keep one)");
    } catch (const JsonTooDeep& err) {
      throw InputError(ctx.here(), err.what());  // the byte is the line's
    } catch (const json::exception& err) {
      // parse_error, and out_of_range for a number too large for a double (1e999).
      throw InputError(ctx.here(), fmt::format("not valid JSON ({})", err.what()));
    }
    TraceEvent e = parse_event(obj, ctx);
    switch (e.op) {
      case TraceEvent::Op::alloc: {
        const auto [it, fresh] = live.emplace(e.id, line_no);
        if (!fresh) throw InputError(ctx.at("id"), fmt::format("id {} is already live (allocated at line {})", e.id, it->second));
        break;
      }
      case TraceEvent::Op::free:
        if (live.erase(e.id) == 0) throw InputError(ctx.at("id"), fmt::format("id {} is not live (never allocated or already freed)", e.id));
        break;
      case TraceEvent::Op::record_stream:
        if (!live.contains(e.id)) throw InputError(ctx.at("id"), fmt::format("id {} is not live", e.id));
        break;
      default: break;
    }
    events.push_back(std::move(e));
  }
  return events;
}

std::vector<TraceEvent> parse_trace_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path, "is a directory, not a trace file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "cannot open the trace file");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw InputError(path, "cannot read the trace file");
  return parse_trace_text(buf.str(), path);
}

ReplayResult replay_trace(const std::vector<TraceEvent>& events, const AllocatorConfig& config,
                          const DeviceSpec& device_spec, std::uint64_t seed) {
  SimDevice device(device_spec);
  std::unique_ptr<Allocator> alloc = make_allocator(config, device, seed);
  ReplayResult result;
  result.mode = alloc->mode();
  result.seed = seed;
  result.device = device_spec;
  result.rows.reserve(events.size());

  // Trace ids may be sparse or huge: each live id gets a small dense key, reused after its free.
  struct Slot {
    BlockKey key;
    bool allocated;  // false: its alloc OOMed
    Bytes size;
  };
  std::unordered_map<std::uint64_t, Slot> ids;
  std::vector<BlockKey> spare_keys;
  BlockKey next_key = 0;

  for (std::size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    ReplayRow row;
    row.index = i;
    row.line = e.line;
    row.op = e.op;
    row.id = e.id;
    row.stream = e.stream;
    row.name = e.name;
    switch (e.op) {
      case TraceEvent::Op::alloc: {
        BlockKey key;
        if (!spare_keys.empty()) {
          key = spare_keys.back();
          spare_keys.pop_back();
        } else {
          key = next_key++;
        }
        row.size = e.size;
        const bool ok = alloc->malloc(key, e.size, e.stream);
        if (!ok) {
          row.oom = true;
          ++result.oom_count;
          if (alloc->last_oom()) result.ooms.emplace_back(i, *alloc->last_oom());
        }
        ids[e.id] = Slot{key, ok, e.size};
        break;
      }
      case TraceEvent::Op::free: {
        const auto it = ids.find(e.id);
        if (it == ids.end()) throw InputError(fmt::format("event {}", i), fmt::format("free of id {} that is not live", e.id));
        row.size = it->second.size;
        if (it->second.allocated) {
          alloc->free(it->second.key);
        } else {
          row.skipped = true;
        }
        spare_keys.push_back(it->second.key);
        ids.erase(it);
        break;
      }
      case TraceEvent::Op::record_stream: {
        const auto it = ids.find(e.id);
        if (it == ids.end()) throw InputError(fmt::format("event {}", i), fmt::format("record_stream of id {} that is not live", e.id));
        if (it->second.allocated) {
          alloc->record_stream(it->second.key, e.stream);
        } else {
          row.skipped = true;
        }
        break;
      }
      case TraceEvent::Op::sync: alloc->synchronize(); break;
      case TraceEvent::Op::wait: alloc->stream_wait(e.stream, e.on); break;
      case TraceEvent::Op::empty_cache: alloc->empty_cache(); break;
    }
    const AllocStats& s = alloc->stats();
    row.requested = s.requested.current;
    row.allocated = s.allocated.current;
    row.reserved = s.reserved.current;
    row.device_used = device.device_used();
    result.rows.push_back(std::move(row));
  }
  result.stats = alloc->stats();
  result.peak_device_used = device.baseline_used() + device.peak_charged();
  return result;
}

namespace {

std::string signed_delta(Bytes now, Bytes before) {
  const bool down = now < before;
  return fmt::format("{} {:.2f} MiB", down ? '-' : '+', to_mib(down ? before - now : now - before));
}

}  // namespace

std::string format_replay_debug(const ReplayResult& result) {
  std::string out;
  Bytes before = 0;
  for (const ReplayRow& r : result.rows) {
    out += fmt::format("[DEBUG {}] reserved: {:.2f} MiB ({}), allocated: {:.2f} MiB, ", r.index, to_mib(r.reserved),
                       signed_delta(r.reserved, before), to_mib(r.allocated));
    switch (r.op) {
      case TraceEvent::Op::alloc: out += fmt::format("module: {:.2f} MiB", to_mib(r.size)); break;
      case TraceEvent::Op::free: out += fmt::format("free: {:.2f} MiB", to_mib(r.size)); break;
      case TraceEvent::Op::record_stream: out += fmt::format("record_stream: id {} on stream {}", r.id, r.stream); break;
      case TraceEvent::Op::wait: out += fmt::format("wait: stream {}", r.stream); break;
      case TraceEvent::Op::sync: out += "sync"; break;
      case TraceEvent::Op::empty_cache: out += "empty_cache"; break;
    }
    if (!r.name.empty()) out += fmt::format(" ({})", r.name);
    if (r.oom) out += " OOM";
    if (r.skipped) out += " (skipped: its alloc failed)";
    out += '\n';
    before = r.reserved;
  }
  return out;
}

std::string format_replay_table(const ReplayResult& result) {
  std::string out = fmt::format("# mode {} seed {} device {} (available {})\n", allocator_mode_name(result.mode),
                                result.seed, format_size(result.device.total), format_size(result.device.available()));
  out += fmt::format("{:>6} {:>6} {:<13} {:>10} {:>12} {:>12} {:>12} {:>12} {:>12}  {}\n", "event", "line", "op", "id",
                     "size_MiB", "requested", "allocated", "reserved", "device_used", "note");
  for (const ReplayRow& r : result.rows) {
    const bool has_id = r.op == TraceEvent::Op::alloc || r.op == TraceEvent::Op::free || r.op == TraceEvent::Op::record_stream;
    std::string note = r.oom ? "OOM" : (r.skipped ? "skipped" : "");
    if (!r.name.empty()) note += (note.empty() ? "" : " ") + r.name;
    out += fmt::format("{:>6} {:>6} {:<13} {:>10} {:>12.2f} {:>12.2f} {:>12.2f} {:>12.2f} {:>12.2f}  {}\n", r.index, r.line,
                       trace_op_name(r.op), has_id ? std::to_string(r.id) : "-", to_mib(r.size), to_mib(r.requested),
                       to_mib(r.allocated), to_mib(r.reserved), to_mib(r.device_used), note);
  }
  out += fmt::format("# peaks: requested {:.2f} MiB, allocated {:.2f} MiB, reserved {:.2f} MiB, device_used {:.2f} MiB; {} OOM\n",
                     to_mib(result.stats.requested.peak), to_mib(result.stats.allocated.peak),
                     to_mib(result.stats.reserved.peak), to_mib(result.peak_device_used), result.oom_count);
  return out;
}

}  // namespace vf::sim

#include "harness/sim/replay.h"

#include <array>
#include <filesystem>
#include <optional>
#include <fstream>
#include <iterator>
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

// The op a trace names ("alloc" ... "empty_cache"): trace_op_name's inverse.
std::optional<TraceEvent::Op> trace_op_named(std::string_view name) {
  for (const TraceEvent::Op op : {TraceEvent::Op::alloc, TraceEvent::Op::free, TraceEvent::Op::record_stream, TraceEvent::Op::sync,
                                  TraceEvent::Op::wait, TraceEvent::Op::empty_cache}) {
    if (trace_op_name(op) == name) return op;
  }
  return std::nullopt;
}

// Every event of a trace, checked (parse_trace_text and parse_trace_file).
std::vector<TraceEvent> read_all(TraceReader& reader) {
  std::vector<TraceEvent> events;
  for (TraceEvent e; reader.next(e);) events.push_back(std::move(e));
  return events;
}

// A line over kMaxTraceLine, wherever the reader finds out.
InputError line_too_long(std::string_view origin, std::size_t line_no) {
  return InputError(fmt::format("{}:{}", origin, line_no), fmt::format("line is longer than {} bytes", kMaxTraceLine));
}

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
  const std::optional<TraceEvent::Op> known = trace_op_named(op);
  if (!known) {
    throw InputError(ctx.at("op"),
                     fmt::format("unknown op \"{}\" (alloc, free, record_stream, sync, wait, empty_cache)", op));
  }
  e.op = *known;
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

// The common line, read without building a document: one flat object whose keys are known
// fields, given once, with printable-ASCII strings (no escapes) and whole numbers of up to 19
// digits, whose event is complete and valid. Anything else (another form, an error of any kind)
// returns false, and the line goes through the full JSON reader, which words the error: so this
// path only ever accepts what that one accepts, with the same event (tests/test_replay.cpp
// compares the two on a corpus of odd lines).
bool parse_event_fast(std::string_view line, std::size_t line_no, std::string_view origin, TraceEvent& out) {
  std::size_t i = 0;
  const std::size_t n = line.size();
  auto ws = [&] {
    while (i < n && (line[i] == ' ' || line[i] == '\t')) ++i;
  };
  auto plain_string = [&](std::string_view& v) {
    if (i >= n || line[i] != '"') return false;
    const std::size_t start = ++i;
    while (i < n && line[i] != '"') {
      const auto c = static_cast<unsigned char>(line[i]);
      if (c < 0x20 || c > 0x7e || c == '\\') return false;
      ++i;
    }
    if (i >= n) return false;
    v = line.substr(start, i - start);
    ++i;
    return true;
  };
  struct Field {
    std::string_view key;
    bool text = false;
    std::string_view str;
    std::uint64_t num = 0;
  };
  std::array<Field, 6> fields;
  std::size_t count = 0;
  ws();
  if (i >= n || line[i++] != '{') return false;
  for (;;) {
    ws();
    if (count == fields.size()) return false;
    Field& f = fields[count];
    if (!plain_string(f.key)) return false;
    for (std::size_t k = 0; k < count; ++k) {
      if (fields[k].key == f.key) return false;
    }
    ws();
    if (i >= n || line[i++] != ':') return false;
    ws();
    if (i < n && line[i] == '"') {
      if (!plain_string(f.str)) return false;
      f.text = true;
    } else {
      const std::size_t start = i;
      while (i < n && line[i] >= '0' && line[i] <= '9') ++i;
      const std::size_t digits = i - start;
      if (digits == 0 || digits > 19 || (digits > 1 && line[start] == '0')) return false;
      if (i < n && (line[i] == '.' || line[i] == 'e' || line[i] == 'E')) return false;
      for (std::size_t k = start; k < i; ++k) f.num = f.num * 10 + static_cast<std::uint64_t>(line[k] - '0');
    }
    ++count;
    ws();
    if (i < n && line[i] == ',') {
      ++i;
      continue;
    }
    if (i < n && line[i] == '}') {
      ++i;
      break;
    }
    return false;
  }
  ws();
  if (i != n) return false;

  const Field* op = nullptr;
  for (std::size_t k = 0; k < count; ++k) {
    if (fields[k].key == "op") op = &fields[k];
  }
  if (op == nullptr || !op->text) return false;
  TraceEvent e;
  e.line = line_no;
  const std::optional<TraceEvent::Op> known = trace_op_named(op->str);
  if (!known) return false;
  e.op = *known;
  const Field* id = nullptr;
  const Field* size = nullptr;
  const Field* stream = nullptr;
  const Field* on = nullptr;
  for (std::size_t k = 0; k < count; ++k) {
    const Field& f = fields[k];
    if (&f == op) continue;
    if (f.key == "name") {
      if (!f.text) return false;
      e.name = std::string(f.str);
      continue;
    }
    if (!field_allowed(e.op, f.key)) return false;
    if (f.key == "id") id = &f;
    else if (f.key == "size") size = &f;
    else if (f.key == "stream") stream = &f;
    else if (f.key == "on") on = &f;
  }
  const auto number = [](const Field* f) { return f != nullptr && !f->text; };
  const auto stream_ok = [](const Field* f) { return !f->text && f->num <= kMaxTraceStream; };
  switch (e.op) {
    case TraceEvent::Op::alloc:
      if (!number(id) || size == nullptr || (stream != nullptr && !stream_ok(stream))) return false;
      e.id = id->num;
      e.stream = stream != nullptr ? static_cast<StreamId>(stream->num) : 0;
      if (!size->text) {
        e.size = size->num;
      } else {
        try {
          e.size = parse_size(size->str, fmt::format("{}:{}: size", origin, line_no));
        } catch (const InputError&) {
          return false;  // the full reader says what is wrong with it
        }
      }
      break;
    case TraceEvent::Op::free:
      if (!number(id)) return false;
      e.id = id->num;
      break;
    case TraceEvent::Op::record_stream:
      if (!number(id) || stream == nullptr || !stream_ok(stream)) return false;
      e.id = id->num;
      e.stream = static_cast<StreamId>(stream->num);
      break;
    case TraceEvent::Op::wait:
      if (stream == nullptr || !stream_ok(stream) || on == nullptr || !stream_ok(on)) return false;
      e.stream = static_cast<StreamId>(stream->num);
      e.on = static_cast<StreamId>(on->num);
      break;
    case TraceEvent::Op::sync:
    case TraceEvent::Op::empty_cache: break;
  }
  out = std::move(e);
  return true;
}

}  // namespace

TraceReader::TraceReader(const std::string& path) : origin_(path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path, "is a directory, not a trace file");
  in_ = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!*in_) throw InputError(path, "cannot open the trace file");
}

TraceReader::TraceReader(std::string_view text, std::string_view origin) : text_(text), origin_(origin) {}

// The next line without its '\n' (the last one may lack it). A file is read in chunks into
// buf_; what was consumed is dropped before the next read, so buf_ holds about one chunk.
bool TraceReader::next_line(std::string_view& line) {
  if (done_) return false;
  if (!in_) {
    const std::size_t end = std::min(text_.find('\n', pos_), text_.size());
    line = text_.substr(pos_, end - pos_);
    if (end == text_.size()) done_ = true;
    pos_ = end + 1;
    return true;
  }
  constexpr std::size_t kChunk = 1 << 20;
  for (;;) {
    const std::size_t nl = buf_.find('\n', pos_);
    if (nl != std::string::npos) {
      line = std::string_view(buf_).substr(pos_, nl - pos_);
      pos_ = nl + 1;
      return true;
    }
    // No newline in more than the longest line allowed: refused without reading on (next()
    // refuses a shorter-buffered long line the same way, wherever the chunks fall).
    if (buf_.size() - pos_ > kMaxTraceLine) throw line_too_long(origin_, line_no_ + 1);
    if (in_->eof()) {  // the last line, without a newline (or an empty one after the last newline)
      line = std::string_view(buf_).substr(pos_);
      done_ = true;
      return true;
    }
    buf_.erase(0, pos_);
    pos_ = 0;
    const std::size_t have = buf_.size();
    buf_.resize(have + kChunk);
    in_->read(buf_.data() + have, static_cast<std::streamsize>(kChunk));
    buf_.resize(have + static_cast<std::size_t>(in_->gcount()));
    if (in_->bad()) throw InputError(origin_, "cannot read the trace file");
  }
}

bool TraceReader::next(TraceEvent& e) {
  std::string_view line;
  while (next_line(line)) {
    ++line_no_;
    if (line.size() > kMaxTraceLine) throw line_too_long(origin_, line_no_);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line[first] == '#') continue;  // blank or comment
    const LineContext ctx{origin_, line_no_};
    e = parse_trace_line(line, line_no_, origin_);
    switch (e.op) {
      case TraceEvent::Op::alloc: {
        const auto [it, fresh] = live_.emplace(e.id, line_no_);
        if (!fresh) throw InputError(ctx.at("id"), fmt::format("id {} is already live (allocated at line {})", e.id, it->second));
        break;
      }
      case TraceEvent::Op::free:
        if (live_.erase(e.id) == 0) throw InputError(ctx.at("id"), fmt::format("id {} is not live (never allocated or already freed)", e.id));
        break;
      case TraceEvent::Op::record_stream:
        if (!live_.contains(e.id)) throw InputError(ctx.at("id"), fmt::format("id {} is not live", e.id));
        break;
      default: break;
    }
    return true;
  }
  return false;
}

TraceEvent parse_trace_line(std::string_view line, std::size_t line_no, std::string_view origin, bool fast) {
  TraceEvent e;
  if (fast && parse_event_fast(line, line_no, origin, e)) return e;
  const LineContext ctx{origin, line_no};
  json obj;
  try {
    obj = parse_json_unique(line);
  } catch (const JsonDuplicateKey& err) {
    // nlohmann would keep the last value: {"op":"alloc","id":1,"size":10,"size":20} is not 20.
    throw InputError(ctx.at(err.path()), "key given twice on one line (keep one)");
  } catch (const JsonTooDeep& err) {
    throw InputError(ctx.here(), err.what());  // the byte is the line's
  } catch (const JsonNulByte& err) {
    throw InputError(ctx.here(), fmt::format("not valid JSON ({})", err.what()));
  } catch (const json::exception& err) {
    // parse_error, and out_of_range for a number too large for a double (1e999).
    throw InputError(ctx.here(), fmt::format("not valid JSON ({})", err.what()));
  }
  return parse_event(obj, ctx);
}

std::vector<TraceEvent> parse_trace_text(std::string_view text, std::string_view origin) {
  TraceReader reader(text, origin);
  return read_all(reader);
}

std::vector<TraceEvent> parse_trace_file(const std::string& path) {
  TraceReader reader(path);
  return read_all(reader);
}

Replayer::Replayer(const AllocatorConfig& config, const DeviceSpec& device, std::uint64_t seed)
    : device_(device), alloc_(make_allocator(config, device_, seed)) {
  result_.mode = alloc_->mode();
  result_.seed = seed;
  result_.device = device;
}

const ReplayRow& Replayer::step(const TraceEvent& e) {
  const std::size_t i = index_++;
  ReplayRow& row = row_;
  row = ReplayRow{};
  row.index = i;
  row.line = e.line;
  row.op = e.op;
  row.id = e.id;
  row.stream = e.stream;
  row.name = e.name;
  switch (e.op) {
    case TraceEvent::Op::alloc: {
      BlockKey key;
      if (!spare_keys_.empty()) {
        key = spare_keys_.back();
        spare_keys_.pop_back();
      } else {
        key = next_key_++;
      }
      row.size = e.size;
      const bool ok = alloc_->malloc(key, e.size, e.stream);
      if (!ok) {
        row.oom = true;
        ++result_.oom_count;
        if (alloc_->last_oom() && result_.ooms.size() < kKeptReplayOoms) result_.ooms.emplace_back(i, *alloc_->last_oom());
      }
      ids_[e.id] = Slot{key, ok, e.size};
      break;
    }
    case TraceEvent::Op::free: {
      const auto it = ids_.find(e.id);
      if (it == ids_.end()) throw InputError(fmt::format("event {}", i), fmt::format("free of id {} that is not live", e.id));
      row.size = it->second.size;
      if (it->second.allocated) {
        alloc_->free(it->second.key);
      } else {
        row.skipped = true;
      }
      spare_keys_.push_back(it->second.key);
      ids_.erase(it);
      break;
    }
    case TraceEvent::Op::record_stream: {
      const auto it = ids_.find(e.id);
      if (it == ids_.end()) throw InputError(fmt::format("event {}", i), fmt::format("record_stream of id {} that is not live", e.id));
      if (it->second.allocated) {
        alloc_->record_stream(it->second.key, e.stream);
      } else {
        row.skipped = true;
      }
      break;
    }
    case TraceEvent::Op::sync: alloc_->synchronize(); break;
    case TraceEvent::Op::wait: alloc_->stream_wait(e.stream, e.on); break;
    case TraceEvent::Op::empty_cache: alloc_->empty_cache(); break;
  }
  const AllocStats& s = alloc_->stats();
  row.requested = s.requested.current;
  row.allocated = s.allocated.current;
  row.reserved = s.reserved.current;
  row.device_used = device_.device_used();
  return row;
}

ReplayResult Replayer::summary() const {
  ReplayResult r = result_;
  r.stats = alloc_->stats();
  r.peak_device_used = device_.baseline_used() + device_.peak_charged();
  return r;
}

ReplayResult replay_trace(const std::vector<TraceEvent>& events, const AllocatorConfig& config,
                          const DeviceSpec& device_spec, std::uint64_t seed) {
  Replayer replayer(config, device_spec, seed);
  std::vector<ReplayRow> rows;
  rows.reserve(events.size());
  for (const TraceEvent& e : events) rows.push_back(replayer.step(e));
  ReplayResult result = replayer.summary();
  result.rows = std::move(rows);
  return result;
}

void append_replay_debug_line(fmt::memory_buffer& out, const ReplayRow& r, Bytes before) {
  auto to = fmt::appender(out);
  const bool down = r.reserved < before;
  fmt::format_to(to, "[DEBUG {}] reserved: {:.2f} MiB ({} {:.2f} MiB), allocated: {:.2f} MiB, ", r.index, to_mib(r.reserved),
                 down ? '-' : '+', to_mib(down ? before - r.reserved : r.reserved - before), to_mib(r.allocated));
  switch (r.op) {
    case TraceEvent::Op::alloc: fmt::format_to(to, "module: {:.2f} MiB", to_mib(r.size)); break;
    case TraceEvent::Op::free: fmt::format_to(to, "free: {:.2f} MiB", to_mib(r.size)); break;
    case TraceEvent::Op::record_stream: fmt::format_to(to, "record_stream: id {} on stream {}", r.id, r.stream); break;
    case TraceEvent::Op::wait: fmt::format_to(to, "wait: stream {}", r.stream); break;
    case TraceEvent::Op::sync: fmt::format_to(to, "sync"); break;
    case TraceEvent::Op::empty_cache: fmt::format_to(to, "empty_cache"); break;
  }
  if (!r.name.empty()) fmt::format_to(fmt::appender(out), " ({})", r.name);
  if (r.oom) fmt::format_to(to, " OOM");
  if (r.skipped) fmt::format_to(to, " (skipped: its alloc failed)");
  out.push_back('\n');
}

void append_replay_table_header(fmt::memory_buffer& out, AllocatorMode mode, std::uint64_t seed, const DeviceSpec& device) {
  auto to = fmt::appender(out);
  fmt::format_to(to, "# mode {} seed {} device {} (available {})\n", allocator_mode_name(mode), seed, format_size(device.total),
                 format_size(device.available()));
  fmt::format_to(to, "{:>6} {:>6} {:<13} {:>10} {:>12} {:>12} {:>12} {:>12} {:>12}  {}\n", "event", "line", "op", "id", "size_MiB",
                 "requested", "allocated", "reserved", "device_used", "note");
}

void append_replay_table_row(fmt::memory_buffer& out, const ReplayRow& r) {
  const bool has_id = r.op == TraceEvent::Op::alloc || r.op == TraceEvent::Op::free || r.op == TraceEvent::Op::record_stream;
  std::string note = r.oom ? "OOM" : (r.skipped ? "skipped" : "");
  if (!r.name.empty()) note += (note.empty() ? "" : " ") + r.name;
  fmt::format_to(fmt::appender(out), "{:>6} {:>6} {:<13} {:>10} {:>12.2f} {:>12.2f} {:>12.2f} {:>12.2f} {:>12.2f}  {}\n", r.index,
                 r.line, trace_op_name(r.op), has_id ? std::to_string(r.id) : "-", to_mib(r.size), to_mib(r.requested),
                 to_mib(r.allocated), to_mib(r.reserved), to_mib(r.device_used), note);
}

void append_replay_table_peaks(fmt::memory_buffer& out, const ReplayResult& result) {
  fmt::format_to(fmt::appender(out),
                 "# peaks: requested {:.2f} MiB, allocated {:.2f} MiB, reserved {:.2f} MiB, device_used {:.2f} MiB; {} OOM\n",
                 to_mib(result.stats.requested.peak), to_mib(result.stats.allocated.peak), to_mib(result.stats.reserved.peak),
                 to_mib(result.peak_device_used), result.oom_count);
}

std::string format_replay_debug(const ReplayResult& result) {
  fmt::memory_buffer out;
  Bytes before = 0;
  for (const ReplayRow& r : result.rows) {
    append_replay_debug_line(out, r, before);
    before = r.reserved;
  }
  return fmt::to_string(out);
}

std::string format_replay_table(const ReplayResult& result) {
  fmt::memory_buffer out;
  append_replay_table_header(out, result.mode, result.seed, result.device);
  for (const ReplayRow& r : result.rows) append_replay_table_row(out, r);
  append_replay_table_peaks(out, result);
  return fmt::to_string(out);
}

}  // namespace vf::sim

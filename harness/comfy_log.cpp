#include "harness/comfy_log.h"

#include <algorithm>
#include <charconv>
#include <cctype>
#include <deque>
#include <unordered_map>
#include <cmath>

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
constexpr std::uint64_t kMaxLogVramMb = std::uint64_t{1} << 30;  // 1 PiB in MiB
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && (is_space(s.back()) || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A cursor over one line's text: each step either consumes what it expects or fails, naming
// what it expected; `where` + the failure is the error of a cut-off or malformed line.
class Scan {
 public:
  explicit Scan(std::string_view s) : s_(s) {}
  bool lit(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) {
      // What is left is the start of what was expected: the line was cut off there.
      if (pos_ < s_.size() && w.substr(0, s_.size() - pos_) == s_.substr(pos_)) {
        if (expected_.empty()) {
          expected_ = fmt::format("the line ends inside \"{}\" (column {})", w, s_.size() + 1);
          cut_ = true;
        }
        return false;
      }
      return fail(fmt::format("\"{}\"", w));
    }
    pos_ += w.size();
    return true;
  }
  bool opt_lit(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  void skip_spaces() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }
  bool uint(std::uint64_t& v) {
    const char* b = s_.data() + pos_;
    const char* e = s_.data() + s_.size();
    auto [p, ec] = std::from_chars(b, e, v);
    if (ec != std::errc() || p == b) return fail("a whole number");
    pos_ += static_cast<std::size_t>(p - b);
    return true;
  }
  // A non-negative decimal number as Python prints it ("10795.05", "0.00", "17180").
  bool number(double& v) {
    const std::size_t start = pos_;
    while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
    }
    // Python's repr of a large float: "9.5367431640625e+25" (ComfyUI's "no limit" usable).
    if (pos_ > start && pos_ + 1 < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      std::size_t e = pos_ + 1;
      if (e < s_.size() && (s_[e] == '+' || s_[e] == '-')) ++e;
      if (e < s_.size() && is_digit(s_[e])) {
        while (e < s_.size() && is_digit(s_[e])) ++e;
        pos_ = e;
      }
    }
    if (pos_ == start || s_[start] == '.') {
      pos_ = start;
      return fail("a number");
    }
    auto [p, ec] = std::from_chars(s_.data() + start, s_.data() + pos_, v);
    if (ec != std::errc() || !std::isfinite(v)) {
      pos_ = start;
      return fail("a number");
    }
    return true;
  }
  // Up to (not including) the next space or the end.
  std::string_view word() {
    const std::size_t start = pos_;
    while (pos_ < s_.size() && !is_space(s_[pos_])) ++pos_;
    return s_.substr(start, pos_ - start);
  }
  std::string_view rest() const { return s_.substr(pos_); }
  bool at_end() const { return pos_ >= s_.size(); }
  const std::string& expected() const { return expected_; }
  // The first failure was at the end of the text: the line was cut off, not someone else's.
  bool cut() const { return cut_; }

 private:
  bool fail(std::string what) {
    if (expected_.empty()) {
      cut_ = pos_ >= s_.size();
      expected_ = pos_ >= s_.size() ? fmt::format("the line ends where {} was expected", what)
                                    : fmt::format("expected {} at column {}, found \"{}\"", what, pos_ + 1,
                                                  s_.substr(pos_, std::min<std::size_t>(24, s_.size() - pos_)));
    }
    return false;
  }
  std::string_view s_;
  std::size_t pos_ = 0;
  std::string expected_;
  bool cut_ = false;
};

// A known form's words followed by something else: another program's line that happens to say
// "loaded completely" or "Total VRAM" (a custom node's), not ComfyUI's; it is skipped.
struct NotThisForm {};

// A known form that stops before its end is a cut-off log: an error naming the line. One that
// goes on differently is someone else's line (NotThisForm).
[[noreturn]] void malformed(const std::string& where, std::string_view form, const Scan& sc) {
  if (!sc.cut()) throw NotThisForm{};
  throw InputError(where, fmt::format("a {} line that is cut off: {}", form, sc.expected()));
}

}  // namespace

std::string_view plan_kind_name(LogPlanLine::Kind k) {
  switch (k) {
    case LogPlanLine::Kind::complete: return "loaded completely";
    case LogPlanLine::Kind::partial: return "loaded partially";
    case LogPlanLine::Kind::dynamic: return "prepared for dynamic VRAM loading";
  }
  return "?";
}

namespace {
std::optional<LogPlanLine> plan_line(std::string_view text, const std::string& where);
}  // namespace

std::optional<LogPlanLine> parse_plan_line(std::string_view text, const std::string& where) {
  try {
    return plan_line(text, where);
  } catch (const NotThisForm&) {
    return std::nullopt;
  }
}

namespace {
// "full load: True|False"'s word; anything else is someone else's line, or (a prefix of True or
// False) a cut-off one.
bool full_load_word(std::string_view v, const std::string& where, std::string_view form) {
  if (v == "True") return true;
  if (v == "False") return false;
  Scan bad(v);
  bad.lit(!v.empty() && v.front() == 'F' ? "False" : "True");
  malformed(where, form, bad);
}

std::optional<LogPlanLine> plan_line(std::string_view text, const std::string& where) {
  text = trim(text);
  LogPlanLine p;
  p.text = std::string(text);
  Scan sc(text);
  // Three eras of ModelPatcher.load's line (docs/from-log.md): up to Oct 2025 "loaded completely
  // U L True" / "loaded partially U L N" (raw floats, no offloaded figure); then "loaded
  // completely; U MB usable, L MB loaded, full load: True" / "loaded partially; U MB usable, L MB
  // loaded, O MB offloaded[, B MB buffer reserved], lowvram patches: N"; the newest leaves out
  // "U MB usable," when the budget is unlimited.
  const bool complete = sc.opt_lit("loaded completely");
  const bool partial = !complete && sc.opt_lit("loaded partially");
  if (complete || partial) {
    const std::string_view form = complete ? "\"loaded completely\"" : "\"loaded partially\"";
    p.kind = complete ? LogPlanLine::Kind::complete : LogPlanLine::Kind::partial;
    if (!sc.opt_lit(";")) {
      // The oldest form: space-separated figures.
      if (!sc.opt_lit(" ")) return std::nullopt;  // "loaded completelyX": not this line
      p.old_form = true;
      double u = 0, l = 0;
      if (!sc.number(u) || !sc.lit(" ") || !sc.number(l) || !sc.lit(" ")) malformed(where, form, sc);
      if (u < 1e24) p.usable = u;  // 1e32 bytes (9.5e25 MB): no limit
      p.loaded = l;
      if (complete) {
        p.full_load = full_load_word(sc.word(), where, form);
      } else {
        std::uint64_t n = 0;
        if (!sc.uint(n)) malformed(where, form, sc);
        p.lowvram_patches = static_cast<std::uint32_t>(std::min<std::uint64_t>(n, UINT32_MAX));
      }
      return p;
    }
    sc.skip_spaces();
    double a = 0;
    if (!sc.number(a)) malformed(where, form, sc);
    if (sc.opt_lit(" MB usable,")) {
      p.usable = a;
      sc.skip_spaces();
      if (!sc.number(p.loaded)) malformed(where, form, sc);
    } else {
      p.loaded = a;
    }
    if (!sc.lit(" MB loaded")) malformed(where, form, sc);
    if (complete) {
      if (sc.opt_lit(", full load: ")) {
        p.full_load = full_load_word(sc.word(), where, form);
      }
      return p;
    }
    double off = 0;
    if (!sc.lit(", ") || !sc.number(off) || !sc.lit(" MB offloaded, ")) malformed(where, form, sc);
    p.offloaded = off;
    if (!sc.opt_lit("lowvram patches: ")) {
      double b = 0;
      if (!sc.number(b) || !sc.lit(" MB buffer reserved, ") || !sc.lit("lowvram patches: ")) malformed(where, form, sc);
      p.buffer = b;
    }
    std::uint64_t n = 0;
    if (!sc.uint(n)) malformed(where, form, sc);
    p.lowvram_patches = static_cast<std::uint32_t>(std::min<std::uint64_t>(n, UINT32_MAX));
    return p;
  }
  if (sc.opt_lit("Model ")) {
    // "Model CLASS prepared for dynamic VRAM loading. N MB Staged. P patches attached.
    //  Force pre-loaded K weights: S KB."
    const std::string_view cls = sc.word();
    if (!sc.opt_lit(" prepared for dynamic VRAM loading.")) return std::nullopt;
    p.kind = LogPlanLine::Kind::dynamic;
    p.model_class = std::string(cls);
    sc.skip_spaces();
    std::uint64_t n = 0;
    if (!sc.uint(p.staged_mb) || !sc.lit("MB Staged.")) malformed(where, "\"prepared for dynamic VRAM loading\"", sc);
    sc.skip_spaces();
    if (!sc.at_end()) {
      // Early dynamic builds end after "Staged."
      if (!sc.uint(n) || !sc.lit(" patches attached.")) malformed(where, "\"prepared for dynamic VRAM loading\"", sc);
      p.patches = static_cast<std::uint32_t>(std::min<std::uint64_t>(n, UINT32_MAX));
      p.patches_given = true;
    }
    sc.skip_spaces();
    if (sc.opt_lit("Force pre-loaded ")) {
      if (!sc.uint(n) || !sc.lit(" weights: ") || !sc.uint(p.forced_kb) || !sc.lit(" KB.")) {
        malformed(where, "\"prepared for dynamic VRAM loading\"", sc);
      }
      p.forced = static_cast<std::uint32_t>(std::min<std::uint64_t>(n, UINT32_MAX));
    }
    return p;
  }
  return std::nullopt;
}

}  // namespace

std::optional<LogSizeText> parse_torch_size(std::string_view text) {
  // PyTorch's format_size: "N bytes" below 1 KiB, else two decimals of KiB / MiB / GiB.
  Scan sc(trim(text));
  double v = 0;
  if (!sc.number(v)) return std::nullopt;
  sc.skip_spaces();
  std::string_view unit = sc.word();
  while (!unit.empty() && (unit.back() == '.' || unit.back() == ',' || unit.back() == ';' || unit.back() == ')')) unit.remove_suffix(1);
  double scale = 0;
  if (unit == "bytes" || unit == "B") scale = 1;
  else if (unit == "KiB") scale = static_cast<double>(KiB);
  else if (unit == "MiB") scale = static_cast<double>(MiB);
  else if (unit == "GiB") scale = static_cast<double>(GiB);
  else if (unit == "TiB") scale = static_cast<double>(GiB) * 1024.0;
  else if (unit == "PiB") scale = static_cast<double>(GiB) * 1024.0 * 1024.0;
  else return std::nullopt;
  const double bytes = v * scale;
  if (!(bytes < 1e18)) return std::nullopt;
  LogSizeText out;
  out.bytes = static_cast<Bytes>(std::llround(bytes));
  // Two decimals printed: the value is known to half of 0.01 of its unit.
  out.precision = scale == 1 ? 0 : static_cast<Bytes>(scale * 0.005);
  return out;
}

namespace {

// The size that follows `key` in `text` ("Tried to allocate " -> "640.00 MiB"); the size text
// runs to the unit.
std::optional<LogSizeText> size_after(std::string_view text, std::string_view key) {
  const std::size_t at = text.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  return parse_torch_size(text.substr(at + key.size()));
}

void parse_native(std::string_view text, LogOom& o, const std::string& where) {
  auto cut = [&](std::string_view missing) {
    throw InputError(where, fmt::format("PyTorch's out-of-memory message is cut off or malformed: no {} in \"{}\"", missing,
                                        text.substr(0, std::min<std::size_t>(160, text.size()))));
  };
  o.backend = "native";
  const auto req = size_after(text, "Tried to allocate ");
  if (!req) cut("\"Tried to allocate SIZE\"");
  o.requested = req->bytes;
  o.precision = req->precision;
  // PyTorch 2.1 spelled it "total capacty of".
  const std::string_view cap = text.find("total capacty of ") != std::string_view::npos ? "total capacty of " : "total capacity of ";
  if (text.find(cap) != std::string_view::npos) {
    // PyTorch >= 2.1: "GPU 0 has a total capacity of Y of which Z is free. [Process P has W
    // memory in use. ]Including non-PyTorch memory, this process has W memory in use. Of the
    // allocated memory V is allocated by PyTorch, [...] and U is reserved by PyTorch but
    // unallocated."
    const auto total = size_after(text, cap);
    const auto free = size_after(text, " of which ");
    if (!total) cut("\"total capacity of SIZE\"");
    if (!free || text.find(" is free") == std::string_view::npos) cut("\"of which SIZE is free\"");
    o.total = total->bytes;
    o.free = free->bytes;
    if (auto w = size_after(text, "this process has ")) o.process_used = w->bytes;
    if (auto v = size_after(text, "Of the allocated memory ")) o.allocated = v->bytes;
    const std::size_t unalloc = text.find(" is reserved by PyTorch but unallocated");
    if (unalloc != std::string_view::npos) {
      const std::size_t and_at = text.rfind("and ", unalloc);
      if (and_at != std::string_view::npos) {
        if (auto u = parse_torch_size(text.substr(and_at + 4, unalloc - and_at - 4))) o.reserved_unallocated = u->bytes;
      }
    }
    for (std::size_t at = text.find("Process "); at != std::string_view::npos; at = text.find("Process ", at + 8)) {
      const std::size_t has = text.find(" has ", at);
      if (has == std::string_view::npos || has - at > 24) continue;
      if (auto w = parse_torch_size(text.substr(has + 5))) o.other_processes.push_back(w->bytes);
    }
    return;
  }
  if (text.find("(GPU ") != std::string_view::npos) {
    // PyTorch < 2.1: "(GPU 0; Y total capacity; V already allocated; Z free; R reserved in total
    // by PyTorch)".
    const std::size_t open = text.find("(GPU ");
    const std::size_t close = text.find(')', open);
    if (close == std::string_view::npos) cut("closing \")\" after \"(GPU N; ...\"");
    const std::string_view inner = text.substr(open, close - open);
    std::size_t pos = 0;
    while (pos < inner.size()) {
      std::size_t semi = inner.find(';', pos);
      if (semi == std::string_view::npos) semi = inner.size();
      const std::string_view part = trim(inner.substr(pos, semi - pos));
      pos = semi + 1;
      auto sz = parse_torch_size(part);
      if (!sz) continue;
      if (part.find("total capacity") != std::string_view::npos) o.total = sz->bytes;
      else if (part.find("already allocated") != std::string_view::npos) o.allocated = sz->bytes;
      else if (part.find("free") != std::string_view::npos) o.free = sz->bytes;
    }
    if (!o.total) cut("\"Y total capacity\"");
    if (!o.free) cut("\"Z free\"");
    return;
  }
  cut("device figures (\"GPU N has a total capacity of ...\")");
}

void parse_async(std::string_view text, LogOom& o, const std::string& where) {
  // "Allocation on device N would exceed allowed memory. (out of memory)" then
  // "Currently allocated     : V", "Requested               : X", "Device limit            : Y",
  // "Free (according to CUDA): Z", "PyTorch limit (set by user-supplied memory fraction)" + ": L".
  o.backend = "cudaMallocAsync";
  auto field = [&](std::string_view key) -> std::optional<LogSizeText> {
    const std::size_t at = text.find(key);
    if (at == std::string_view::npos) return std::nullopt;
    const std::size_t colon = text.find(':', at + key.size());
    if (colon == std::string_view::npos) return std::nullopt;
    return parse_torch_size(text.substr(colon + 1));
  };
  const auto req = field("Requested");
  const auto limit = field("Device limit");
  const auto free = field("Free (according to CUDA)");
  if (!req || !limit || !free) {
    throw InputError(where, fmt::format("the cudaMallocAsync out-of-memory message is cut off: it needs its \"Requested\", "
                                        "\"Device limit\" and \"Free (according to CUDA)\" lines ({} missing)",
                                        !req ? "Requested" : !limit ? "Device limit" : "Free (according to CUDA)"));
  }
  o.requested = req->bytes;
  o.precision = req->precision;
  o.total = limit->bytes;
  o.free = free->bytes;
  if (auto a = field("Currently allocated")) o.allocated = a->bytes;
}

constexpr std::string_view kNativeOom = "CUDA out of memory.";
constexpr std::string_view kHipOom = "HIP out of memory.";
// The driver's own error (an allocation outside PyTorch's allocator, e.g. under comfy-aimdo's
// hooks): no sizes.
constexpr std::string_view kDriverOom = "CUDA error: out of memory";
constexpr std::string_view kAsyncOom = "would exceed allowed memory. (out of memory)";

}  // namespace

std::optional<LogOom> parse_oom_text(std::string_view text, const std::string& where) {
  LogOom o;
  o.text = std::string(trim(text));
  if (text.find(kAsyncOom) != std::string_view::npos) {
    parse_async(text, o, where);
    return o;
  }
  if (text.find(kNativeOom) != std::string_view::npos || text.find(kHipOom) != std::string_view::npos) {
    parse_native(text, o, where);
    return o;
  }
  if (text.find(kDriverOom) != std::string_view::npos) {
    o.backend = "driver";
    return o;
  }
  return std::nullopt;
}

namespace {

// One physical line split at '\r' (progress bars redraw with it) and cleaned of ANSI escapes.
// Bytes that cannot be in a text log are an error naming the line and byte offset.
std::string clean_segment(std::string_view seg, std::size_t offset, std::uint32_t line, const std::string& origin) {
  std::string out;
  out.reserve(seg.size());
  for (std::size_t i = 0; i < seg.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(seg[i]);
    if (c == 0x1b) {
      // CSI: ESC [ parameters... final byte 0x40-0x7e; OSC: ESC ] ... BEL or ESC \; others: 2 bytes.
      if (i + 1 < seg.size() && seg[i + 1] == '[') {
        i += 2;
        while (i < seg.size() && !(seg[i] >= 0x40 && seg[i] <= 0x7e)) ++i;
      } else if (i + 1 < seg.size() && seg[i + 1] == ']') {
        i += 2;
        while (i < seg.size() && seg[i] != '\a' && !(seg[i] == 0x1b && i + 1 < seg.size() && seg[i + 1] == '\\')) ++i;
        if (i < seg.size() && seg[i] == 0x1b) ++i;
      } else {
        ++i;
      }
      continue;
    }
    if (c == '\t' || c == '\b' || c == '\f' || c == '\v') {
      out.push_back(' ');
      continue;
    }
    if (c < 0x20 || c == 0x7f) {
      throw InputError(fmt::format("{}:line {}", origin, line),
                       fmt::format("byte 0x{:02x} at offset {} is not text: is this a ComfyUI console log?", c, offset + i));
    }
    out.push_back(static_cast<char>(c));
  }
  return out;
}

std::string torch_dtype(std::string_view s) {
  s = trim(s);
  if (s.substr(0, 6) == "torch.") s.remove_prefix(6);
  return std::string(s);
}

// How a ComfyUI class name reads: its model kind, for giving it the loader lines of its kind.
enum class ClassKind : std::uint8_t { diffusion, text_encoder, vae, other };
ClassKind class_kind(std::string_view cls) {
  // Models beside the main three (a ControlNet, a CLIP vision model, an upscaler) take no loader
  // lines: theirs are not the ones ComfyUI prints for checkpoints.
  for (std::string_view k : {"ControlNet", "ControlLora", "CLIPVision", "Adapter", "Upscal", "ESRGAN", "RRDB"}) {
    if (cls.find(k) != std::string_view::npos) return ClassKind::other;
  }
  for (std::string_view k : {"TEModel", "ClipModel", "T5Model", "ClipModel_", "Hydit"}) {
    if (cls.find(k) != std::string_view::npos) return ClassKind::text_encoder;
  }
  for (std::string_view k : {"VAE", "Autoencod", "TAESD", "StageA", "Tokenizer", "DCAE"}) {
    if (cls.find(k) != std::string_view::npos) return ClassKind::vae;
  }
  return ClassKind::diffusion;
}

// At most this many loads: a console log of one session has tens; more is not a log to rebuild
// one case from (and each costs memory).
constexpr std::size_t kMaxLogLoads = 100000;

struct Reader {
  ComfyLog log;
  const std::string& origin;
  // Loads waiting for their plan line: classic lines take the oldest (in request order), a
  // dynamic line the oldest of its class. Attached ones are skipped lazily.
  std::deque<std::size_t> pending;
  std::unordered_map<std::string, std::deque<std::size_t>> pending_by_class;
  std::vector<std::string> frames;   // the current traceback's frames
  bool in_traceback = false;
  std::size_t tb_col = 0;  // where "Traceback" started on its line
  // Loader lines seen before a request, by the kind of model they describe: ComfyUI's loader
  // nodes all run before the first sampler, so each request takes the oldest of its kind.
  using Info = LogLoaderLines;
  std::deque<Info> info[4];
  std::unordered_map<std::string, Info> last_info;  // by class: the loader lines its last request took
  std::uint32_t pending_scaled_fp8 = 0;  // "Using scaled fp8" before its model's dtype line
  std::string pending_gguf;              // "gguf qtypes" before its model's dtype line
  std::uint32_t pending_gguf_line = 0;
  std::unordered_map<std::string, std::size_t> oom_by_text;
  // The cudaMallocAsync message spans lines: collected until its last field.
  std::string async_block;
  std::uint32_t async_line = 0;
  bool in_summary = false;  // inside the memory summary's table

  explicit Reader(const std::string& o) : origin(o) {}

  std::string where(std::uint32_t line) const { return fmt::format("{}:line {}", origin, line); }

  // "Using scaled fp8" and "gguf qtypes" come before their model's dtype line (or request): the
  // next of those takes them.
  void take_pending(Info& i) {
    i.scaled_fp8_line = pending_scaled_fp8;
    i.gguf_qtype = std::move(pending_gguf);
    i.gguf_line = pending_gguf_line;
    pending_scaled_fp8 = 0;
    pending_gguf.clear();
    pending_gguf_line = 0;
  }

  Info& new_info(ClassKind k) {
    Info& i = info[static_cast<int>(k)].emplace_back();
    take_pending(i);
    return i;
  }

  void take_info(LogLoad& l) {
    const ClassKind k = class_kind(l.model_class);
    if (k == ClassKind::other) return;
    std::deque<Info>& q = info[static_cast<int>(k)];
    Info i;
    if (!q.empty()) {
      i = std::move(q.front());
      q.pop_front();
      last_info[l.model_class] = i;
    } else if (const auto seen = last_info.find(l.model_class); seen != last_info.end()) {
      // Requested again (after a failed or interrupted load, or an unload): the same model file,
      // whose loader lines came before its first request.
      i = seen->second;
    } else {
      // A loader that printed no dtype line (a GGUF loader's qtypes, scaled fp8 just before).
      take_pending(i);
    }
    static_cast<LogLoaderLines&>(l) = std::move(i);
  }

  std::size_t add_load(LogLoad l, std::uint32_t line) {
    if (log.loads.size() >= kMaxLogLoads) {
      throw InputError(where(line), fmt::format("more than {} model loads: not the log of one ComfyUI session (cut it to the run "
                                                "that failed)",
                                                kMaxLogLoads));
    }
    log.loads.push_back(std::move(l));
    return log.loads.size() - 1;
  }

  // Loads still waiting for a plan line will not get one: a run that failed or was interrupted.
  void expire_pending() {
    for (const std::size_t i : pending) {
      if (!log.loads[i].plan) log.loads[i].abandoned = true;
    }
    pending.clear();
    pending_by_class.clear();
  }

  void add_oom(LogOom o) {
    // The message appears before the traceback ("!!! Exception during processing !!! ...") and
    // again at its end ("torch.OutOfMemoryError: ..."): one OOM, which gets the frames of the
    // traceback that ends in it.
    const auto it = oom_by_text.find(o.text);
    if (it != oom_by_text.end()) {
      if (in_traceback) log.ooms[it->second].frames = frames;
      in_traceback = false;
      return;
    }
    if (in_traceback) o.frames = frames;
    in_traceback = false;
    oom_by_text.emplace(o.text, log.ooms.size());
    log.ooms.push_back(std::move(o));
    expire_pending();
  }

  void finish_async() {
    if (async_block.empty()) return;
    std::string block;
    block.swap(async_block);
    auto o = parse_oom_text(block, where(async_line));
    if (o) {
      o->line = async_line;
      add_oom(std::move(*o));
    }
  }

  void segment(std::string_view s, std::uint32_t line) {
    if (log.windows_line == 0) {
      for (std::size_t k = s.find(":\\"); k != std::string_view::npos; k = s.find(":\\", k + 1)) {
        const char d = k > 0 ? s[k - 1] : ' ';
        if (((d >= 'A' && d <= 'Z') || (d >= 'a' && d <= 'z')) && (k < 2 || !std::isalnum(static_cast<unsigned char>(s[k - 2])))) {
          log.windows_line = line;
          break;
        }
      }
    }
    if (!async_block.empty()) {
      // The async message's following lines: "Key : value" (and the memory fraction's
      // continuation ": value").
      const std::string_view t = trim(s);
      const bool field = t.substr(0, 13) == "PyTorch limit" || t.front() == ':' ||
                         (t.find(':') != std::string_view::npos &&
                          (t.substr(0, 19) == "Currently allocated" || t.substr(0, 9) == "Requested" ||
                           t.substr(0, 12) == "Device limit" || t.substr(0, 4) == "Free"));
      if (field) {
        async_block += "\n";
        async_block += t;
        return;
      }
      finish_async();
    }
    std::size_t at = 0;
    if ((at = s.find(kAsyncOom)) != std::string_view::npos) {
      const std::size_t start = s.find("Allocation on device");
      async_block = std::string(trim(s.substr(start == std::string_view::npos ? at : start)));
      async_line = line;
      return;
    }
    for (std::string_view key : {kNativeOom, kHipOom}) {
      if ((at = s.find(key)) == std::string_view::npos) continue;
      const std::string_view after = trim(s.substr(at + key.size()));
      if (s.find("Tried to allocate", at) != std::string_view::npos) {
        auto o = parse_oom_text(s.substr(at), where(line));
        o->line = line;
        add_oom(std::move(*o));
        return;
      }
      if (std::string_view("Tried to allocate").substr(0, after.size()) == after) {
        throw InputError(where(line), "PyTorch's out-of-memory message is cut off before \"Tried to allocate SIZE\"");
      }
    }
    if ((at = s.find(kDriverOom)) != std::string_view::npos) {
      auto o = parse_oom_text(s.substr(at), where(line));
      o->line = line;
      add_oom(std::move(*o));
      return;
    }
    if (s.find("comfy-aimdo inited for GPU") != std::string_view::npos) {
      // aimdo's own stderr line: dynamic VRAM is on unless ComfyUI says otherwise later.
      if (!log.dynamic_vram) {
        log.dynamic_vram = true;
        log.dynamic_vram_line = line;
      }
      return;
    }
    if (s.find("Falling back to legacy ModelPatcher") != std::string_view::npos ||
        s.find("Dynamic vram disabled with argument") != std::string_view::npos) {
      log.dynamic_vram = false;
      log.dynamic_vram_line = line;
      return;
    }
    if (const std::size_t tb = s.find("Traceback (most recent call last):"); tb != std::string_view::npos) {
      in_traceback = true;
      frames.clear();
      tb_col = tb;  // a prefix on every line (docker logs -t, journald) shifts the frames as much
      return;
    }
    const std::string_view body = s.size() > tb_col ? s.substr(tb_col) : std::string_view{};
    if (in_traceback && (body.empty() || (body.front() != ' ' && body.front() != '\t'))) {
      // Frames and their source lines are indented; the exception line ends the traceback (an
      // OOM's was handled above). A custom node's import traceback does not place a later OOM.
      in_traceback = false;
    }
    if (in_traceback) {
      const std::string_view t = trim(body);
      if (t.substr(0, 6) == "File \"") {
        // File "D:\ComfyUI\comfy\ops.py", line 120, in cast_bias_weight
        const std::size_t q = t.find('"', 6);
        const std::size_t in = t.rfind(", in ");
        if (q != std::string_view::npos && in != std::string_view::npos && in > q) {
          std::string path(t.substr(6, q - 6));
          std::replace(path.begin(), path.end(), '\\', '/');
          // Keep the path from the package on: ".../ComfyUI/comfy/ops.py" -> "comfy/ops.py".
          for (std::string_view root : {"/comfy/", "/comfy_extras/", "/custom_nodes/", "/torch/", "/site-packages/"}) {
            const std::size_t r = path.rfind(root);
            if (r != std::string::npos) {
              path = path.substr(r + 1);
              break;
            }
          }
          if (path.rfind("site-packages/", 0) == 0) path = path.substr(14);
          frames.push_back(path + ":" + std::string(trim(t.substr(in + 5))));
        }
      }
      // Source lines and the exception line follow; the OOM line ends the traceback above.
    }
    if (s.find("Memory summary: ") != std::string_view::npos) {
      if (!log.memory_summary) {
        log.memory_summary.emplace();
        log.memory_summary->line = line;
        in_summary = true;
      }
      return;
    }
    if (in_summary) {
      // "| Allocated memory      |  11068 MiB |  11527 MiB |  22890 MiB |  11822 MiB |": the
      // metric's own row (its "from large pool" rows follow); sizes are torch's _format_size.
      const std::string_view t = trim(s);
      if (t.empty() || t.front() != '|') {
        in_summary = false;
      } else {
        std::vector<std::string_view> cols;
        std::size_t p = 1;
        while (p < t.size()) {
          const std::size_t bar = t.find('|', p);
          if (bar == std::string_view::npos) break;
          cols.push_back(trim(t.substr(p, bar - p)));
          p = bar + 1;
        }
        if (cols.size() >= 3 && (cols[0] == "Allocated memory" || cols[0] == "GPU reserved memory")) {
          auto cur = parse_torch_size(cols[1]);
          auto peak = parse_torch_size(cols[2]);
          LogMemorySummary& m = *log.memory_summary;
          if (cols[0] == "Allocated memory") {
            if (cur) m.allocated_cur = cur->bytes;
            if (peak) m.allocated_peak = peak->bytes;
          } else {
            if (cur) m.reserved_cur = cur->bytes;
            if (peak) m.reserved_peak = peak->bytes;
          }
        }
        return;
      }
    }
    if ((at = s.find("Total VRAM ")) != std::string_view::npos) {
      Scan sc(s.substr(at));
      std::uint64_t vram = 0, ram = 0;
      try {
        if (!sc.lit("Total VRAM ") || !sc.uint(vram) || !sc.lit(" MB, total RAM ") || !sc.uint(ram)) {
          malformed(where(line), "\"Total VRAM\"", sc);
        }
      } catch (const NotThisForm&) {
        return;  // "[Crystools] Total VRAM 24 GB": not ComfyUI's line
      }
      if (vram == 0 || vram > (kMaxLogVramMb)) {
        throw InputError(where(line), fmt::format("\"Total VRAM {} MB\": not a device size (1 MB to 1 PiB)", vram));
      }
      log.total_vram_mb = vram;
      log.total_vram_line = line;
      return;
    }
    if ((at = s.find("Device: ")) != std::string_view::npos && s.find("cuda", at) != std::string_view::npos) {
      const std::string_view rest = trim(s.substr(at + 8));
      const std::size_t sep = rest.rfind(" : ");
      log.device = std::string(trim(sep == std::string_view::npos ? rest : rest.substr(0, sep)));
      if (sep != std::string_view::npos) log.backend = std::string(trim(rest.substr(sep + 3)));
      log.device_line = line;
      return;
    }
    if ((at = s.find("ComfyUI version: ")) != std::string_view::npos) {
      Scan sc(s.substr(at + 17));
      log.comfy_version = std::string(sc.word());
      if (!log.comfy_version.empty() && log.comfy_version.front() == 'v') log.comfy_version.erase(0, 1);
      log.comfy_version_line = line;
      return;
    }
    if ((at = s.find("Using async weight offloading with ")) != std::string_view::npos) {
      Scan sc(s.substr(at + 35));
      std::uint64_t n = 0;
      try {
        if (!sc.uint(n) || !sc.lit(" streams")) malformed(where(line), "\"Using async weight offloading\"", sc);
      } catch (const NotThisForm&) {
        return;
      }
      log.async_streams = static_cast<std::uint32_t>(std::min<std::uint64_t>(n, UINT32_MAX));
      log.async_streams_line = line;
      return;
    }
    if (s.find("DynamicVRAM support detected and enabled") != std::string_view::npos) {
      log.dynamic_vram = true;
      log.dynamic_vram_line = line;
      return;
    }
    if ((at = s.find("main.py")) != std::string_view::npos && s.find(" --", at) != std::string_view::npos) {
      log.flags.clear();
      Scan sc(s.substr(at + 7));
      for (;;) {
        sc.skip_spaces();
        if (sc.at_end()) break;
        std::string_view w = sc.word();
        if (w.size() >= 2 && (w.front() == '"' || w.front() == '\'') && w.back() == w.front()) w = w.substr(1, w.size() - 2);
        log.flags.emplace_back(w);
      }
      log.flags_line = line;
      return;
    }
    if (s.find("Processing interrupted") != std::string_view::npos) {
      expire_pending();
      return;
    }
    if ((at = s.find("model weight dtype ")) != std::string_view::npos) {
      const std::string_view rest = s.substr(at + 19);
      const std::size_t comma = rest.find(", manual cast: ");
      Info& i = new_info(ClassKind::diffusion);
      i.weight_dtype = torch_dtype(rest.substr(0, comma));
      i.manual_cast = comma == std::string_view::npos ? "" : torch_dtype(rest.substr(comma + 15));
      i.weight_dtype_line = line;
      return;
    }
    // "CLIP/text encoder model load device: cuda:0, offload device: cpu, current: cpu, dtype:
    // torch.float16", "VAE load device: cuda:0, offload device: cpu, dtype: torch.bfloat16".
    struct DtypeLine {
      std::string_view key;
      ClassKind kind;
      std::string Info::*dtype;
      std::uint32_t Info::*dtype_line;
    };
    for (const DtypeLine& k : {DtypeLine{"CLIP/text encoder model load device: ", ClassKind::text_encoder, &Info::te_dtype, &Info::te_dtype_line},
                               DtypeLine{"VAE load device: ", ClassKind::vae, &Info::vae_dtype, &Info::vae_dtype_line}}) {
      if ((at = s.find(k.key)) == std::string_view::npos) continue;
      if (const std::size_t d = s.find(", dtype: ", at); d != std::string_view::npos) {
        Info& i = new_info(k.kind);
        i.*k.dtype = torch_dtype(s.substr(d + 9));
        i.*k.dtype_line = line;
      }
      return;
    }
    if (s.find("Using scaled fp8: ") != std::string_view::npos) {
      pending_scaled_fp8 = line;
      return;
    }
    if ((at = s.find("gguf qtypes: ")) != std::string_view::npos || (at = s.find("GGUF qtypes: ")) != std::string_view::npos) {
      // "gguf qtypes: F32 (471), Q8_0 (304)": the qtype with the most tensors other than F32/F16.
      std::string best;
      std::uint64_t best_n = 0;
      std::string_view rest = s.substr(at + 13);
      while (!rest.empty()) {
        const std::size_t comma = rest.find(',');
        const std::string_view item = trim(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        const std::size_t open = item.find(" (");
        if (open == std::string_view::npos) continue;
        std::uint64_t n = 0;
        const std::string_view num = item.substr(open + 2);
        std::from_chars(num.data(), num.data() + num.size(), n);
        const std::string_view q = item.substr(0, open);
        if (q == "F32" || q == "F16" || q == "BF16") continue;
        if (n > best_n) {
          best_n = n;
          best = std::string(q);
        }
      }
      pending_gguf = best;
      pending_gguf_line = line;
      return;
    }
    if ((at = s.find("Requested to load ")) != std::string_view::npos) {
      Scan sc(s.substr(at + 18));
      LogLoad l;
      l.line = line;
      l.requested = true;
      l.model_class = std::string(sc.word());
      take_info(l);
      const std::string cls = l.model_class;
      const std::size_t k = add_load(std::move(l), line);
      // An older request of the class still waiting never got its plan line (its load failed,
      // or the prompt ended): this line's plan is the new one's.
      auto& mine = pending_by_class[cls];
      for (const std::size_t old : mine) {
        if (!log.loads[old].plan) log.loads[old].abandoned = true;
      }
      mine.clear();
      pending.push_back(k);
      mine.push_back(k);
      return;
    }
    for (std::string_view key : {"loaded completely", "loaded partially"}) {
      // The line's own forms only: "KEY;" or "KEY <number>" (a custom node's "model loaded
      // completely in 3 s" is not one).
      if ((at = s.find(key)) == std::string_view::npos) continue;
      const std::string_view after = s.substr(at + key.size());
      if (!(after.substr(0, 1) == ";" || (after.size() >= 2 && after[0] == ' ' && is_digit(after[1])))) continue;
      auto p = parse_plan_line(s.substr(at), where(line));
      if (!p) continue;
      p->line = line;
      attach_plan(std::move(*p), line);
      return;
    }
    if ((at = s.find(" prepared for dynamic VRAM loading.")) != std::string_view::npos) {
      const std::size_t m = s.rfind("Model ", at);
      if (m != std::string_view::npos) {
        auto p = parse_plan_line(s.substr(m), where(line));
        if (p) {
          p->line = line;
          log.dynamic_vram = log.dynamic_vram.value_or(true);
          attach_plan(std::move(*p), line);
        }
      }
      return;
    }
    // A progress bar: " 45%|████▌     | 9/20 [00:12<00:15,  1.37s/it]".
    if ((at = s.find("%|")) != std::string_view::npos) {
      const std::size_t bar_end = s.find("| ", at + 2);
      if (bar_end != std::string_view::npos) {
        Scan sc(s.substr(bar_end + 2));
        std::uint64_t done = 0, total = 0;
        if (sc.uint(done) && sc.lit("/") && sc.uint(total) && total > 0 && log.ooms.empty()) {
          log.steps = static_cast<std::uint32_t>(std::min<std::uint64_t>(total, UINT32_MAX));
          log.steps_line = line;
        }
      }
    }
  }

  void attach_plan(LogPlanLine p, std::uint32_t line) {
    // Plan lines come in the order the requests were made; a dynamic line names its class.
    std::optional<std::size_t> pick;
    if (p.kind == LogPlanLine::Kind::dynamic) {
      const auto it = pending_by_class.find(p.model_class);
      if (it != pending_by_class.end()) {
        while (!it->second.empty() && (log.loads[it->second.front()].plan || log.loads[it->second.front()].abandoned)) it->second.pop_front();
        if (!it->second.empty()) {
          pick = it->second.front();
          it->second.pop_front();
        }
      }
    } else {
      while (!pending.empty() && (log.loads[pending.front()].plan || log.loads[pending.front()].abandoned)) pending.pop_front();
      if (!pending.empty()) {
        pick = pending.front();
        pending.pop_front();
      }
    }
    if (!pick) {
      // No "Requested to load" for it (a log that starts mid-way): a load of its own.
      LogLoad l;
      l.line = line;
      l.model_class = p.model_class;
      take_info(l);
      l.plan = std::move(p);
      add_load(std::move(l), line);
      return;
    }
    log.loads[*pick].plan = std::move(p);
  }
};

// Text for JSON: bytes that are not UTF-8 (a cp1252 Windows path) become U+FFFD.
std::string utf8_clean(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (std::size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (ok && n == 2 && c < 0xc2) ok = false;  // overlong
    if (ok && n == 3) {
      const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0)) ok = false;  // overlong, surrogates
    }
    if (ok && n == 4) {
      const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xf0 && c1 < 0x90) || c > 0xf4 || (c == 0xf4 && c1 >= 0x90)) ok = false;
    }
    if (ok) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

}  // namespace

std::string log_text_clean(std::string_view s) { return utf8_clean(s); }

ComfyLog read_comfy_log(std::string_view text, const std::string& origin) {
  Reader r(origin);
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  r.log.digest = h;
  std::size_t pos = 0;
  std::uint32_t line = 0;
  // Classic Mac line ends (no '\n' at all): '\r' ends lines instead of redrawing them.
  const char eol = text.find('\n') == std::string_view::npos && text.find('\r') != std::string_view::npos ? '\r' : '\n';
  while (pos < text.size()) {
    std::size_t nl = text.find(eol, pos);
    if (nl == std::string_view::npos) nl = text.size();
    ++line;
    const std::string_view raw = text.substr(pos, nl - pos);
    std::size_t seg_start = 0;
    while (seg_start <= raw.size()) {
      std::size_t cr = raw.find('\r', seg_start);
      if (cr == std::string_view::npos) cr = raw.size();
      const std::string seg = utf8_clean(clean_segment(raw.substr(seg_start, cr - seg_start), pos + seg_start, line, origin));
      if (!trim(seg).empty()) r.segment(seg, line);
      seg_start = cr + 1;
    }
    pos = nl + 1;
  }
  r.finish_async();
  r.log.lines = line;
  const ComfyLog& l = r.log;
  if (!l.total_vram_mb && l.device.empty() && l.loads.empty() && l.ooms.empty() && l.comfy_version.empty()) {
    throw InputError(origin, fmt::format("none of its {} lines is a ComfyUI line this reader knows (\"Total VRAM\", \"Device:\", "
                                         "\"Requested to load\", \"loaded partially\", \"prepared for dynamic VRAM loading\", "
                                         "PyTorch's \"CUDA out of memory\"): is this a ComfyUI console log?",
                                         line));
  }
  return std::move(r.log);
}

std::optional<std::string> log_flag(const ComfyLog& log, std::string_view flag) {
  for (std::size_t i = 0; i < log.flags.size(); ++i) {
    const std::string& f = log.flags[i];
    if (f == flag) {
      if (i + 1 < log.flags.size() && log.flags[i + 1].rfind("--", 0) != 0) return log.flags[i + 1];
      return std::string();
    }
    if (f.size() > flag.size() && f.compare(0, flag.size(), flag) == 0 && f[flag.size()] == '=') return f.substr(flag.size() + 1);
  }
  return std::nullopt;
}

}  // namespace vf

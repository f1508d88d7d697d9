#include "harness/sim/alloc_options.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf::sim {

namespace {

// Which modes an option applies to.
enum : unsigned { kCachingModes = 1u, kAsyncMode = 2u };

// PyTorch's 2026 AllocatorConfig reads large_segment_size_mb first, wherever it is in the list,
// and refuses it at or below the 10 MiB kMinLargeAlloc. The large segment size is then the
// default of max_non_split_rounding_mb and the minimum of both max_split_size_mb and
// max_non_split_rounding_mb (20 MiB when large_segment_size_mb is not given).
constexpr std::uint64_t kMinLargeSegmentMbExclusive = kMinLargeAlloc / MiB;
// Option values in MiB above this (1 EiB) are refused: no device is that large.
constexpr std::uint64_t kMaxMb = kMaxRequest / MiB;
constexpr Bytes kMaxPoolGranularity = 64 * GiB;
constexpr std::uint64_t kMaxEventLag = 1000000000;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::uint64_t parse_uint(std::string_view text, const std::string& field, std::string_view what) {
  const std::string_view s = trim(text);
  std::uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) {
    throw InputError(field, fmt::format("expected {}, got \"{}\"", what, text));
  }
  return v;
}

double parse_double(std::string_view text, const std::string& field) {
  const std::string_view s = trim(text);
  double v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v)) {
    throw InputError(field, fmt::format("expected a number, got \"{}\"", text));
  }
  return v;
}

bool parse_bool(std::string_view text, const std::string& field) {
  const std::string_view s = trim(text);
  if (s == "True" || s == "true" || s == "1") return true;
  if (s == "False" || s == "false" || s == "0") return false;
  throw InputError(field, fmt::format("expected True or False, got \"{}\"", text));
}

// An integer number of MiB ("MB" in PyTorch's option names means MiB).
Bytes parse_mb(std::string_view text, const std::string& field) {
  const std::uint64_t mb = parse_uint(text, field, "a whole number of MiB");
  if (mb > kMaxMb) throw InputError(field, fmt::format("{} MiB is out of range (at most {})", mb, kMaxMb));
  return mb * MiB;
}

bool is_never(std::string_view s) {
  return s == "max" || s == "never" || s == "unlimited" || s == "UINT64_MAX" || s == "18446744073709551615";
}

}  // namespace

RoundupDivisions parse_roundup_power2_divisions(std::string_view text, std::string_view field_name) {
  const std::string field(field_name);
  RoundupDivisions table{};
  const std::string_view s = trim(text);
  if (s.empty()) throw InputError(field, "empty value (examples: 4, [256:4,>:8])");

  if (s.front() != '[') {
    // One value for every size: PyTorch requires a power of two.
    const std::uint64_t d = parse_uint(s, field, "a power of two or a [K:d,...] list");
    if (!std::has_single_bit(d)) throw InputError(field, fmt::format("divisions must be a power of two, got {}", d));
    if (d > 0xffffffffu) throw InputError(field, fmt::format("{} divisions is out of range", d));
    table.fill(static_cast<std::uint32_t>(d));
    return table;
  }
  if (s.back() != ']') throw InputError(field, fmt::format("missing closing ']' in \"{}\"", text));

  // List form, PyTorch's rules: "K:d" sets the entry of sizes [K, 2K) MiB (K a power of two);
  // the first K also fills every entry below it; ">:d" fills every entry after the last K given;
  // entries not mentioned stay 0 (plain 512 B rounding).
  std::string_view body = s.substr(1, s.size() - 2);
  if (trim(body).empty()) throw InputError(field, "empty list");
  bool first = true;
  std::size_t last_index = 0;
  while (true) {
    const std::size_t comma = body.find(',');
    const std::string_view item = trim(body.substr(0, comma));
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      throw InputError(field, fmt::format("list entry \"{}\" is not K:divisions", item));
    }
    const std::string_view key = trim(item.substr(0, colon));
    const std::uint64_t d = parse_uint(item.substr(colon + 1), field, "a number of divisions (0 or a power of two)");
    if (d != 0 && !std::has_single_bit(d)) {
      throw InputError(field, fmt::format("divisions must be a power of two or 0, got {} in \"{}\"", d, item));
    }
    if (d > 0xffffffffu) throw InputError(field, fmt::format("{} divisions is out of range", d));
    const auto value = static_cast<std::uint32_t>(d);
    if (key == ">") {
      std::fill(table.begin() + static_cast<std::ptrdiff_t>(std::min(last_index + 1, kRoundupIntervals)), table.end(),
                value);
    } else {
      const std::uint64_t k = parse_uint(key, field, "a size in MiB (a power of two) or '>'");
      if (!std::has_single_bit(k)) {
        throw InputError(field, fmt::format("interval start must be a power of two in MiB, got {}", k));
      }
      const std::size_t index = std::min<std::size_t>(static_cast<std::size_t>(std::bit_width(k) - 1), kRoundupIntervals - 1);
      if (first) {
        std::fill(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(index), value);
        first = false;
      }
      table[index] = value;
      last_index = index;
    }
    if (comma == std::string_view::npos) break;
    body.remove_prefix(comma + 1);
  }
  return table;
}

namespace {

struct Seen {
  bool non_split_rounding = false;
  bool gc = false;
  bool fraction = false;
  bool probability = false;
  bool expandable_given = false;
};

using Handler = void (*)(AllocOptions&, Seen&, std::string_view value, const std::string& field);

// max_split_size_mb and max_non_split_rounding_mb may not be below the large segment size.
void check_segment_minimum(Bytes value, Bytes large_segment_size, const std::string& field) {
  if (value >= large_segment_size) return;
  throw InputError(field, fmt::format("must be >= {} (PyTorch's minimum: large_segment_size_mb{}), got {}", large_segment_size / MiB,
                                      large_segment_size == kLargeBuffer ? ", 20 unless given" : "", value / MiB));
}

struct OptionSpec {
  AllocOptionInfo info;
  unsigned modes;
  Handler parse;
};

// The table of options. Meanings and defaults are repeated in docs/allocators.md.
const OptionSpec kOptions[] = {
    {{"max_split_size_mb", "caching, caching-expandable", "unlimited",
      "blocks of this size or more are never split; requests below it never take them (§1.4, §1.7); >= large_segment_size_mb"},
     kCachingModes,
     [](AllocOptions& o, Seen&, std::string_view v, const std::string& f) {
       const Bytes b = parse_mb(v, f);
       check_segment_minimum(b, o.caching.large_segment_size, f);
       o.caching.max_split_size = b;
     }},
    {{"max_non_split_rounding_mb", "caching, caching-expandable", "large_segment_size_mb (20)",
      "an oversize request may take a cached block less than this much larger (§1.4); >= large_segment_size_mb"},
     kCachingModes,
     [](AllocOptions& o, Seen& s, std::string_view v, const std::string& f) {
       const Bytes b = parse_mb(v, f);
       check_segment_minimum(b, o.caching.large_segment_size, f);
       o.caching.max_non_split_rounding = b;
       s.non_split_rounding = true;
     }},
    {{"roundup_power2_divisions", "caching, caching-expandable", "0 (off)",
      "round requests up to one of d steps per power-of-two interval: \"4\" or \"[256:4,>:8]\" (§1.2)"},
     kCachingModes,
     [](AllocOptions& o, Seen&, std::string_view v, const std::string& f) {
       o.caching.roundup_divisions = parse_roundup_power2_divisions(v, f);
     }},
    {{"garbage_collection_threshold", "caching, caching-expandable", "0 (off)",
      "in (0,1); with a memory fraction, free old cached blocks once reserved > threshold x allowed (§1.7)"},
     kCachingModes,
     [](AllocOptions& o, Seen& s, std::string_view v, const std::string& f) {
       const double t = parse_double(v, f);
       if (!(t > 0 && t < 1)) throw InputError(f, fmt::format("must be in (0, 1), got {}", v));
       o.caching.garbage_collection_threshold = t;
       s.gc = true;
     }},
    {{"per_process_memory_fraction", "caching, caching-expandable, async", "1 (no limit)",
      "in [0,1]; caching: reserved + new segment <= f x total; async: requested <= f x total (§1.7, §2)"},
     kCachingModes | kAsyncMode,
     [](AllocOptions& o, Seen& s, std::string_view v, const std::string& f) {
       const double t = parse_double(v, f);
       if (!(t >= 0 && t <= 1)) throw InputError(f, fmt::format("must be in [0, 1], got {}", v));
       o.caching.memory_fraction = t;
       o.async.memory_fraction = t;
       s.fraction = t < 1;
     }},
    {{"expandable_segments", "caching, caching-expandable", "False",
      "True: one growable segment per (stream, pool), pages mapped on demand (§1.8)"},
     kCachingModes,
     [](AllocOptions& o, Seen& s, std::string_view v, const std::string& f) {
       o.caching.expandable_segments = parse_bool(v, f);
       s.expandable_given = true;
     }},
    {{"large_segment_size_mb", "caching, caching-expandable", "20",
      "segment size for 1-10 MiB requests; page size of large expandable segments (§1.1, §1.8); > 10; read before every "
      "other option: the default of max_non_split_rounding_mb and the minimum of it and max_split_size_mb"},
     kCachingModes,
     [](AllocOptions& o, Seen&, std::string_view v, const std::string& f) {
       const Bytes b = parse_mb(v, f);
       if (b <= kMinLargeSegmentMbExclusive * MiB) {
         throw InputError(f, fmt::format("must be > {} (PyTorch's minimum), got {}", kMinLargeSegmentMbExclusive, b / MiB));
       }
       o.caching.large_segment_size = b;
     }},
    {{"sim_event_lag", "caching, caching-expandable", "never",
      "sim only: record_stream events complete after this many later mallocs; never = only at a sync"},
     kCachingModes,
     [](AllocOptions& o, Seen&, std::string_view v, const std::string& f) {
       if (trim(v) == "never") {
         o.caching.event_lag_mallocs.reset();
         return;
       }
       const std::uint64_t n = parse_uint(v, f, "\"never\" or a number of mallocs");
       if (n > kMaxEventLag) throw InputError(f, fmt::format("at most {} mallocs, got {}", kMaxEventLag, n));
       o.caching.event_lag_mallocs = static_cast<std::uint32_t>(n);
     }},
    {{"release_threshold", "async", "never (PyTorch: UINT64_MAX)",
      "bytes the pool keeps at a synchronize; above it free chunks are trimmed (CUDA default 0) (§3.1)"},
     kAsyncMode,
     [](AllocOptions& o, Seen&, std::string_view v, const std::string& f) {
       o.async.release_threshold = is_never(trim(v)) ? kReleaseNever : parse_size(v, f);
     }},
    {{"pool_granularity", "async", "32MiB",
      "physical growth step of the pool; a multiple of 2 MiB; 32MiB measured on an H200 (reports/gpu/) and in the origin thread's "
      "RTX 4090 trace (§3.1, §7.5)"},
     kAsyncMode,
     [](AllocOptions& o, Seen&, std::string_view v, const std::string& f) {
       const Bytes g = parse_size(v, f);
       if (g == 0 || g % kPoolGranularityQuantum != 0 || g > kMaxPoolGranularity) {
         throw InputError(f, fmt::format("must be a multiple of 2 MiB between 2 MiB and 64 GiB, got \"{}\"", v));
       }
       o.async.pool_granularity = g;
     }},
    {{"reuse_follow_event_dependencies", "async", "True",
      "another stream reuses a free after waiting on the freeing stream (§3.1)"},
     kAsyncMode,
     [](AllocOptions& o, Seen&, std::string_view v, const std::string& f) {
       o.async.reuse_follow_event_dependencies = parse_bool(v, f);
     }},
    {{"reuse_allow_opportunistic", "async", "True",
      "another stream reuses a free that happens to be complete (a seeded coin per free) (§3.1)"},
     kAsyncMode,
     [](AllocOptions& o, Seen&, std::string_view v, const std::string& f) {
       o.async.reuse_allow_opportunistic = parse_bool(v, f);
     }},
    {{"reuse_allow_internal_dependencies", "async", "True",
      "when the pool cannot grow, reuse pending frees of other streams (the driver adds the wait) (§3.1)"},
     kAsyncMode,
     [](AllocOptions& o, Seen&, std::string_view v, const std::string& f) {
       o.async.reuse_allow_internal_dependencies = parse_bool(v, f);
     }},
    {{"opportunistic_probability", "async", "0.5 (UNVERIFIED)",
      "in [0,1]: chance that a free counts as complete for opportunistic reuse"},
     kAsyncMode,
     [](AllocOptions& o, Seen& s, std::string_view v, const std::string& f) {
       const double p = parse_double(v, f);
       if (!(p >= 0 && p <= 1)) throw InputError(f, fmt::format("must be in [0, 1], got {}", v));
       o.async.opportunistic_probability = p;
       s.probability = true;
     }},
};

// PyTorch keys the sim knows but does not model: a precise error beats "unknown option".
struct Unmodelled {
  std::string_view name;
  std::string_view reason;
};
const Unmodelled kUnmodelled[] = {
    {"backend", "is not an option here: the allocator mode is the backend (native = caching, cudaMallocAsync = async); "
                "give it with --allocator or the scenario's allocator.mode"},
    {"pinned_use_background_threads", "is a pinned host memory option; the sim models device memory only"},
    {"pinned_use_cuda_host_register", "is a pinned host memory option; the sim models device memory only"},
    {"pinned_num_register_threads", "is a pinned host memory option; the sim models device memory only"},
    {"release_lock_on_cudamalloc", "only changes locking, not memory; the sim does not model it"},
    {"graph_capture_record_stream_reuse", "concerns CUDA graph capture, which the sim does not model"},
    {"throw_on_cudamalloc_oom", "is not modelled by the sim (it skips the retry ladder over the fraction)"},
};

std::string known_names(unsigned mode_bit) {
  std::string out;
  for (const OptionSpec& o : kOptions) {
    if ((o.modes & mode_bit) == 0) continue;
    if (!out.empty()) out += ", ";
    out += o.info.name;
  }
  return out;
}

}  // namespace

std::span<const AllocOptionInfo> alloc_option_table() {
  static const std::vector<AllocOptionInfo> table = [] {
    std::vector<AllocOptionInfo> t;
    for (const OptionSpec& o : kOptions) t.push_back(o.info);
    return t;
  }();
  return table;
}

AllocOptions parse_alloc_options(const AllocatorConfig& config, std::string_view path) {
  return parse_alloc_options(config, [path](std::string_view key) { return fmt::format("{}.options.{}", path, key); });
}

AllocOptions parse_alloc_options(const AllocatorConfig& config, const OptionFieldName& field_of) {
  AllocOptions out;
  out.mode = config.mode;

  if (config.mode == AllocatorMode::raw) {
    if (!config.options.empty()) {
      throw InputError(field_of(config.options.front().first), "the raw allocator (cudaMalloc/cudaFree) takes no options");
    }
    return out;
  }
  const bool async = config.mode == AllocatorMode::async;
  const unsigned mode_bit = async ? kAsyncMode : kCachingModes;
  if (config.mode == AllocatorMode::caching_expandable) out.caching.expandable_segments = true;

  Seen seen;
  // large_segment_size_mb first, wherever it is: the minimums of two other options depend on it.
  std::vector<std::pair<std::string, std::string>> ordered;
  for (const auto& kv : config.options) {
    if (kv.first == "large_segment_size_mb" && !async) ordered.push_back(kv);
  }
  for (const auto& kv : config.options) {
    if (kv.first != "large_segment_size_mb" || async) ordered.push_back(kv);
  }
  std::vector<std::string_view> given;
  for (const auto& [key, value] : ordered) {
    const std::string field = field_of(key);
    if (std::find(given.begin(), given.end(), key) != given.end()) {
      throw InputError(field, "given twice; keep one value");
    }
    given.push_back(key);

    const OptionSpec* spec = nullptr;
    for (const OptionSpec& o : kOptions) {
      if (o.info.name == key) spec = &o;
    }
    if (spec == nullptr) {
      for (const Unmodelled& u : kUnmodelled) {
        if (u.name == key) throw InputError(field, fmt::format("{} {}", key, u.reason));
      }
      throw InputError(field, fmt::format("unknown option for the {} allocator (known: {})",
                                          allocator_mode_name(config.mode), known_names(mode_bit)));
    }
    if ((spec->modes & mode_bit) == 0) {
      if (async) {
        throw InputError(field, fmt::format("PyTorch ignores {} with cudaMallocAsync (backend:cudaMallocAsync); remove it", key));
      }
      throw InputError(field, fmt::format("{} applies only to the async (cudaMallocAsync) mode; remove it", key));
    }
    spec->parse(out, seen, value, field);
  }

  if (!seen.non_split_rounding) out.caching.max_non_split_rounding = out.caching.large_segment_size;

  // Combinations.
  if (config.mode == AllocatorMode::caching_expandable && !out.caching.expandable_segments) {
    throw InputError(field_of("expandable_segments"), "mode caching-expandable needs expandable_segments True; use mode caching instead");
  }
  if (seen.gc && !seen.fraction) {
    throw InputError(field_of("garbage_collection_threshold"),
                     "has no effect without per_process_memory_fraction < 1 (PyTorch runs GC only under a memory fraction)");
  }
  if (seen.probability && !out.async.reuse_allow_opportunistic) {
    throw InputError(field_of("opportunistic_probability"), "has no effect with reuse_allow_opportunistic False; remove one");
  }
  if (!async && out.caching.expandable_segments) out.mode = AllocatorMode::caching_expandable;
  if (!async && !out.caching.expandable_segments) out.mode = AllocatorMode::caching;
  return out;
}

}  // namespace vf::sim

// The text options of every allocator mode, by the allocator's own names
// (PYTORCH_ALLOC_CONF keys for the caching modes, the pool attributes for async), parsed and
// checked strictly: an unknown key, a value of the wrong type or out of range, or an option
// that does nothing in the chosen mode is an InputError naming `<path>.options.<key>`.
// docs/allocators.md has the table of every option.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "harness/scenario.h"
#include "harness/sim/async_pool.h"
#include "harness/sim/caching.h"

namespace vf::sim {

struct AllocOptions {
  // The model to build. `caching` with expandable_segments:True builds caching-expandable.
  AllocatorMode mode = AllocatorMode::raw;
  CachingOptions caching;  // caching, caching-expandable
  AsyncOptions async;      // async
};

// Names the field of an option key in errors: "allocator.options.max_split_size_mb" for a
// scenario, "--option max_split_size_mb" for a flag.
using OptionFieldName = std::function<std::string(std::string_view key)>;

// Parses and validates `config.options` for `config.mode`. `path` prefixes error paths
// ("allocator" -> "allocator.options.max_split_size_mb").
AllocOptions parse_alloc_options(const AllocatorConfig& config, std::string_view path);
// The same, with each option's field named by `field_of` (options from a file and from flags).
AllocOptions parse_alloc_options(const AllocatorConfig& config, const OptionFieldName& field_of);

// The value of roundup_power2_divisions: one power of two for every size ("4"), or the list
// form "[K:d,...,>:d]" (K in MiB, a power of two; d a power of two or 0). Throws InputError(field).
RoundupDivisions parse_roundup_power2_divisions(std::string_view text, std::string_view field);

// One row per option, as documented in docs/allocators.md.
struct AllocOptionInfo {
  std::string_view name;
  std::string_view modes;
  std::string_view default_value;
  std::string_view meaning;
};
std::span<const AllocOptionInfo> alloc_option_table();

}  // namespace vf::sim

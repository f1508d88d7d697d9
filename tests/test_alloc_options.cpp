// Allocator options: parsed by the allocator's own names, strictly (docs/allocators.md).
#include <gtest/gtest.h>

#include <string>

#include "harness/core/error.h"
#include "harness/sim/alloc_options.h"

namespace vf::sim {
namespace {

AllocatorConfig config(AllocatorMode mode, std::vector<std::pair<std::string, std::string>> options = {}) {
  AllocatorConfig c;
  c.mode = mode;
  c.options = std::move(options);
  return c;
}

// The InputError a config raises: its path and message.
std::pair<std::string, std::string> error_of(const AllocatorConfig& c) {
  try {
    parse_alloc_options(c, "allocator");
  } catch (const InputError& e) {
    return {e.path(), e.what()};
  }
  ADD_FAILURE() << "expected an InputError";
  return {};
}

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

std::string message_of(const AllocatorConfig& c) { return error_of(c).second; }

TEST(AllocOptions, DefaultsPerMode) {
  const AllocOptions caching = parse_alloc_options(config(AllocatorMode::caching), "allocator");
  EXPECT_EQ(caching.mode, AllocatorMode::caching);
  EXPECT_EQ(caching.caching.max_split_size, kUnlimited);
  EXPECT_EQ(caching.caching.max_non_split_rounding, 20 * MiB);
  EXPECT_EQ(caching.caching.large_segment_size, 20 * MiB);
  EXPECT_EQ(caching.caching.memory_fraction, 1.0);
  EXPECT_FALSE(caching.caching.event_lag_mallocs.has_value());  // conservative
  const AllocOptions exp = parse_alloc_options(config(AllocatorMode::caching_expandable), "allocator");
  EXPECT_EQ(exp.mode, AllocatorMode::caching_expandable);
  EXPECT_TRUE(exp.caching.expandable_segments);
  const AllocOptions async = parse_alloc_options(config(AllocatorMode::async), "allocator");
  EXPECT_EQ(async.async.release_threshold, kReleaseNever);       // PyTorch's setting
  EXPECT_EQ(async.async.pool_granularity, kDefaultPoolGranularity);  // 2 MiB, UNVERIFIED
  EXPECT_TRUE(async.async.reuse_follow_event_dependencies);
  EXPECT_TRUE(async.async.reuse_allow_opportunistic);
  EXPECT_TRUE(async.async.reuse_allow_internal_dependencies);
  EXPECT_EQ(async.async.opportunistic_probability, 0.5);
}

TEST(AllocOptions, CachingValues) {
  const AllocOptions o = parse_alloc_options(
      config(AllocatorMode::caching, {{"max_split_size_mb", "200"},
                                      {"max_non_split_rounding_mb", "40"},
                                      {"roundup_power2_divisions", "[256:4,>:8]"},
                                      {"per_process_memory_fraction", "0.8"},
                                      {"garbage_collection_threshold", "0.6"},
                                      {"large_segment_size_mb", "32"},
                                      {"sim_event_lag", "3"}}),
      "allocator");
  EXPECT_EQ(o.caching.max_split_size, 200 * MiB);
  EXPECT_EQ(o.caching.max_non_split_rounding, 40 * MiB);
  EXPECT_EQ(o.caching.roundup_divisions[8], 4u);
  EXPECT_EQ(o.caching.roundup_divisions[9], 8u);
  EXPECT_EQ(o.caching.memory_fraction, 0.8);
  EXPECT_EQ(o.caching.garbage_collection_threshold, 0.6);
  EXPECT_EQ(o.caching.large_segment_size, 32 * MiB);
  EXPECT_EQ(o.caching.event_lag_mallocs, 3u);
}

TEST(AllocOptions, ExpandableSegmentsOptionSwitchesTheModel) {
  const AllocOptions o =
      parse_alloc_options(config(AllocatorMode::caching, {{"expandable_segments", "True"}}), "allocator");
  EXPECT_EQ(o.mode, AllocatorMode::caching_expandable);
  const AllocOptions off =
      parse_alloc_options(config(AllocatorMode::caching, {{"expandable_segments", "false"}}), "allocator");
  EXPECT_EQ(off.mode, AllocatorMode::caching);
  const auto [path, msg] =
      error_of(config(AllocatorMode::caching_expandable, {{"expandable_segments", "False"}}));
  EXPECT_EQ(path, "allocator.options.expandable_segments");
}

TEST(AllocOptions, AsyncValues) {
  const AllocOptions o = parse_alloc_options(
      config(AllocatorMode::async, {{"release_threshold", "0"},
                                    {"pool_granularity", "32MiB"},
                                    {"reuse_follow_event_dependencies", "False"},
                                    {"reuse_allow_internal_dependencies", "0"},
                                    {"opportunistic_probability", "0.25"},
                                    {"per_process_memory_fraction", "0.9"}}),
      "allocator");
  EXPECT_EQ(o.async.release_threshold, 0u);
  EXPECT_EQ(o.async.pool_granularity, 32 * MiB);
  EXPECT_FALSE(o.async.reuse_follow_event_dependencies);
  EXPECT_FALSE(o.async.reuse_allow_internal_dependencies);
  EXPECT_EQ(o.async.opportunistic_probability, 0.25);
  EXPECT_EQ(o.async.memory_fraction, 0.9);
  for (const char* never : {"max", "never", "UINT64_MAX", "18446744073709551615"}) {
    EXPECT_EQ(parse_alloc_options(config(AllocatorMode::async, {{"release_threshold", never}}), "a")
                  .async.release_threshold,
              kReleaseNever);
  }
  EXPECT_EQ(parse_alloc_options(config(AllocatorMode::async, {{"release_threshold", "1GiB"}}), "a")
                .async.release_threshold,
            1 * GiB);
}

TEST(AllocOptions, UnknownKeyNamesTheFieldAndTheKnownKeys) {
  const auto [path, msg] = error_of(config(AllocatorMode::caching, {{"max_split_mb", "100"}}));
  EXPECT_EQ(path, "allocator.options.max_split_mb");
  EXPECT_TRUE(contains(msg, "unknown option"));
  EXPECT_TRUE(contains(msg, "max_split_size_mb"));
}

TEST(AllocOptions, WrongTypesAndRanges) {
  struct Case {
    AllocatorMode mode;
    std::string key;
    std::string value;
    std::string_view expect;
  };
  const Case cases[] = {
      {AllocatorMode::caching, "max_split_size_mb", "abc", "whole number of MiB"},
      {AllocatorMode::caching, "max_split_size_mb", "19", "must be >= 20"},
      {AllocatorMode::caching, "max_split_size_mb", "-5", "whole number"},
      {AllocatorMode::caching, "max_non_split_rounding_mb", "10", "must be >= 20"},
      {AllocatorMode::caching, "large_segment_size_mb", "10", "must be > 10"},
      {AllocatorMode::caching, "per_process_memory_fraction", "1.5", "[0, 1]"},
      {AllocatorMode::caching, "per_process_memory_fraction", "nan", "expected a number"},
      {AllocatorMode::caching, "expandable_segments", "yes", "True or False"},
      {AllocatorMode::caching, "roundup_power2_divisions", "3", "power of two"},
      {AllocatorMode::caching, "roundup_power2_divisions", "[100:4]", "power of two in MiB"},
      {AllocatorMode::caching, "roundup_power2_divisions", "[128:3]", "power of two or 0"},
      {AllocatorMode::caching, "roundup_power2_divisions", "[128:4", "closing ']'"},
      {AllocatorMode::caching, "roundup_power2_divisions", "[]", "empty list"},
      {AllocatorMode::caching, "roundup_power2_divisions", "[128]", "K:divisions"},
      {AllocatorMode::caching, "sim_event_lag", "-1", "never"},
      {AllocatorMode::async, "pool_granularity", "3MiB", "multiple of 2 MiB"},
      {AllocatorMode::async, "pool_granularity", "0", "multiple of 2 MiB"},
      {AllocatorMode::async, "release_threshold", "lots", "not a size"},
      {AllocatorMode::async, "opportunistic_probability", "2", "[0, 1]"},
      {AllocatorMode::async, "reuse_allow_opportunistic", "maybe", "True or False"},
  };
  for (const Case& c : cases) {
    const auto [path, msg] = error_of(config(c.mode, {{c.key, c.value}}));
    EXPECT_EQ(path, "allocator.options." + c.key) << c.key << "=" << c.value;
    EXPECT_TRUE(contains(msg, c.expect)) << c.key << "=" << c.value << ": " << msg;
  }
}

TEST(AllocOptions, GarbageCollectionNeedsAMemoryFraction) {
  const auto [path, msg] = error_of(config(AllocatorMode::caching, {{"garbage_collection_threshold", "0.5"}}));
  EXPECT_EQ(path, "allocator.options.garbage_collection_threshold");
  EXPECT_TRUE(contains(msg, "per_process_memory_fraction"));
  EXPECT_EQ(error_of(config(AllocatorMode::caching, {{"garbage_collection_threshold", "1.0"},
                                                     {"per_process_memory_fraction", "0.5"}}))
                .first,
            "allocator.options.garbage_collection_threshold");
}

TEST(AllocOptions, OptionsOfAnotherModeAreRefused) {
  const auto [path, msg] = error_of(config(AllocatorMode::async, {{"max_split_size_mb", "100"}}));
  EXPECT_EQ(path, "allocator.options.max_split_size_mb");
  EXPECT_TRUE(contains(msg, "PyTorch ignores max_split_size_mb with cudaMallocAsync"));
  EXPECT_TRUE(contains(msg, "remove it"));
  for (const char* key : {"roundup_power2_divisions", "garbage_collection_threshold", "expandable_segments",
                          "large_segment_size_mb", "sim_event_lag"}) {
    EXPECT_TRUE(contains(error_of(config(AllocatorMode::async, {{key, "1"}})).second, "PyTorch ignores")) << key;
  }
  const auto [path2, msg2] = error_of(config(AllocatorMode::caching, {{"release_threshold", "0"}}));
  EXPECT_EQ(path2, "allocator.options.release_threshold");
  EXPECT_TRUE(contains(msg2, "applies only to the async"));
  const auto [path3, msg3] = error_of(config(AllocatorMode::raw, {{"pool_granularity", "2MiB"}}));
  EXPECT_EQ(path3, "allocator.options.pool_granularity");
  EXPECT_TRUE(contains(msg3, "takes no options"));
}

TEST(AllocOptions, CombinationsAndDuplicates) {
  EXPECT_EQ(error_of(config(AllocatorMode::async, {{"reuse_allow_opportunistic", "False"},
                                                   {"opportunistic_probability", "0.3"}}))
                .first,
            "allocator.options.opportunistic_probability");
  const auto [path, msg] =
      error_of(config(AllocatorMode::caching, {{"max_split_size_mb", "100"}, {"max_split_size_mb", "200"}}));
  EXPECT_EQ(path, "allocator.options.max_split_size_mb");
  EXPECT_TRUE(contains(msg, "twice"));
}

TEST(AllocOptions, KnownButUnmodelledPyTorchKeysGetAReason) {
  const auto [path, msg] = error_of(config(AllocatorMode::caching, {{"backend", "cudaMallocAsync"}}));
  EXPECT_EQ(path, "allocator.options.backend");
  EXPECT_TRUE(contains(msg, "allocator mode"));
  EXPECT_TRUE(contains(error_of(config(AllocatorMode::caching, {{"pinned_use_background_threads", "True"}})).second,
                       "pinned"));
}

// PyTorch 2026's AllocatorConfig: large_segment_size_mb is read first; it is the default of
// max_non_split_rounding_mb and the minimum of it and max_split_size_mb.
TEST(AllocOptions, LargeSegmentSizeIsTheMinimumOfTheSplitOptions) {
  // 15 with a 15 MiB segment: legal (refused before as "must be >= 20"), in either order.
  for (const bool segment_first : {true, false}) {
    std::vector<std::pair<std::string, std::string>> opts = {{"max_split_size_mb", "15"}, {"max_non_split_rounding_mb", "15"}};
    opts.insert(segment_first ? opts.begin() : opts.end(), {"large_segment_size_mb", "15"});
    const AllocOptions o = parse_alloc_options(config(AllocatorMode::caching, opts), "allocator");
    EXPECT_EQ(o.caching.large_segment_size, 15 * MiB);
    EXPECT_EQ(o.caching.max_split_size, 15 * MiB);
    EXPECT_EQ(o.caching.max_non_split_rounding, 15 * MiB);
  }
  // 20 with a 25 MiB segment: refused, naming the segment size, wherever the segment is given.
  for (const char* key : {"max_split_size_mb", "max_non_split_rounding_mb"}) {
    const std::string msg =
        message_of(config(AllocatorMode::caching, {{key, "20"}, {"large_segment_size_mb", "25"}}));
    EXPECT_TRUE(contains(msg, std::string("allocator.options.") + key + ": must be >= 25")) << msg;
  }
  // Without it the minimum is 20 MiB, as before.
  EXPECT_TRUE(contains(message_of(config(AllocatorMode::caching, {{"max_split_size_mb", "15"}})), "must be >= 20"));
}

TEST(AllocOptions, LargeSegmentSizeIsTheDefaultNonSplitRounding) {
  EXPECT_EQ(parse_alloc_options(config(AllocatorMode::caching, {{"large_segment_size_mb", "25"}}), "allocator")
                .caching.max_non_split_rounding,
            25 * MiB);
  EXPECT_EQ(parse_alloc_options(config(AllocatorMode::caching, {{"large_segment_size_mb", "25"}, {"max_non_split_rounding_mb", "40"}}),
                                "allocator")
                .caching.max_non_split_rounding,
            40 * MiB);
  EXPECT_EQ(parse_alloc_options(config(AllocatorMode::caching), "allocator").caching.max_non_split_rounding, 20 * MiB);
}

TEST(AllocOptions, BackendIsNamedAsTheAllocatorMode) {
  const std::string msg = message_of(config(AllocatorMode::caching, {{"backend", "native"}}));
  // Issue 14: it read "allocator.options.backend: backend choose the backend with ...".
  EXPECT_TRUE(contains(msg, "allocator.options.backend: backend is not an option here: the allocator mode is the backend")) << msg;
}

TEST(AllocOptions, ValidateUsesTheCallersPath) {
  try {
    validate_allocator_config(config(AllocatorMode::caching, {{"max_split_size_mb", "1"}}), "scenario.allocator");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "scenario.allocator.options.max_split_size_mb");
  }
  EXPECT_NO_THROW(validate_allocator_config(config(AllocatorMode::async), "scenario.allocator"));
}

TEST(AllocOptions, TableListsEveryOption) {
  std::vector<std::string_view> names;
  for (const AllocOptionInfo& o : alloc_option_table()) names.push_back(o.name);
  for (const char* want :
       {"max_split_size_mb", "roundup_power2_divisions", "max_non_split_rounding_mb", "garbage_collection_threshold",
        "per_process_memory_fraction", "expandable_segments", "large_segment_size_mb", "release_threshold",
        "pool_granularity", "reuse_follow_event_dependencies", "reuse_allow_opportunistic",
        "reuse_allow_internal_dependencies", "opportunistic_probability", "sim_event_lag"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
}

}  // namespace
}  // namespace vf::sim

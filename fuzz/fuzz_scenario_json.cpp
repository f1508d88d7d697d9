// libFuzzer target: the scenario loader and the finding / repro loader, from text. A document
// that loads must write back (scenario_to_json) to text that loads again and writes back the
// same: the round trip every finding file depends on. InputError is the expected failure;
// anything else escaping is a bug.
#include <cstdint>
#include <string>
#include <string_view>

#include "harness/core/error.h"
#include "harness/scenario.h"

namespace {

// "file:" sources resolve against this directory, which does not exist: relative paths in the
// input never reach the real filesystem.
constexpr std::string_view kOrigin = "/nonexistent/vramfuzz-fuzz/scenario.json";

void round_trip(const vf::Scenario& s, vf::Catalog& catalog) {
  const std::string once = vf::scenario_to_json(s);
  std::string twice;
  try {
    twice = vf::scenario_to_json(vf::parse_scenario_json(once, catalog, kOrigin));
  } catch (const vf::InputError&) {
    __builtin_trap();  // a scenario that loaded wrote JSON that does not load
  }
  if (once != twice) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Built catalog models are immutable and cached by (name, storage): sharing the cache across
  // inputs changes no result, only the time the first use of each model takes.
  static vf::Catalog catalog;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    round_trip(vf::parse_scenario_json(text, catalog, kOrigin), catalog);
  } catch (const vf::InputError&) {
  }
  // The same bytes as the scenario of a finding file, and as a document of its own schema.
  const std::string finding = R"({"schema": "vramfuzz.finding/1", "signature": "oom:forward:upcast:raw", "scenario": )" + std::string(text) + "}";
  try {
    round_trip(vf::parse_case_json(finding, catalog, kOrigin), catalog);
  } catch (const vf::InputError&) {
  }
  try {
    round_trip(vf::parse_case_json(text, catalog, kOrigin), catalog);
  } catch (const vf::InputError&) {
  }
  return 0;
}

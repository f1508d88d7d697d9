// libFuzzer target: the ComfyUI log reader and the reconstruction behind `vramfuzz from-log`. Any
// bytes either read as a log or fail with InputError; a reconstructed scenario writes JSON that
// loads back and writes the same (the file from-log hands the user must replay). Anything else
// escaping is a bug.
#include <cstdint>
#include <string>
#include <string_view>

#include "harness/comfy_log.h"
#include "harness/core/error.h"
#include "harness/from_log.h"
#include "harness/scenario.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static vf::Catalog catalog;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  vf::ComfyLog log;
  try {
    log = vf::read_comfy_log(text, "fuzz.log");
  } catch (const vf::InputError&) {
    return 0;
  }
  vf::FromLogOptions o;
  o.file = "fuzz.log";
  vf::Reconstruction r;
  try {
    r = vf::reconstruct_from_log(log, o, catalog);
  } catch (const vf::InputError&) {
    return 0;
  }
  const std::string once = vf::scenario_to_json(r.scenario);
  std::string twice;
  try {
    twice = vf::scenario_to_json(vf::parse_scenario_json(once, catalog, "/nonexistent/vramfuzz-fuzz/s.json"));
  } catch (const vf::InputError&) {
    __builtin_trap();  // from-log wrote a scenario that does not load
  }
  if (once != twice) __builtin_trap();
  (void)vf::format_facts(r);
  return 0;
}

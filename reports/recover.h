// A campaign killed before it wrote summary.json (SIGKILL, a power loss, the OOM killer) has
// still written every finding to disk the moment it was made (docs/formats.md): `report OUT`
// rebuilds summary.json and every report from OUT/run.json (written before the first case) and
// the finding files and repros under OUT/findings, and says what it could not recover.
#pragma once

#include <string>
#include <vector>

#include "reports/summary.h"

namespace vf::report {

inline constexpr std::string_view kRunSchema = "vramfuzz.run/1";

// OUT/run.json (`vramfuzz.run/1`): the campaign's command, config, --keep and whether it shrinks,
// when and where it started. Written by `fuzz --out` before the first case.
std::string run_marker_json(const CampaignConfig& cfg, const RunInfo& info);

struct Recovered {
  Json summary;                            // a vramfuzz.summary/1 with `recovered`
  std::vector<std::string> not_recovered;  // what it could not rebuild, one line each
};

// Rebuilds the summary of the campaign in `dir` (InputError when `dir` holds no run.json of a
// campaign, or it is damaged). Finding files that are damaged or half written are left out and
// listed; a repro's case is re-run on `sim` for its timeline when the campaign ran on sim.
Recovered recover_campaign(const std::string& dir);

}  // namespace vf::report

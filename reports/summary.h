// summary.json (`vramfuzz.summary/1`): everything a run found, in one document every report is
// rendered from. `fuzz` and `calibrate` build it from their results, `merge` combines several,
// and `report` re-renders HTML, JUnit and Markdown from it alone, so it carries what they need:
// the repro cases' traces, the per policy x allocator matrix, the corpus replay, and the raw
// calibration samples (merges recompute percentiles from them). Fields: docs/formats.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/calibrate.h"
#include "harness/campaign.h"
#include "harness/shrink.h"

namespace vf::report {

using Json = nlohmann::ordered_json;

inline constexpr std::string_view kSummarySchema = "vramfuzz.summary/1";
inline constexpr std::string_view kCalibrateSchema = "vramfuzz.calibrate/1";

// Where and when a run happened: recorded in every summary (and JUnit's timestamp/hostname).
struct RunInfo {
  std::string command;       // "fuzz", "calibrate", "merge"
  std::string command_line;  // the command that reproduces it
  std::string backend;       // "sim" / "cuda"
  std::string environment;   // the device description
  std::string hostname;
  std::string timestamp;     // ISO 8601, UTC, seconds
  std::string out_dir;       // the --out directory, as given (paths inside the summary start with it)
};
RunInfo run_info(std::string command, std::string command_line, std::string backend, std::string out_dir);
std::string utc_timestamp();  // "2026-01-31T02:00:00"
std::string host_name();

// The repro case of a finding as the reports draw it: verdict, stages with their predicted +
// reserve line, the plan's resident/offloaded split per load, the trace (every op, downsampled
// past `max_rows` keeping each bucket's highest reserved row and the judged/OOM ops) and the
// rows around the peak with what each op did.
Json case_view(const Scenario& s, const CaseResult& r, const std::string& title, const std::string& replay,
               std::size_t max_rows = 2000);
Json case_view(const ShrinkResult& sr, const std::string& replay);

// The command that replays a finding (its repro, else its finding file), run from `from_dir`: the
// path is written relative to it. summary.json's commands run from its folder, a report's from the
// report's folder, so a tree moved as a whole keeps them working.
std::string replay_command(const std::string& repro, const std::string& file, const std::string& from_dir);

Json summary_from_campaign(const CampaignConfig& cfg, const CampaignResult& r, const RunInfo& info);
// A finding's severity: its worst overshoot as a share of the device it happened on (an OOM's
// or violation's bytes on a 6 GiB card weigh four times those on a 24 GiB one), rounded to 1e-6; a
// `waste` finding (its signature's KIND) weighs a tenth.
double finding_severity(std::int64_t overshoot, Bytes device_total, std::string_view kind);
// A campaign's `config` object (summary.json's, and run.json's: what recovery rebuilds it from).
Json campaign_config(const CampaignConfig& cfg, const std::string& backend);
Json summary_from_calibration(const CalibrationConfig& cfg, const CalibrationResult& r, const RunInfo& info);

// The calibrate section from raw samples (tables recomputed; `verify` and `worst` carried).
Json calibrate_section(const std::vector<CalibSample>& samples, const std::vector<CalibExcluded>& excluded, Bytes margin,
                       const Json& meta, const Json& verify, const Json& worst);
// The samples of a calibrate section read back (for merges).
std::vector<CalibSample> samples_from_json(const Json& section);
std::vector<CalibExcluded> excluded_from_json(const Json& section);

// Merges summaries: findings deduplicated by signature and policy key (counts summed, worst
// overshoot the max, the repro of the earliest case kept, known by the campaign's rule against the
// joined corpus), matrices and counts summed, corpus results joined,
// calibration samples pooled and their tables recomputed; `config` keeps what the inputs agree on
// (`merged_config` in summary.cpp). `dirs[i]` is where docs[i] was read from: paths inside it are
// rewritten to stay valid from the current directory, by way of `info.out_dir` (relocate() then
// works from there). Campaigns and calibrations do not mix, and neither do inputs that ran the
// same cases (the same shard twice): InputError.
Json merge_summaries(const std::vector<Json>& docs, const std::vector<std::string>& dirs, const RunInfo& info);

// Reads DIR/summary.json (InputError naming the file when it is missing or not a summary).
Json load_summary(const std::string& dir);
// Writes JSON with trace and sample rows one per line (diff- and grep-friendly, not 40k lines).
std::string dump_summary(const Json& doc);

// A path recorded in a summary, as seen from the current directory when the summary now lives in
// `summary_dir` (its run wrote it with --out `recorded_out_dir`): the way from the recorded --out
// to the file (under it, or `../` into a shard directory for a merge) is kept.
std::string relocate(const std::string& path, const std::string& recorded_out_dir, const std::string& summary_dir);

// The summary with its paths rewritten for where it lives now (`report OUT` after OUT moved,
// e.g. CI artifacts downloaded elsewhere).
Json relocated(const Json& doc, const std::string& summary_dir);

// Exit code a summary stands for: 1 with new signatures, 3 when only errors, else 0; always 0 for
// a calibration (a measurement).
int summary_exit_code(const Json& doc);

}  // namespace vf::report

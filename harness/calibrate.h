// Calibration: how much reserve does each allocator mode really need, and for which workloads?
// Samples generated scenarios under each allocator mode and measures, per case, how far the
// allocator's reserved peak went past the predictor's peak at the worst checked stage
// (measured - predicted: the oracle's verdict arithmetic without the reserve). Its distribution,
// the smallest reserve under which no sampled case violates P1, the headroom the current reserve
// leaves unused, and the worst case of each mode (shrunk into a repro) are the answer.
// Reading the output: docs/calibrate.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "harness/campaign.h"
#include "harness/generate.h"

namespace vf {

// Where a reserve is needed: the storage -> compute dtype pair of the biggest model, whether the
// plan left modules off the device, and the image size band.
struct WorkloadClass {
  std::string dtypes;      // "fp8_e4m3fn->fp32"
  bool offloaded = false;  // some load of the case was partial
  bool dynamic = false;    // dynamic VRAM placed it at run time ("dynamic" instead of the placement)
  std::string resolution;  // "<=512x512", "<=1024x1024", ">1024x1024" (by pixel count)
  std::string key() const;  // "fp8_e4m3fn->fp32, offloaded, <=1024x1024"
};
WorkloadClass workload_class(const Scenario& s, const Plan& plan);

// Dynamic VRAM predicts no peak and keeps no reserve: what is calibrated is --vram-headroom, the
// extra headroom aimdo adds to every deficit. A case's "delta" is the smallest headroom of this
// ladder under which it has no avoidable OOM (0 when it has none at the default); a case no rung
// holds counts as an OOM whose delta is the top rung (a lower bound). docs/calibrate.md.
inline constexpr Bytes kHeadroomLadder[] = {0,         128 * MiB, 256 * MiB, 512 * MiB, 768 * MiB, 1 * GiB,
                                            1536 * MiB, 2 * GiB,  3 * GiB,   4 * GiB,   6 * GiB,   8 * GiB};
// The policy constant a calibration of `policy` sets: "reserve" (classic) or "vram_headroom" (dynamic).
std::string_view calibrated_knob(const Policy& policy);

// One judged case of the sample.
struct CalibSample {
  std::uint64_t case_index = 0;
  std::uint64_t case_seed = 0;
  AllocatorMode mode = AllocatorMode::raw;
  std::string workload;     // WorkloadClass::key()
  // measured - predicted at the worst checked stage; for an OOM, reserved + request - predicted at
  // the failing op: the peak it would have reached at least, so a lower bound.
  std::int64_t delta = 0;
  bool oom = false;         // delta is a lower bound
  bool pass = false;        // the case passed at its own reserve
  Bytes reserve = 0;        // the reserve the case ran with
  Bytes device_total = 0;
  std::string signature;    // its finding signature at that reserve (empty: it passed)
  std::string policy;       // the policy label
};

// Samples the calibration does not put into the distribution, counted per mode and class.
struct CalibExcluded {
  std::uint64_t case_index = 0;
  std::uint64_t case_seed = 0;
  AllocatorMode mode = AllocatorMode::raw;
  std::string workload;
  bool expected_oom = false;  // the plan itself said it does not fit: says nothing about the reserve
  bool error = false;         // the backend failed
};

// The statistics of a set of samples (nearest-rank percentiles; docs/calibrate.md).
struct CalibStats {
  std::uint64_t cases = 0;          // samples in the distribution (OOMs included, as lower bounds)
  std::uint64_t ooms = 0;           // of those, unpredicted OOMs
  std::uint64_t expected_ooms = 0;  // excluded: the plan did not fit
  std::uint64_t errors = 0;         // excluded: backend faults
  std::uint64_t violations = 0;     // samples over their own reserve (P1 or P2 findings)
  std::int64_t p50 = 0, p90 = 0, p99 = 0, max = 0;  // of delta, bytes
  Bytes need = 0;                   // max(0, max): the smallest reserve no sample violates
  Bytes recommended = 0;            // recommended_reserve(need, margin)
  Bytes reserve = 0;                // the reserve the samples ran with (the median if they differ)
  std::uint64_t passing = 0;        // samples that passed at their reserve
  std::int64_t slack_median = 0;    // median of predicted + reserve - measured over passing samples
  double slack_share = 0;           // median of that headroom / device total, over passing samples
};

// Nearest-rank percentile (q in (0, 1]) of sorted values: the smallest value with at least q of
// the samples at or below it.
std::int64_t nearest_rank(std::span<const std::int64_t> sorted, double q);
// The recommendation: need + margin rounded up to a whole MiB, so the printed figure ("1851MiB")
// is one `--reserve` takes as it is (a fraction of a MiB such as 838.2 MiB is not whole bytes).
// Both are at most a few PiB here (--margin is limited to 1 PiB), far from overflowing.
Bytes recommended_reserve(Bytes need, Bytes margin);

CalibStats calib_stats(std::span<const CalibSample> samples, std::span<const CalibExcluded> excluded, Bytes margin);

// The worst sample of a mode, as a file a person can replay.
struct CalibWorst {
  AllocatorMode mode = AllocatorMode::raw;
  std::uint64_t case_index = 0;
  std::uint64_t case_seed = 0;
  std::int64_t delta = 0;
  bool oom = false;
  std::string signature;   // its finding signature at its reserve (empty: it passed)
  std::string file;        // repro.json (shrunk) or worst-case.json (a pass: nothing to shrink)
  std::size_t modules = 0; // modules left after shrinking
  std::shared_ptr<const ShrinkResult> shrunk;  // for reports
};

// The re-check of a recommendation: the same cases re-run with `--reserve` set to it.
struct CalibVerify {
  AllocatorMode mode = AllocatorMode::raw;
  std::uint32_t round = 0;
  Bytes reserve = 0;
  std::uint64_t cases = 0;
  std::uint64_t violations = 0;   // P1 violations at that reserve (measured peak over predicted + reserve)
  std::uint64_t ooms = 0;         // P2: unpredicted OOMs at that reserve (no measured peak; reported, not chased)
  std::int64_t max_delta = 0;     // the largest measured - predicted at that reserve, OOMs aside
  // false: a stop or the end of --time cut the round short (or kept it from starting, cases 0):
  // its counts cover only part of the sample, so the mode is not verified.
  bool finished = true;
};

struct CalibrationConfig {
  std::uint64_t seed = 1;
  std::uint64_t cases = 0;      // per mode; 0: until the time budget
  double seconds = 0;           // 0: until the case count
  GenConfig gen;                // policy, vram, overrides; `allocator` is set per mode
  std::vector<AllocatorMode> modes{std::begin(kAllAllocatorModes), std::end(kAllAllocatorModes)};
  Bytes margin = 64 * MiB;
  std::string activations = "model";  // `--activations` as given (the summary's config records it)
  std::uint32_t shard_index = 0;
  std::uint32_t shard_count = 1;
  // Re-run the sample with the reserve set to the need, raising it while any case still violates
  // P1 (the reserve moves the plan, so the need at the current reserve is only a first estimate).
  // OOMs at the new reserve are counted but do not raise it: an OOM's overshoot is a lower bound
  // that often grows with the reserve (a fragmentation OOM stays an OOM), so chasing it diverges.
  // With a time budget the rounds stop at its end; a round cut there is recorded unfinished.
  std::uint32_t verify_rounds = 3;
  std::string out_dir;          // empty: no worst-case files
  // The options that shape the cases besides the seed, count and allocator (" --policy P --vram V
  // --backend sim"): case i under mode M is the last case of `vramfuzz fuzz --seed S --cases i+1
  // --allocator M<case_options>`, which finding files and repros record as `found_by`.
  std::string case_options;
  bool shrink = true;
  std::uint64_t shrink_execs = 400;
  double shrink_seconds = 60;
  std::function<bool()> should_stop;
  std::function<void(std::uint64_t cases_done, double elapsed)> on_case;
};

struct CalibrationResult {
  std::vector<CalibSample> samples;
  std::vector<CalibExcluded> excluded;
  std::vector<CalibWorst> worst;     // per mode with samples
  std::vector<CalibVerify> verify;   // per mode and round
  // The first case of each finding signature at the current reserve, written under
  // OUT/calibrate/findings/ as `fuzz` writes findings (replayable with `vramfuzz run`).
  std::map<std::string, std::string> finding_files;
  std::uint64_t cases = 0;           // case seeds drawn (each run under every mode)
  std::string environment;
  double seconds = 0;
  bool stopped = false;
  // The need a mode's verification settled on (0 when not verified, or when its last round did not
  // finish): at least its sample's need.
  Bytes verified_need(AllocatorMode m) const;
};

// The scenario of case `index` under `mode` (the same draws under every mode).
Scenario calibration_case(const CalibrationConfig& cfg, Catalog& catalog, std::uint64_t index, AllocatorMode mode);

// measured - predicted at the case's worst checked stage (the verdict's overshoot + reserve; a
// waste verdict, whose overshoot is unused buffer, from its stages).
std::int64_t p1_delta(const CaseResult& r);

// Turns a judged case into a sample (or an exclusion). Returns false when excluded.
bool calib_sample(const Scenario& s, const CaseResult& r, std::uint64_t index, std::uint64_t seed, CalibSample* sample,
                  CalibExcluded* excluded);

CalibrationResult run_calibration(const CalibrationConfig& cfg, Catalog& catalog, Backend& backend);

}  // namespace vf

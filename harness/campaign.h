// One case through the whole pipeline, and a campaign of many: generate -> predict -> lower ->
// execute -> judge, each finding written to disk (atomically) before the next case runs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/exec.h"
#include "harness/generate.h"
#include "harness/lower.h"
#include "harness/oracle.h"
#include "harness/predict.h"
#include "harness/scenario.h"

namespace vf {

struct CaseResult {
  Plan plan;
  Program program;
  ExecResult exec;
  Verdict verdict;
};

struct ShrinkResult;  // harness/shrink.h
struct CampaignResult;

class SentAhead;  // harness/predictors/external.h

// Runs one scenario on `backend`. Never throws for a case that could be built: backend faults
// become an `error` verdict. `ahead`: s's request, sent to its external predictor before (the
// campaign's pipelining); its reply is the plan.
CaseResult run_case(const Scenario& s, Backend& backend, bool record_trace, SentAhead* ahead = nullptr);
// run_case with the plan already made (`diff` compares the plans before it runs them): lowered,
// executed and judged exactly as run_case does with the same plan.
CaseResult run_planned(const Scenario& s, Plan plan, Backend& backend, bool record_trace);

// A workload for people: "1024x768", "512x512 batch 4", "832x480 33 frames".
std::string workload_label(const Workload& w);
// The workload one step smaller in one dimension (class G's pair: sides x 3/4 to a multiple of
// 64, batch - 1, or frames - 4), the dimension drawn from `seed`; none when nothing can shrink.
std::optional<Workload> knee_smaller(const Workload& w, std::uint64_t seed);

// Whether a finding needs activations larger than the predictor budgets for them (docs/
// activations.md, "Activation-dependent findings"). Where some forward of `plan` held more than
// its budget (activation_allowance), the case is re-judged with every forward capped at its
// budget (the same activation source with "cap": "budget"); a finding that then passes, or
// becomes an expected OOM, is activation-dependent: it rests on how vramfuzz sized the
// activations, not on the weights, transients and the allocator alone. v.at_budget records
// the outcome ("within budget" where no forward was over it: no re-run). A verdict that is no
// finding, and a case sized at the budget already (source estimate), are left unchecked.
void check_activation_dependence(const Scenario& s, const Plan& plan, Backend& backend, Verdict& v);

struct CampaignConfig {
  std::uint64_t seed = 1;
  std::uint64_t cases = 0;   // 0: until the time budget
  double seconds = 0;        // 0: until the case count
  GenConfig gen;
  std::string out_dir;       // empty: nothing written
  std::uint32_t keep_per_signature = 3;  // finding files kept per signature (all are counted)
  std::string command_line;  // recorded in the summary
  // The options besides --seed and --cases that decide which cases are generated and how they are
  // judged, as a command-line fragment (" --policy comfy:oct2025 --allocator raw --backend sim"):
  // each finding records `vramfuzz fuzz --seed S --cases I+1<case_options>`, the command whose
  // last case it is.
  std::string case_options;
  bool shrink = true;        // shrink the first finding of each new signature into a repro
  std::uint64_t shrink_execs = 400;
  double shrink_seconds = 120;
  std::uint32_t confirm_runs = 1;  // re-runs of each repro for its reliability figure
  // `--min-overshoot`: a violation signature whose worst overshoot stays below this is within the
  // allocator's own rounding noise (one 2 MiB device page by default): written, shrunk and listed,
  // labelled noise, and not counted as new. 0 counts every violation. OOMs are never noise.
  Bytes min_overshoot = 2 * MiB;
  // `--knee-every K`: class G's paired check (property P4) runs on every case whose index is a
  // multiple of K and that passes: the same case a step smaller (knee_smaller) must not fail.
  // 0: no pairs.
  std::uint32_t knee_every = 4;
  // `--activations` as given ("model" when not): what sized the activations, which the summary's
  // config records (findings made under different sources are different runs' findings).
  std::string activations = "model";
  std::string corpus_dir;    // repros replayed before searching; their signatures are known
  // `--shard I/N`: this run takes the cases whose index i has i mod N == I. Case seeds do not
  // change, so the shards of one campaign are disjoint and together are the unsharded campaign.
  std::uint32_t shard_index = 0;
  std::uint32_t shard_count = 1;
  // Asked before each case and inside shrinking: true stops the campaign cleanly (SIGINT/SIGTERM).
  std::function<bool()> should_stop;
  // Called after each case is judged and recorded (progress lines, report collectors).
  std::function<void(const CampaignResult& so_far, double elapsed)> on_case;
};

// What identifies a finding across a campaign, its shards' merge and the regression corpus: the
// signature and the predictor it was found under (Policy::key: the preset plus its overrides).
// The same signature under another policy is another finding: a corpus repro made under
// comfy:oct2025 says nothing about whether comfy:dec2025 has the bug.
struct FindingKey {
  std::string signature;
  std::string policy;  // Policy::key()
  auto operator<=>(const FindingKey&) const = default;
};

struct SignatureCount {
  std::uint64_t count = 0;
  std::int64_t worst_overshoot = 0;
  Bytes worst_device = 0;    // the device total of the worst case (severity: overshoot / device)
  std::string cause;         // the first case's one-line cause (Verdict::cause)
  bool activation_dependent = false;  // the first written case's (Verdict::activation_dependent)
  bool noise = false;        // worst overshoot below CampaignConfig::min_overshoot: a violation, or a knee of violations
  bool knee_of_oom = false;  // knee signatures: some finding's smaller half OOMed (such a knee is never noise)
  std::string first_file;    // the first finding written for it
  std::uint64_t first_case_seed = 0;
  std::uint64_t first_case_index = 0;
  bool known = false;        // in the regression corpus under the same policy key: not new
  std::string repro_file;    // the shrunk repro, when shrinking ran
  std::size_t repro_modules = 0;
  std::size_t repro_repeats = 0;  // of them, repeats of the module before (CaseSize::repeats)
  std::uint64_t shrink_execs = 0;
  bool flaky = false;
  std::shared_ptr<const ShrinkResult> shrunk;  // the repro case with its trace (for reports)
};

// What one policy x allocator mode saw: JUnit reports a testcase per property for each.
struct CellCount {
  std::uint64_t cases = 0;
  std::uint64_t expected_ooms = 0;
  std::uint64_t errors = 0;
  std::uint64_t knee_pairs = 0;  // passing cases of the cell run again a step smaller (P4)
  struct Finding {
    std::uint64_t count = 0;
    std::int64_t worst_overshoot = 0;
    std::uint64_t first_case_seed = 0;
    std::uint64_t first_case_index = 0;  // merges keep the earliest case of the cell by it
  };
  std::map<FindingKey, Finding> findings;  // by signature and policy key
};

// A repro of the regression corpus, replayed before the search.
struct CorpusEntry {
  std::string file;
  std::string signature;  // as recorded
  std::string policy;     // the repro's Policy::key(): it is known under this policy only
  bool still_fails = false;
  bool undetermined = false;  // the replay was an error (e.g. its external predictor failed): neither fails nor is fixed
  std::string verdict;    // what it gives now
};

struct CampaignResult {
  std::uint64_t cases = 0;
  std::uint64_t findings = 0;
  std::uint64_t errors = 0;
  std::uint64_t expected_ooms = 0;  // OOMs the plan itself predicted (not findings)
  std::uint64_t knee_pairs = 0;     // passing cases run again a step smaller (P4, class G)
  double seconds = 0;
  std::map<FindingKey, SignatureCount> signatures;  // one per signature x policy key
  std::vector<CorpusEntry> corpus;
  std::map<std::pair<std::string, std::string>, CellCount> cells;  // (policy label, allocator mode)
  std::string environment;  // the backend's device description ("sim", or the GPU)
  bool stopped = false;     // should_stop ended it before its budget
  std::uint64_t warnings = 0;  // ExecResult warnings (cuda: device memory that did not come back ...)
  std::string fatal_error;     // the backend can run no more cases (a sticky CUDA error): it ended here
  std::size_t new_signatures() const {
    std::size_t n = 0;
    for (const auto& [sig, c] : signatures) n += c.known || c.noise ? 0 : 1;
    return n;
  }
};

// Replays every repro / finding under `dir` (recursively) once on `backend`.
std::vector<CorpusEntry> replay_corpus(const std::string& dir, Catalog& catalog, Backend& backend);

// The seed of case `index` of a campaign seeded `seed` (splitmix64 of the pair): any case can be
// regenerated alone with `vramfuzz fuzz --seed S --case I` or from its recorded seed.
std::uint64_t case_seed(std::uint64_t campaign_seed, std::uint64_t index);

CampaignResult run_campaign(const CampaignConfig& cfg, Catalog& catalog, Backend& backend);

// The JSON a case result is written as (`vramfuzz.finding/1` for a finding, else
// `vramfuzz.result/1`): the scenario, the plan summary, the verdict, peaks, the trace around the
// peak, and the replay command.
// `found_by`: the command that generates the case (empty: not known).
std::string case_json(const Scenario& s, const CaseResult& r, std::uint64_t campaign_seed, std::uint64_t case_index,
                      std::uint64_t seed, const std::string& path, const std::vector<std::uint64_t>& choices = {},
                      const std::string& found_by = "");

// Whether a finding is within the allocator's rounding noise: a violation whose worst overshoot
// is below `min_overshoot` (CampaignConfig::min_overshoot), or a knee whose smaller halves were
// all such violations (`knee_of_oom` false). OOMs never are, nor knees whose smaller half OOMed.
bool is_noise(std::string_view signature, std::int64_t worst_overshoot, Bytes min_overshoot, bool knee_of_oom = true);

// Signature as a directory name ("violation:forward:upcast:raw" -> "violation-forward-upcast-raw").
std::string signature_dir(std::string_view signature);
// A policy key as a directory name ("comfy:dec2025 dequant_term=false" -> "comfy-dec2025_dequant_term=false").
std::string policy_dir(std::string_view policy_key);
// Where a campaign writes the findings of one key: OUT/findings/<policy>/<signature>.
std::string finding_dir(const std::string& out_dir, const FindingKey& key);

std::string tool_version();  // "0.1.0 (git abcdef123456)"

}  // namespace vf

// vramfuzz merge OUT1 OUT2 ... --out MERGED: one result from shards (--shard, --devices, CI
// matrix jobs): findings deduplicated by signature and policy key, calibration percentiles
// recomputed; inputs that ran the same cases are refused.
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/cli/commands.h"
#include "harness/cli/out_dir.h"
#include "harness/core/error.h"
#include "reports/render.h"

namespace vf::cli {
namespace {

struct MergeFlags {
  std::vector<std::string> dirs;
  std::string out;
  bool clean = false;
};

// `merge a b --out a` would replace shard a's summary and reports with the merge's, and the
// merge could not be re-run from a: an output that is one of the inputs is refused.
void refuse_output_among_inputs(const MergeFlags& f) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(fs::absolute(f.out), ec);
  for (const std::string& d : f.dirs) {
    std::error_code e2;
    const fs::path in = fs::weakly_canonical(fs::absolute(d), e2);
    if (!ec && !e2 && in == out) {
      throw InputError("--out", fmt::format("{} is one of the inputs ({}): the merge would overwrite that shard's summary; give the merge "
                                            "a directory of its own",
                                            f.out, d));
    }
  }
}

int do_merge(const MergeFlags& f) {
  refuse_output_among_inputs(f);
  std::vector<report::Json> docs;
  for (const std::string& d : f.dirs) docs.push_back(report::load_summary(d));
  // The merged summary and reports go into OUT: writable, this merge's alone, and no run's
  // findings in it that the merged summary would not list (out_dir.h).
  const OutDir out_dir(f.out, OutDir::Options{"--out", f.clean, false});
  const std::string cmd = fmt::format("vramfuzz merge {} --out {}", fmt::join(f.dirs, " "), f.out);
  const std::string backend = docs.front().contains("environment") ? docs.front()["environment"].value("backend", "") : "";
  const report::Json merged = report::merge_summaries(docs, f.dirs, report::run_info("merge", cmd, backend, f.out));
  std::fputs(report::terminal_findings(merged).c_str(), stdout);
  std::fputs(report::terminal_calibrate(merged).c_str(), stdout);
  const report::ReportFiles files = report::write_reports(f.out, merged);
  std::fputs(fmt::format("summary: {}\njunit: {}\nmarkdown: {}\nreport: {}\n", files.summary, files.junit, files.markdown, files.html).c_str(),
             stdout);
  return report::summary_exit_code(merged);
}

}  // namespace

void add_merge(CLI::App& app, Action& action) {
  auto f = std::make_shared<MergeFlags>();
  CLI::App* cmd = app.add_subcommand("merge", "merge the outputs of shards into one (findings by signature and policy, calibration re-computed)");
  cmd->add_option("OUT", f->dirs, "directories with summary.json (fuzz or calibrate outputs)")->required()->expected(1, -1);
  cmd->add_option("--out", f->out, "where the merged summary.json and reports go (not one of the inputs)")->required();
  cmd->add_flag("--clean", f->clean, "remove a campaign's findings/, calibrate/ and shard-N/ from --out first (else refused)");
  cmd->callback([f, &action] { action = [f] { return do_merge(*f); }; });
}

}  // namespace vf::cli

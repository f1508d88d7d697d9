// summary.md: for a CI job summary page ($GITHUB_STEP_SUMMARY). The verdict comes first, in one
// line, then the findings, what the regression corpus says, and the calibration tables.
#include <filesystem>

#include <fmt/format.h>

#include "reports/json_util.h"
#include "reports/render.h"
#include "reports/tables.h"

namespace vf::report {

std::string link_from(const std::string& path, const std::string& report_dir) {
  namespace fs = std::filesystem;
  if (path.empty()) return path;
  const fs::path target = fs::absolute(path).lexically_normal();
  const fs::path base = fs::absolute(report_dir.empty() ? "." : report_dir).lexically_normal();
  const fs::path rel = target.lexically_relative(base);
  return rel.empty() ? target.string() : rel.string();
}

std::string verdict_line(const Json& doc) {
  const Json c = doc.value("counts", Json::object());
  if (doc.contains("calibrate") && !get_arr(doc["calibrate"], "modes").empty()) {
    // A calibration's answer is the reserve (dynamic VRAM: the --vram-headroom) each mode needs.
    const bool headroom = doc["calibrate"].value("knob", std::string("reserve")) == "vram_headroom";
    std::string out = headroom ? "vram headroom needed:" : "reserve needed:";
    bool first = true;
    for (const Json& m : get_arr(doc["calibrate"], "modes")) {
      out += fmt::format("{} {} {}{}", first ? "" : ",", get_str(m, "allocator"),
                         mib1(get_u64(m, "recommended") - std::min(get_u64(m, "recommended"), get_u64(doc["calibrate"], "margin"))),
                         get_str(m, "verification") == "not verified" ? " (not verified)" : "");
      first = false;
    }
    return out + fmt::format(" (+{} margin recommended)", mib1(get_u64(doc["calibrate"], "margin")));
  }
  const std::uint64_t fresh = get_u64(c, "new_signatures"), sigs = get_u64(c, "signatures");
  if (fresh > 0) return fmt::format("{} new signature{}", fresh, fresh == 1 ? "" : "s");
  if (sigs > 0) return fmt::format("all {} signature{} known", sigs, sigs == 1 ? "" : "s");
  if (get_u64(c, "errors") > 0) return fmt::format("nothing found, but {} case(s) ended in an error (backend or predictor)", get_u64(c, "errors"));
  return "nothing found";
}

namespace {

std::string context_line(const Json& doc) {
  const Json c = doc.value("counts", Json::object());
  const Json cfg = doc.value("config", Json::object());
  const Json env = doc.value("environment", Json::object());
  std::string seeds;
  for (const Json& s : get_arr(doc, "seeds")) seeds += (seeds.empty() ? "" : ",") + std::to_string(s.get<std::uint64_t>());
  return fmt::format("{} findings in {} signature{} over {} cases ({} expected OOMs, {} errors) in {:.1f} s; policy {}, "
                     "allocator {}, {} ({}), seed {}{}{}",
                     get_u64(c, "findings"), get_u64(c, "signatures"), get_u64(c, "signatures") == 1 ? "" : "s",
                     get_u64(c, "cases"), get_u64(c, "expected_ooms"), get_u64(c, "errors"), get_num(c, "seconds"),
                     get_str(cfg, "policy"), get_str(cfg, "allocator"), get_str(env, "backend"), get_str(env, "device"), seeds,
                     doc.contains("shards") ? fmt::format(", {} shards merged", doc["shards"].size()) : "",
                     doc.contains("run") && get_bool(doc["run"], "interrupted") ? "; **interrupted** (SIGINT/SIGTERM)" : "");
}

}  // namespace

std::string markdown_summary(const Json& doc, const std::string& report_dir) {
  const LinkFn link = [&](const std::string& p) { return link_from(p, report_dir); };
  const std::string command = doc.contains("run") ? get_str(doc["run"], "command") : "fuzz";
  std::string md = fmt::format("## vramfuzz {}: {}\n\n", command, verdict_line(doc));
  md += context_line(doc) + ".\n\n";
  md += fmt::format("`{}`\n\n", get_str(doc, "command"));
  if (doc.contains("recovered")) {
    // report rebuilt it from the finding files of a run that was killed (reports/recover.h).
    md += fmt::format("**Recovered** from {} after the run was stopped before writing its summary. Not recovered:\n\n",
                      md_escape(get_str(doc["recovered"], "from")));
    for (const Json& n : get_arr(doc["recovered"], "not_recovered")) md += "- " + md_escape(n.get<std::string>()) + "\n";
    md += "\n";
  }
  const Table findings = findings_table(doc, link);
  if (!findings.rows.empty()) {
    md += "### Findings\n\n";
    if (doc.contains("corpus")) {
      md += "A finding is known when the regression corpus has a repro of its signature under the same policy (the preset and "
            "its overrides); under another policy it is new.\n\n";
    }
    md += to_markdown(findings) + "\n";
    // Commands, like the links, from this file's folder: they hold wherever the tree is moved.
    for (const Json* fp : findings_by_severity(doc)) {  // the most severe one's
      const Json& f = *fp;
      const std::string replay = replay_command(get_str(f, "repro"), get_str(f, "file"), report_dir);
      if (replay.empty()) continue;
      md += fmt::format("Replay a finding from the folder of this file, e.g. `{}` (each repro.md says the same from its own "
                        "folder).\n\n",
                        replay);
      break;
    }
  }
  if (doc.contains("corpus")) {
    const Json& c = doc["corpus"];
    md += fmt::format("### Regression corpus\n\n{} repros replayed from `{}`: {} still fail, {} no longer reproduce.\n\n",
                      get_u64(c, "replayed"), get_str(c, "dir"), get_u64(c, "still_fail"), get_u64(c, "no_longer_reproduce"));
    const Table gone = corpus_table(doc);
    if (!gone.rows.empty()) md += to_markdown(gone) + "\n";
    const Table unknown = corpus_table(doc, true);
    if (!unknown.rows.empty()) {
      md += fmt::format("{} undetermined (the replay was an error, so neither fixed nor failing):\n\n", unknown.rows.size()) +
            to_markdown(unknown) + "\n";
    }
  }
  if (doc.contains("calibrate")) {
    const Json& cal = doc["calibrate"];
    md += fmt::format("### Calibration ({}, margin {})\n\n", get_str(cal, "policy"), mib1(get_u64(cal, "margin")));
    md += "measured - predicted at each case's worst checked stage; OOMs count as lower bounds. "
          "`need`: the smallest reserve no sampled case violates; `recommended`: the need the re-check settled on plus "
          "the margin.\n\n";
    md += to_markdown(calibrate_mode_table(doc)) + "\n";
    const Table classes = calibrate_class_table(doc, true);
    md += fmt::format("<details><summary>Where the reserve is needed: {} workload class(es) with an overshoot (all classes: "
                      "report.html, summary.json)</summary>\n\n",
                      classes.rows.size()) +
          to_markdown(classes) + "\n</details>\n\n";
  }
  return md;
}

}  // namespace vf::report

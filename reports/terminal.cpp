// What `fuzz`, `calibrate`, `merge` and `report` print at the end.
#include <map>

#include <fmt/format.h>

#include "reports/json_util.h"
#include "reports/render.h"
#include "reports/tables.h"

namespace vf::report {

std::string terminal_findings(const Json& doc) {
  const Json c = doc.value("counts", Json::object());
  std::string out = fmt::format("verdict: {}\n", verdict_line(doc));
  out += fmt::format("cases: {}, findings: {} in {} signature(s), new: {}; expected OOMs (plan did not fit): {}; errors: {}\n",
                     get_u64(c, "cases"), get_u64(c, "findings"), get_u64(c, "signatures"), get_u64(c, "new_signatures"),
                     get_u64(c, "expected_ooms"), get_u64(c, "errors"));
  if (doc.contains("corpus")) {
    const Json& k = doc["corpus"];
    out += fmt::format("regression corpus: {} repros replayed, {} still fail, {} no longer reproduce\n", get_u64(k, "replayed"),
                       get_u64(k, "still_fail"), get_u64(k, "no_longer_reproduce"));
    for (const auto& row : corpus_table(doc).rows) {
      out += fmt::format("  no longer reproduces: {} ({} under {} -> {})\n", row[0], row[1], row[2], row[3]);
    }
    for (const auto& row : corpus_table(doc, true).rows) {
      out += fmt::format("  undetermined: {} ({} under {} -> {})\n", row[0], row[1], row[2], row[3]);
    }
  }
  Table t = findings_table(doc, [](const std::string& p) { return p; });
  // A terminal line stays readable: the cause cut at 72 characters (summary.md and the HTML
  // report have it whole).
  for (auto& row : t.rows) {
    if (row.size() > 1 && row[1].size() > 72) {
      std::size_t cut = 69;
      while (cut > 0 && (static_cast<unsigned char>(row[1][cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
      row[1] = row[1].substr(0, cut) + "...";
    }
  }
  if (!t.rows.empty()) out += to_text(t);
  return out;
}

std::string terminal_calibrate(const Json& doc) {
  if (!doc.contains("calibrate")) return "";
  const Json& cal = doc["calibrate"];
  const bool headroom = cal.value("knob", std::string("reserve")) == "vram_headroom";
  std::string out =
      headroom ? fmt::format("calibration: {}, {} case seeds, margin {} (dynamic VRAM: per case, the smallest --vram-headroom "
                             "under which it has no avoidable OOM; cases no headroom holds as lower bounds; the reserve "
                             "column is the headroom the cases ran with)\n",
                             get_str(cal, "policy"), get_u64(cal, "cases_drawn"), mib1(get_u64(cal, "margin")))
               : fmt::format("calibration: {}, {} case seeds, margin {} (measured - predicted at the worst checked stage; "
                             "OOMs as lower bounds)\n",
                             get_str(cal, "policy"), get_u64(cal, "cases_drawn"), mib1(get_u64(cal, "margin")));
  out += to_text(calibrate_mode_table(doc));
  // Where the reserve is needed: per mode, the classes that need the most (all of them are in
  // report.html and summary.json).
  constexpr std::size_t kPerMode = 6;
  const Table all = calibrate_class_table(doc, true);
  Table top = all;
  top.rows.clear();
  std::map<std::string, std::size_t> shown;
  for (const auto& row : all.rows) {
    if (shown[row[0]]++ < kPerMode) top.rows.push_back(row);
  }
  if (!top.rows.empty()) {
    out += fmt::format("\nwhere the reserve is needed (top {} workload classes per mode of {} with an overshoot or an OOM; all in "
                       "report.html):\n",
                       kPerMode, all.rows.size()) +
           to_text(top) + "\n";
  }
  for (const Json& m : get_arr(cal, "modes")) {
    if (!m.contains("worst")) continue;
    const Json& w = m["worst"];
    out += fmt::format("worst {}: case {} ({}{}): {}\n", get_str(m, "allocator"), get_u64(w, "case_index"),
                       signed_mib1(get_i64(w, "delta")), get_bool(w, "oom") ? ", an OOM: at least" : "",
                       get_str(w, "file").empty() ? "(no --out)" : get_str(w, "file"));
  }
  return out;
}

}  // namespace vf::report

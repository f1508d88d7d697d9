// The report writers. Each renders from a summary.json document alone (reports/summary.h), so
// `vramfuzz report OUT` re-renders exactly what `fuzz --out OUT` wrote.
//   junit.xml   one testcase per property x allocator mode x policy (reports/schema/junit.xsd)
//   summary.md  the verdict line, the findings table, the corpus and calibration tables (CI job summary)
//   report.html self-contained: inline CSS and SVG, no network; timelines of every repro case
//   terminal    the tables `fuzz`, `calibrate`, `merge` and `report` print
#pragma once

#include <string>

#include "reports/summary.h"

namespace vf::report {

// Paths in the summary are relative to the current directory; links in a report are made
// relative to `report_dir`, where the report file lives.
std::string link_from(const std::string& path, const std::string& report_dir);

// Replay commands in a report run from the folder the report is in (`report_dir`), and say so.
std::string junit_xml(const Json& summary, const std::string& report_dir);
std::string markdown_summary(const Json& summary, const std::string& report_dir);
std::string html_report(const Json& summary, const std::string& report_dir);
// diff.html from a diff.json document (vramfuzz.diff/1, harness/diff.h): the counts, the groups
// by size with what differs, and per group its fields as A / B bars, what they rest on and the
// commands that plan its minimal case under both. It is written into the diff's own folder, which
// every file the document names is relative to.
std::string diff_html(const Json& diff);
// The stylesheet report.html and diff.html share.
std::string_view report_css();

// The one-line verdict: "2 new signatures", "all 3 signatures known", "nothing found".
std::string verdict_line(const Json& summary);
std::string terminal_findings(const Json& summary);   // counts, corpus, findings table
std::string terminal_calibrate(const Json& summary);  // per-mode table (empty without calibration)

struct ReportFiles {
  std::string summary, html, junit, markdown;
};
// Writes OUT/summary.json, OUT/report.html, OUT/junit.xml, OUT/summary.md (atomically).
ReportFiles write_reports(const std::string& out_dir, const Json& summary);

// Escaping for the writers.
std::string xml_escape(std::string_view text);  // also for HTML text and attributes
std::string md_escape(std::string_view text);   // table cells: | and newlines

}  // namespace vf::report

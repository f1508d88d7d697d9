#include <filesystem>

#include "harness/core/json_in.h"
#include "reports/render.h"

namespace vf::report {

ReportFiles write_reports(const std::string& out_dir, const Json& summary) {
  namespace fs = std::filesystem;
  ReportFiles f;
  f.summary = (fs::path(out_dir) / "summary.json").string();
  f.html = (fs::path(out_dir) / "report.html").string();
  f.junit = (fs::path(out_dir) / "junit.xml").string();
  f.markdown = (fs::path(out_dir) / "summary.md").string();
  write_file_atomic(f.summary, dump_summary(summary));
  write_file_atomic(f.junit, junit_xml(summary, out_dir));
  write_file_atomic(f.markdown, markdown_summary(summary, out_dir));
  write_file_atomic(f.html, html_report(summary, out_dir));
  return f;
}

}  // namespace vf::report

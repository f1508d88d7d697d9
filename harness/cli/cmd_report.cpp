// vramfuzz report OUT: re-renders the reports from OUT/summary.json alone.
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/cli/commands.h"
#include "harness/cli/out_dir.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "reports/recover.h"
#include "reports/render.h"

namespace vf::cli {
namespace {

struct ReportFlags {
  std::string dir;
  std::string html, junit, markdown;
};

std::string dir_of(const std::string& file) {
  const std::filesystem::path p(file);
  return p.has_parent_path() ? p.parent_path().string() : ".";
}

// OUT has no summary.json: the campaign was killed before writing it (SIGKILL, power, the OOM
// killer). Its findings are on disk: rebuild the summary from them (reports/recover.h), write it,
// and say what could not be recovered.
report::Json recover(const std::string& dir) {
  if (const long pid = out_dir_writer(dir); pid != 0) {
    throw InputError(dir, fmt::format("has no summary.json yet: a vramfuzz run{} is still writing into it; wait for it to end",
                                      pid > 0 ? fmt::format(" (pid {})", pid) : ""));
  }
  const report::Recovered r = report::recover_campaign(dir);
  const std::string path = (std::filesystem::path(dir) / "summary.json").string();
  write_file_atomic(path, report::dump_summary(r.summary));
  spdlog::warn("{}: no summary.json (the run was stopped before it wrote one): rebuilt from the finding files", dir);
  for (const std::string& n : r.not_recovered) spdlog::warn("not recovered: {}", n);
  std::fputs(fmt::format("summary: {} (recovered; {} thing(s) not recovered, listed in its \"recovered\" field)\n", path,
                         r.not_recovered.size())
                 .c_str(),
             stdout);
  return r.summary;
}

int do_report(const ReportFlags& f) {
  std::error_code ec;
  const bool missing = !std::filesystem::exists(std::filesystem::path(f.dir) / "summary.json", ec);
  const report::Json doc = missing ? recover(f.dir) : report::relocated(report::load_summary(f.dir), f.dir);
  const bool all = f.html.empty() && f.junit.empty() && f.markdown.empty();
  const std::string html = all ? (std::filesystem::path(f.dir) / "report.html").string() : f.html;
  const std::string junit = all ? (std::filesystem::path(f.dir) / "junit.xml").string() : f.junit;
  const std::string markdown = all ? (std::filesystem::path(f.dir) / "summary.md").string() : f.markdown;
  std::fputs(report::terminal_findings(doc).c_str(), stdout);
  std::fputs(report::terminal_calibrate(doc).c_str(), stdout);
  if (!junit.empty()) {
    write_file_atomic(junit, report::junit_xml(doc, dir_of(junit)));
    std::fputs(fmt::format("junit: {}\n", junit).c_str(), stdout);
  }
  if (!markdown.empty()) {
    write_file_atomic(markdown, report::markdown_summary(doc, dir_of(markdown)));
    std::fputs(fmt::format("markdown: {}\n", markdown).c_str(), stdout);
  }
  if (!html.empty()) {
    write_file_atomic(html, report::html_report(doc, dir_of(html)));
    std::fputs(fmt::format("report: {}\n", html).c_str(), stdout);
  }
  return kExitOk;
}

}  // namespace

void add_report(CLI::App& app, Action& action) {
  auto f = std::make_shared<ReportFlags>();
  CLI::App* cmd = app.add_subcommand("report", "re-render report.html, junit.xml and summary.md from OUT/summary.json (rebuilt from the "
                                              "finding files when a killed campaign left none)");
  cmd->add_option("OUT", f->dir, "a directory with summary.json (from fuzz, calibrate or merge)")->required();
  cmd->add_option("--html", f->html, "write only the HTML report, to this file");
  cmd->add_option("--junit", f->junit, "write only JUnit XML, to this file");
  cmd->add_option("--markdown", f->markdown, "write only the Markdown summary, to this file");
  cmd->callback([f, &action] { action = [f] { return do_report(*f); }; });
}

}  // namespace vf::cli

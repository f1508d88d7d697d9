// The tables every report shows, built once from a summary and rendered as terminal text,
// Markdown or HTML. Internal to vf_reports.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "reports/summary.h"

namespace vf::report {

struct Table {
  std::vector<std::string> headers;
  std::vector<bool> right;  // right-aligned columns (numbers)
  std::vector<std::vector<std::string>> rows;
  // Optional per-cell link targets (same shape as rows; empty string: no link).
  std::vector<std::vector<std::string>> links;
};

std::string to_text(const Table& t);
std::string to_markdown(const Table& t);
std::string to_html(const Table& t, const std::string& css_class = "");

// "+374.2 MiB", "1280.0 MiB": one decimal, for tables.
std::string mib1(std::uint64_t bytes);
std::string signed_mib1(std::int64_t bytes);
// A reserve the way `--reserve` takes it: whole MiB, rounded up ("1851MiB").
std::string reserve_arg(std::uint64_t bytes);

using LinkFn = std::function<std::string(const std::string&)>;

// One row per finding (signature x policy key), most severe first (new before known, then the
// worst overshoot as a share of its device): why it failed, where its repro is, how reliably it
// reproduced, and what the regression corpus says about it (corpus_note).
Table findings_table(const Json& doc, const LinkFn& link);
// A finding's repro size in a reader's terms: "1 module", "370 modules, 369 of them repeats".
std::string repro_size(const Json& finding);
// The summary's findings in the order every report lists them.
std::vector<const Json*> findings_by_severity(const Json& doc);
// Why a finding is known or new: "known (origin-oct2025/repro.json)", "new; the corpus has it
// under comfy:oct2025", "new". Corpus files are named from the corpus directory.
std::string corpus_note(const Json& doc, const Json& finding);
// The repros that no longer reproduce; with `undetermined`, those whose replay was an error
// (neither fixed nor still failing).
Table corpus_table(const Json& doc, bool undetermined = false);
Table calibrate_mode_table(const Json& doc);
// `only_needing`: the classes that need a reserve (need > 0 or an OOM), for the short reports.
Table calibrate_class_table(const Json& doc, bool only_needing);

}  // namespace vf::report

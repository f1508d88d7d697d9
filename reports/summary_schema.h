// summary.json's documented shape (docs/formats.md, `vramfuzz.summary/1`), checked whole by
// load_summary before `report` renders it or `merge` combines it: every field's type and value,
// no unknown field, null only where it means something (a case's `oom`, a mode's
// `verified_need`), shards that exist, rows of the documented width, and counts that agree with
// the findings listed. InputError names the field, prefixed by `path` (the file).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "harness/core/json_schema.h"
#include "reports/summary.h"

namespace vf::report {

void check_summary(const nlohmann::json& doc, const std::string& path);
// A campaign's `config` object, as summary.json and run.json hold it.
schema::Check campaign_config_check();

}  // namespace vf::report

// The documents that carry one case (docs/formats.md): `vramfuzz.finding/1` and
// `vramfuzz.result/1` (a judged case), `vramfuzz.repro/1` (a shrunk finding), each embedding a
// `vramfuzz.scenario/1` under "scenario". One validation per schema, shared by every command
// that reads them (run, plan, replay, shrink, the corpus, report's recovery): the schema version,
// every field's type and value, no unknown field, no null, a verdict kind that exists, run counts
// that add up, and a signature that is one. The embedded scenario is the scenario reader's.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace vf {

class JsonIn;  // harness/core/json_in.h

enum class CaseDocKind { scenario, finding, result, repro };

inline constexpr std::string_view kFindingSchema = "vramfuzz.finding/1";
inline constexpr std::string_view kResultSchema = "vramfuzz.result/1";

// What `doc` is by its "schema": a scenario (none, or vramfuzz.scenario/...), a finding, result
// or repro (checked whole, its scenario aside), else an InputError naming `root`.schema (an
// unknown version of a known schema included). Field paths start with `root` ("" for the
// document itself: "verdict.kind").
CaseDocKind check_case_document(const nlohmann::json& doc, const std::string& root = "");
// The same over a parsed document (parse_json_doc); its path is the root.
CaseDocKind check_case_document(const JsonIn& doc);

// `KIND:PHASE:ACTIVITY:ALLOCATOR` with KIND violation or oom (a finding's), or, with
// `allow_error`, `error:BACKEND:ALLOCATOR` (a result whose case could not run): each part a
// lower-case word, ALLOCATOR one of the allocator modes.
bool is_signature(std::string_view text, bool allow_error = false);

}  // namespace vf

// Small JSON helpers shared by the report writers.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace vf::report {

// Pretty-prints like dump(2), except that an array whose elements are short rows (scalars,
// or small arrays/objects) keeps each element on one line: a trace of 2,000 ops stays 2,000
// lines, not 16,000.
std::string dump_rows(const nlohmann::ordered_json& j);

// Typed reads that tolerate a missing or mistyped field (reports render what is there).
std::uint64_t get_u64(const nlohmann::ordered_json& j, const char* key);
std::int64_t get_i64(const nlohmann::ordered_json& j, const char* key);
double get_num(const nlohmann::ordered_json& j, const char* key);
bool get_bool(const nlohmann::ordered_json& j, const char* key);
std::string get_str(const nlohmann::ordered_json& j, const char* key);
const nlohmann::ordered_json& get_arr(const nlohmann::ordered_json& j, const char* key);  // empty array if absent

}  // namespace vf::report

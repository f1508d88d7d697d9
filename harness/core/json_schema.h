// The shape of a document vramfuzz writes and reads back (finding, result, repro, summary), as a
// value: one declaration per schema, checked in one place by every command that reads it. A
// check walks the parsed document with JsonIn, so an error names the field's path
// (`summary.json.findings[0].count: expected a non-negative integer, got string "3"`). Objects
// refuse unknown keys; null is refused except where a field is declared nullable; arrays and
// rows are checked element by element.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "harness/core/json_in.h"

namespace vf::schema {

// Throws InputError (through JsonIn::fail) when the value is not what it should be.
using Check = std::function<void(const JsonIn&)>;

Check u64();                                    // a non-negative integer
Check u64_in(std::uint64_t lo, std::uint64_t hi);
Check i64();                                    // any integer that fits in 64 signed bits
Check number();                                 // finite
Check number_in(double lo, double hi);
Check str();
Check nonempty_str();
Check boolean();
Check one_of(std::vector<std::string> values);  // a string among these
Check array_of(Check element);
// An array of exactly these elements, in order (a trace or sample row).
Check row(std::vector<Check> cells);
// Anything but null, at any depth (a scenario is checked by its own reader; a document vramfuzz
// does not look into still may not hide nulls).
Check any();
// null, or the value `inner` accepts.
Check nullable(Check inner);
// `a` or `b` (the first error is reported when neither accepts the value).
Check either(Check a, Check b);
// A string that satisfies `pred`; `what` completes "expected ...".
Check str_where(std::function<bool(std::string_view)> pred, std::string what);

struct Field {
  std::string key;
  Check check;
  bool required = false;
};
inline Field req(std::string key, Check c) { return {std::move(key), std::move(c), true}; }
inline Field opt(std::string key, Check c) { return {std::move(key), std::move(c), false}; }

// An object with these fields and no others.
Check object(std::vector<Field> fields);
// An object whose keys are free and whose values `value` accepts.
Check map_of(Check value);

}  // namespace vf::schema

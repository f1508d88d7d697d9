#include "harness/core/json_schema.h"

#include <limits>

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf::schema {

namespace {

std::string kind_of(const JsonIn& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "number " + v.excerpt();
  if (v.is_string()) return "string " + v.excerpt();
  return v.excerpt();
}

[[noreturn]] void expected(const JsonIn& j, std::string_view what) {
  j.fail(fmt::format("expected {}, got {}", what, kind_of(j)));
}

void not_null(const JsonIn& j) {
  if (j.is_null()) j.fail("null is not allowed here");
}

}  // namespace

Check u64() {
  return [](const JsonIn& j) {
    not_null(j);
    (void)j.u64();
  };
}

Check u64_in(std::uint64_t lo, std::uint64_t hi) {
  return [lo, hi](const JsonIn& j) {
    not_null(j);
    (void)j.u64_in(lo, hi);
  };
}

Check i64() {
  return [](const JsonIn& j) {
    not_null(j);
    if (j.i64()) return;
    expected(j, "an integer (64-bit signed)");
  };
}

Check number() {
  return [](const JsonIn& j) {
    not_null(j);
    (void)j.number();
  };
}

Check number_in(double lo, double hi) {
  return [lo, hi](const JsonIn& j) {
    not_null(j);
    (void)j.number_in(lo, hi);
  };
}

Check str() {
  return [](const JsonIn& j) {
    not_null(j);
    (void)j.str();
  };
}

Check nonempty_str() {
  return [](const JsonIn& j) {
    not_null(j);
    if (j.str().empty()) j.fail("must not be empty");
  };
}

Check boolean() {
  return [](const JsonIn& j) {
    not_null(j);
    (void)j.boolean();
  };
}

Check one_of(std::vector<std::string> values) {
  return [values = std::move(values)](const JsonIn& j) {
    not_null(j);
    const std::string v = j.str();
    for (const std::string& ok : values) {
      if (v == ok) return;
    }
    std::string list;
    for (const std::string& ok : values) list += (list.empty() ? "" : ", ") + ok;
    j.fail(fmt::format("unknown value {} (one of: {})", j.excerpt(), list));
  };
}

Check array_of(Check element) {
  return [element = std::move(element)](const JsonIn& j) {
    not_null(j);
    const std::size_t n = j.size();  // expect_array's message when it is not one
    for (std::size_t i = 0; i < n; ++i) element(j.at(i));
  };
}

Check row(std::vector<Check> cells) {
  return [cells = std::move(cells)](const JsonIn& j) {
    not_null(j);
    const std::size_t n = j.size();
    if (n != cells.size()) j.fail(fmt::format("expected a row of {} values, got {}", cells.size(), n));
    for (std::size_t i = 0; i < n; ++i) cells[i](j.at(i));
  };
}

Check any() {
  return [](const JsonIn& j) {
    not_null(j);
    if (j.is_array()) {
      for (std::size_t i = 0; i < j.size(); ++i) any()(j.at(i));
    } else if (j.is_object()) {
      for (std::size_t i = 0; i < j.member_count(); ++i) any()(j.member(i));
    }
  };
}

Check nullable(Check inner) {
  return [inner = std::move(inner)](const JsonIn& j) {
    if (!j.is_null()) inner(j);
  };
}

Check either(Check a, Check b) {
  return [a = std::move(a), b = std::move(b)](const JsonIn& j) {
    try {
      a(j);
    } catch (const InputError&) {
      try {
        b(j);
      } catch (const InputError&) {
        a(j);  // report the first form's error
      }
    }
  };
}

Check str_where(std::function<bool(std::string_view)> pred, std::string what) {
  return [pred = std::move(pred), what = std::move(what)](const JsonIn& j) {
    not_null(j);
    if (!j.is_string() || !pred(j.str_view())) expected(j, what);
  };
}

Check object(std::vector<Field> fields) {
  return [fields = std::move(fields)](const JsonIn& j) {
    not_null(j);
    if (!j.is_object()) expected(j, "an object");
    for (std::size_t i = 0; i < j.member_count(); ++i) {
      bool known = false;
      for (const Field& f : fields) known = known || f.key == j.key(i);
      if (known) continue;
      std::string list;
      for (const Field& f : fields) list += (list.empty() ? "" : ", ") + f.key;
      j.member(i).fail(fmt::format("unknown field (expected one of: {})", list));
    }
    for (const Field& f : fields) {
      if (!j.has(f.key)) {
        if (f.required) (void)j.at(f.key);  // "required field is missing", named
        continue;
      }
      f.check(j.at(f.key));
    }
  };
}

Check map_of(Check value) {
  return [value = std::move(value)](const JsonIn& j) {
    not_null(j);
    if (!j.is_object()) expected(j, "an object");
    for (std::size_t i = 0; i < j.member_count(); ++i) value(j.member(i));
  };
}

}  // namespace vf::schema

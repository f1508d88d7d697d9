#include "reports/json_util.h"

namespace vf::report {
namespace {

using Json = nlohmann::ordered_json;

std::string flat(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void pretty(const Json& j, std::size_t indent, std::string& out) {
  const std::string pad(indent + 2, ' ');
  if (j.is_object() && !j.empty()) {
    out += "{\n";
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out += ",\n";
      first = false;
      out += pad + flat(Json(it.key())) + ": ";
      pretty(it.value(), indent + 2, out);
    }
    out += "\n" + std::string(indent, ' ') + "}";
    return;
  }
  if (j.is_array() && !j.empty()) {
    bool scalars = true, rows = true;
    for (const Json& e : j) {
      scalars &= e.is_primitive();
      rows &= flat(e).size() <= 160;
    }
    if (scalars && flat(j).size() <= 100) {
      out += flat(j);
      return;
    }
    out += "[\n";
    bool first = true;
    for (const Json& e : j) {
      if (!first) out += ",\n";
      first = false;
      out += pad;
      if (rows) {
        out += flat(e);
      } else {
        pretty(e, indent + 2, out);
      }
    }
    out += "\n" + std::string(indent, ' ') + "]";
    return;
  }
  out += flat(j);
}

const Json kEmptyArray = Json::array();

}  // namespace

std::string dump_rows(const Json& j) {
  std::string out;
  pretty(j, 0, out);
  return out;
}

std::uint64_t get_u64(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return 0;
  const Json& v = j[key];
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) return v.get<std::int64_t>() < 0 ? 0 : static_cast<std::uint64_t>(v.get<std::int64_t>());
  return 0;
}

std::int64_t get_i64(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return 0;
  return j[key].get<std::int64_t>();
}

double get_num(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return 0;
  return j[key].get<double>();
}

bool get_bool(const Json& j, const char* key) { return j.is_object() && j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); }

std::string get_str(const Json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

const Json& get_arr(const Json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_array() ? j[key] : kEmptyArray;
}

}  // namespace vf::report

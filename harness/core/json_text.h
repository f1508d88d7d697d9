// JSON written as text, byte for byte what nlohmann's dump() writes for the same values, for the
// writers hot enough that building a document first costs more than the output (a protocol
// request's modules, a predict-serve reply).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace vf {

// Appends `text` as a JSON string exactly as nlohmann's dump writes it. Printable ASCII without
// a quote or backslash (every name vramfuzz's catalog and generator make) is copied; anything
// else goes through nlohmann itself, so escapes and its UTF-8 check are its own.
inline void append_json_string(std::string& out, std::string_view text) {
  for (const char c : text) {
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') {
      out += nlohmann::json(std::string(text)).dump();
      return;
    }
  }
  out += '"';
  out += text;
  out += '"';
}

inline void append_uint(std::string& out, std::uint64_t v) {
  const fmt::format_int f(v);
  out.append(f.data(), f.size());
}

inline void append_int(std::string& out, std::int64_t v) {
  const fmt::format_int f(v);
  out.append(f.data(), f.size());
}

inline void append_bool(std::string& out, bool v) { out += v ? "true" : "false"; }

}  // namespace vf

// JSON's two-character string escapes, for the project's own JSON scanners (json_doc.cpp's parser,
// the safetensors header reader).
#pragma once

namespace vf {

// The character a JSON two-character escape `\e` stands for ('"', '\\', '/', b f n r t); '\0'
// for any other `e` (\u is not a two-character escape).
constexpr char json_short_escape(char e) {
  switch (e) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return '\0';
  }
}

}  // namespace vf

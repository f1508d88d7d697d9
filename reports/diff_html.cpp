// diff.html: `vramfuzz diff`'s report, rendered from diff.json alone (like report.html from
// summary.json), self-contained (the report's stylesheet, inline SVG, no script, no network).
// The counts; the groups by size; per group the minimal case's fields with A's and B's values
// side by side (each byte field as a pair of bars on its own scale, so a 50 MiB buffer difference
// is as visible as a 2 GiB one), what the plans and verdicts rest on, and the two commands that
// plan the minimal case under A and under B.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "reports/json_util.h"
#include "reports/render.h"

namespace vf::report {
namespace {

std::string mib_text(std::int64_t bytes) {
  return fmt::format("{}{:.2f} MiB", bytes < 0 ? "-" : "", static_cast<double>(bytes < 0 ? -bytes : bytes) / static_cast<double>(MiB));
}

// A group key, escaped, with a break opportunity after each `+`.
std::string breakable_key(const std::string& key) {
  std::string out;
  for (const char ch : key) out += ch == '+' ? std::string("+<wbr>") : xml_escape(std::string_view(&ch, 1));
  return out;
}

// One row per byte field: the field's name, then A's bar over B's, both scaled to the larger of
// the two (the row's own scale).
std::string bars_svg(const std::vector<const Json*>& fields) {
  constexpr int kLabel = 230, kBar = 420, kRow = 40, kValue = 150;
  const int width = kLabel + kBar + kValue;
  const int height = static_cast<int>(fields.size()) * kRow + 22;
  std::string s = fmt::format("<svg class=\"diffbars\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" "
                              "aria-label=\"A and B per byte field\">\n",
                              width, height, width, height);
  s += fmt::format("<rect x=\"{}\" y=\"4\" width=\"10\" height=\"8\" fill=\"#2563eb\"/><text x=\"{}\" y=\"12\">A</text>"
                   "<rect x=\"{}\" y=\"4\" width=\"10\" height=\"8\" fill=\"#ea580c\"/><text x=\"{}\" y=\"12\">B</text>\n",
                   kLabel, kLabel + 14, kLabel + 34, kLabel + 48);
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const Json& f = *fields[i];
    const std::int64_t a = get_i64(f, "a_bytes"), b = get_i64(f, "b_bytes");
    const double top = std::max<double>({1.0, static_cast<double>(a < 0 ? -a : a), static_cast<double>(b < 0 ? -b : b)});
    const int y = 22 + static_cast<int>(i) * kRow;
    auto len = [&](std::int64_t v) { return std::max(1.0, static_cast<double>(v < 0 ? -v : v) / top * kBar); };
    s += fmt::format("<text x=\"0\" y=\"{}\">{}</text>\n", y + 19, xml_escape(get_str(f, "field")));
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"14\" fill=\"#2563eb\"><title>A: {}</title></rect>\n", kLabel, y + 2, len(a),
                     xml_escape(mib_text(a)));
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"14\" fill=\"#ea580c\"><title>B: {}</title></rect>\n", kLabel, y + 18,
                     len(b), xml_escape(mib_text(b)));
    s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text><text x=\"{}\" y=\"{}\">{}</text>\n", kLabel + kBar + 8, y + 13,
                     xml_escape(mib_text(a)), kLabel + kBar + 8, y + 29, xml_escape(mib_text(b)));
  }
  return s + "</svg>\n";
}

}  // namespace

std::string diff_html(const Json& d) {
  const Json cfg = d.value("config", Json::object());
  const Json c = d.value("counts", Json::object());
  const std::string a = get_str(cfg, "policy"), b = get_str(cfg, "against");
  const std::uint64_t groups = get_u64(c, "groups");
  const std::string verdict = groups == 0 ? std::string("no difference")
                                          : fmt::format("{} group{} of differences", groups, groups == 1 ? "" : "s");
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  // Keys, signatures and paths are long words: let them break inside the table.
  h += fmt::format("<title>vramfuzz diff: {} against {}</title>\n<style>{}\n.difftable {{ max-width: 100%; }} .difftable td {{ "
                   "overflow-wrap: anywhere; }}\n</style>\n</head>\n<body>\n",
                   xml_escape(a), xml_escape(b), report_css());
  h += fmt::format("<header>\n<h1>vramfuzz diff: <code>{}</code> (A) against <code>{}</code> (B) <span class=\"verdict {}\">{}</span></h1>\n",
                   xml_escape(a), xml_escape(b), groups == 0 ? "ok" : "bad", xml_escape(verdict));
  std::string overrides;
  for (const Json& o : get_arr(cfg, "against_overrides")) overrides += (overrides.empty() ? "" : " ") + o.get<std::string>();
  h += fmt::format("<p class=\"context\">seed {}, tolerance {} B{}{}{}; {}</p>\n<pre>{}</pre>\n</header>\n", get_u64(cfg, "seed"),
                   get_u64(cfg, "tolerance"), overrides.empty() ? "" : "; B's overrides: " + xml_escape(overrides),
                   get_bool(cfg, "verdicts") ? "" : "; plans only (--no-verdicts)", get_bool(cfg, "shrink") ? "" : "; not shrunk",
                   d.contains("stopped") && get_bool(d, "stopped") ? "stopped early by a signal" : xml_escape(get_str(d, "tool")),
                   xml_escape(get_str(d, "command_line")));
  h += "<div class=\"cards\">";
  for (const auto& [label, value] : std::vector<std::pair<std::string, std::string>>{
           {"cases", std::to_string(get_u64(c, "cases"))},
           {"the same", std::to_string(get_u64(c, "same"))},
           {"plans differ", std::to_string(get_u64(c, "plans_differ"))},
           {"verdicts differ", std::to_string(get_u64(c, "verdicts_differ"))},
           {"unplanned by one side", std::to_string(get_u64(c, "errors"))},
           {"groups", std::to_string(groups)},
           {"seconds", fmt::format("{:.1f}", get_num(d, "seconds"))}}) {
    h += fmt::format("<div class=\"card\"><b>{}</b><span>{}</span></div>", xml_escape(value), xml_escape(label));
  }
  h += "</div>\n";
  const Json& gs = get_arr(d, "groups");
  if (gs.empty()) return h + "<p>Every case planned the same under both.</p>\n</body>\n</html>\n";

  h += "<h2 id=\"groups\">What differs</h2>\n<table class=\"difftable\">\n<tr><th>what differs</th><th class=\"num\">cases</th><th>modules (first case → "
       "minimal)</th><th>verdict A</th><th>verdict B</th><th>minimal case</th></tr>\n";
  for (std::size_t i = 0; i < gs.size(); ++i) {
    const Json& g = gs[i];
    const Json m = g.value("modules", Json::object());
    const std::string file = get_str(g, "file");
    h += fmt::format("<tr><td><a href=\"#group-{}\">{}</a></td><td class=\"num\">{}</td><td class=\"num\">{} → {}</td><td>{}</td><td>{}</td>"
                     "<td>{}</td></tr>\n",
                     i + 1, breakable_key(get_str(g, "key")), get_u64(g, "cases"), get_u64(m, "before"), get_u64(m, "after"),
                     xml_escape(get_str(g, "verdict_a").empty() ? "-" : get_str(g, "verdict_a")),
                     xml_escape(get_str(g, "verdict_b").empty() ? "-" : get_str(g, "verdict_b")),
                     // `file` is relative to the diff's folder, where this page is written.
                     file.empty() ? "" : fmt::format("<a href=\"{}\"><code>{}</code></a>", xml_escape(file), xml_escape(file)));
  }
  h += "</table>\n";

  for (std::size_t i = 0; i < gs.size(); ++i) {
    const Json& g = gs[i];
    const Json m = g.value("modules", Json::object());
    h += fmt::format("<section class=\"finding\" id=\"group-{}\">\n<h2>{}</h2>\n", i + 1, xml_escape(get_str(g, "key")));
    h += fmt::format("<p>{} case(s); the first is case {} (seed {}). Its minimal form keeps {} of {} module(s) after {} shrink "
                     "candidate(s).</p>\n",
                     get_u64(g, "cases"), get_u64(g, "first_case_index"), get_u64(g, "first_case_seed"), get_u64(m, "after"),
                     get_u64(m, "before"), get_u64(g, "shrink_execs"));
    h += "<table>\n<tr><th>field</th><th>A</th><th>B</th><th class=\"num\">B − A</th></tr>\n";
    std::vector<const Json*> byte_fields;
    for (const Json& f : get_arr(g, "fields")) {
      const std::int64_t delta = get_i64(f, "delta");
      h += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>\n", xml_escape(get_str(f, "field")),
                       xml_escape(get_str(f, "a")), xml_escape(get_str(f, "b")), delta ? xml_escape((delta > 0 ? "+" : "") + mib_text(delta)) : "");
      if (f.contains("a_bytes")) byte_fields.push_back(&f);
    }
    h += "</table>\n";
    if (!byte_fields.empty()) {
      h += "<figure>\n" + bars_svg(byte_fields) +
           "<figcaption>Each byte field of the minimal case under A and B, on its own scale (a module set: the bytes of the "
           "modules on that side only).</figcaption>\n</figure>\n";
    }
    const Json rests = g.value("rests_on", Json::object());
    h += fmt::format("<p class=\"rests\"><b>Rests on:</b> plan fields: {}.", xml_escape(get_str(rests, "plans")));
    if (rests.contains("verdicts")) {
      const std::string ra = get_str(rests["verdicts"], "a"), rb = get_str(rests["verdicts"], "b");
      if (!ra.empty() && ra == rb) {
        h += fmt::format(" Verdicts (both): {}.", xml_escape(ra));
      } else {
        if (!ra.empty()) h += fmt::format(" Verdict A: {}.", xml_escape(ra));
        if (!rb.empty()) h += fmt::format(" Verdict B: {}.", xml_escape(rb));
      }
    }
    h += "</p>\n";
    h += fmt::format("<p>Plan the minimal case under both (from the folder this report is in):</p>\n<pre>{}\n{}</pre>\n</section>\n", xml_escape(get_str(g, "plan_a")),
                     xml_escape(get_str(g, "plan_b")));
  }
  return h + "<footer>vramfuzz diff: vramfuzz.diff/1, rendered from diff.json</footer>\n</body>\n</html>\n";
}

}  // namespace vf::report

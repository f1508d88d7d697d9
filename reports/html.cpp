// report.html: one self-contained file (inline CSS and SVG drawn here, a few lines of inline JS
// that only toggle chart series; no network, no external fonts or scripts). Per finding with a
// repro: the timeline of device used / allocator reserved / allocated / live bytes against op
// index, the predicted and predicted + reserve step lines per stage, the peak and OOM markers,
// the plan's resident/offloaded split per load, and the trace around the peak. Then the
// policy x allocator matrix, the corpus, and per allocator mode the overshoot histogram of a
// calibration.
#include <algorithm>
#include <functional>
#include <cmath>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "reports/json_util.h"
#include "reports/render.h"
#include "reports/tables.h"

namespace vf::report {
namespace {

constexpr std::string_view kCss = R"(
:root { --fg:#1f2328; --muted:#59636e; --line:#d1d9e0; --bg:#ffffff; --panel:#f6f8fa;
  --reserved:#2563eb; --allocated:#7c9fe8; --live:#16a34a; --used:#6b7280; --limit:#ea580c; --bad:#d1242f; --ok:#1a7f37; --warn:#9a6700; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
h1 { font-size: 22px; margin: 0 0 6px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
pre { background: var(--panel); padding: 8px 10px; border-radius: 6px; overflow-x: auto; }
.verdict { padding: 2px 10px; border-radius: 12px; color: #fff; font-size: 16px; }
.verdict.bad { background: var(--bad); } .verdict.ok { background: var(--ok); } .verdict.known { background: var(--warn); }
.context { color: var(--muted); margin: 4px 0 10px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 8px 14px; min-width: 110px; }
.card b { display: block; font-size: 20px; } .card span { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: var(--panel); } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.hl td { background: #fff1e5; font-weight: 600; } tr.oomrow td { background: #ffebe9; font-weight: 600; }
.finding { border: 1px solid var(--line); border-radius: 10px; padding: 4px 18px 12px; margin: 18px 0; }
.finding h2 { border: 0; margin-top: 12px; }
.tag { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 12px; border: 1px solid var(--line); background: var(--panel); }
.tag.bad { color: #fff; background: var(--bad); border-color: var(--bad); } .tag.known { color: #fff; background: var(--warn); border-color: var(--warn); }
.tag.ok { color: #fff; background: var(--ok); border-color: var(--ok); }
figure { margin: 8px 0; } figcaption { color: var(--muted); font-size: 12px; }
.legend { display: flex; flex-wrap: wrap; gap: 6px; margin: 4px 0; }
.legend button { font: inherit; font-size: 12px; border: 1px solid var(--line); background: var(--bg); border-radius: 12px; padding: 1px 10px; cursor: pointer; }
.legend button.off { opacity: .4; text-decoration: line-through; }
.sw { display: inline-block; width: 18px; height: 3px; vertical-align: middle; margin-right: 5px; }
svg text { font-family: system-ui, sans-serif; font-size: 11px; fill: var(--muted); }
svg .grid { stroke: #eaeef2; } svg .axis { stroke: #8c959f; }
svg .s-used { stroke: var(--used); } svg .s-reserved { stroke: var(--reserved); } svg .s-allocated { stroke: var(--allocated); }
svg .s-live { stroke: var(--live); } svg .s-limit { stroke: var(--limit); } svg .s-predicted { stroke: var(--limit); }
svg .fill-reserved { fill: var(--reserved); fill-opacity: .10; stroke: none; }
svg .a-rounding { fill: #e9d5ff; } svg .a-held { fill: #fca5a5; } svg .a-activations { fill: #bbf7d0; } svg .a-transients { fill: #fde68a; }
svg .a-weights { fill: #cbd5e1; } svg .b-weights { stroke: #475569; } svg .b-offload { stroke: #b45309; }
.hide-used .s-used, .hide-reserved .s-reserved, .hide-reserved .fill-reserved, .hide-allocated .s-allocated,
.hide-live .s-live, .hide-limit .s-limit, .hide-predicted .s-predicted, .hide-parts .part, .hide-budget .budget { display: none; }
.split { display: flex; height: 14px; width: 420px; border: 1px solid var(--line); border-radius: 3px; overflow: hidden; }
.split .res { background: var(--reserved); } .split .off { background: #c8d1db; }
.cell-bad { background: #ffebe9; } .cell-ok { background: #dafbe1; } .cell-known { background: #fff8c5; } .cell-skip { color: var(--muted); }
footer { margin-top: 36px; color: var(--muted); font-size: 12px; }
)";

constexpr std::string_view kJs = R"(
document.querySelectorAll('.legend button[data-series]').forEach(function (b) {
  b.addEventListener('click', function () {
    var fig = b.closest('figure');
    if (!fig) return;
    fig.classList.toggle('hide-' + b.getAttribute('data-series'));
    b.classList.toggle('off');
  });
});
)";

double to_mib_d(double bytes) { return bytes / static_cast<double>(MiB); }

}  // namespace

std::string_view report_css() { return kCss; }

namespace {

// A tick step of 1, 2 or 5 x 10^k that gives about `want` ticks over `span`.
double nice_step(double span, int want) {
  if (span <= 0) return 1;
  const double raw = span / want;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10 * mag;
}

std::string bytes_label(double bytes) {
  const double mib = to_mib_d(bytes);
  if (std::fabs(mib) >= 1024) return std::fmod(mib, 1024.0) == 0 ? fmt::format("{:.0f} GiB", mib / 1024) : fmt::format("{:.1f} GiB", mib / 1024);
  return fmt::format("{:.0f} MiB", mib);
}

// The SVG timeline of one case view (reports/summary.cpp: case_view).
std::string timeline_svg(const Json& cv, const std::string& id) {
  const Json& trace = cv.contains("trace") ? cv["trace"] : Json::object();
  const Json& rows = get_arr(trace, "rows");
  if (rows.empty()) return "<p class=\"context\">No trace was recorded for this case.</p>\n";
  // load_summary checks every row (reports/summary_schema.cpp); a summary built in code is
  // checked here too, before cells 0 and 2-5 of each row are read.
  for (const Json& r : rows) {
    bool ok = r.is_array() && r.size() == 6;
    for (std::size_t c = 0; ok && c < 6; ++c) ok = r[c].is_number();
    if (!ok) return "<p class=\"context\">The trace of this case is damaged (a row is not 6 numbers); not drawn.</p>\n";
  }
  const double W = 1100, H = 380, L = 70, R = 20, T = 28, B = 40;
  const double ops = std::max<double>(1.0, static_cast<double>(get_u64(trace, "ops")));
  double ymax = 0;
  for (const Json& r : rows) {
    for (std::size_t c = 2; c < 6; ++c) ymax = std::max(ymax, r[c].get<double>());
  }
  for (const Json& st : get_arr(cv, "stages")) {
    if (get_bool(st, "checked")) ymax = std::max(ymax, get_num(st, "limit"));
  }
  const Json& oom = cv.contains("oom") ? cv["oom"] : Json();
  const bool has_oom = oom.is_object();
  const double device_total = cv.contains("scenario") ? get_num(cv["scenario"], "device_total") : 0;
  if (has_oom) {
    ymax = std::max(ymax, get_num(oom, "reserved") + get_num(oom, "request"));
    if (device_total > 0 && device_total < ymax * 1.6) ymax = std::max(ymax, device_total);
  }
  ymax = std::max(ymax * 1.08, static_cast<double>(MiB));
  auto X = [&](double op) { return L + (W - L - R) * (op / ops); };
  auto Y = [&](double v) { return T + (H - T - B) * (1.0 - v / ymax); };

  std::string svg = fmt::format(
      "<svg id=\"{}\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" role=\"img\" aria-label=\"memory timeline\" "
      "xmlns=\"http://www.w3.org/2000/svg\">\n",
      id, W, H, W, H);
  svg += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", W, H);
  // Grid and axes.
  // Round ticks: whole GiB steps past 2 GiB, else MiB steps.
  const double unit = ymax >= 2.0 * static_cast<double>(GiB) ? static_cast<double>(GiB) : static_cast<double>(MiB);
  const double ystep = nice_step(ymax / unit, 6) * unit;
  for (double v = 0; v <= ymax; v += ystep) {
    svg += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>", L, W - R, Y(v), Y(v));
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", L - 6, Y(v) + 4, bytes_label(v));
  }
  const double xstep = std::max(1.0, nice_step(ops, 10));
  for (double o = 0; o <= ops; o += xstep) {
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:.0f}</text>", X(o), H - B + 16, o);
  }
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">op index</text>\n", (L + W - R) / 2, H - 6);
  svg += fmt::format("<line class=\"axis\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\"/>", L, T, H - B);
  svg += fmt::format("<line class=\"axis\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>\n", L, W - R, H - B, H - B);

  // Stage boundaries and labels.
  for (const Json& st : get_arr(cv, "stages")) {
    const double x0 = X(get_num(st, "begin"));
    svg += fmt::format("<line class=\"grid\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke-dasharray=\"3 3\"/>", x0,
                       T - 10, H - B);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{} {}</text>\n", x0 + 4, T - 14 + 10, xml_escape(get_str(st, "op")),
                       xml_escape(get_str(st, "model")));
  }

  // The series: step lines through (op, value).
  auto series = [&](std::size_t col) {
    std::string d;
    double prev_y = Y(0);
    bool first = true;
    for (const Json& r : rows) {
      const double x = X(r[0].get<double>()), y = Y(r[col].get<double>());
      if (first) {
        d += fmt::format("M{:.1f} {:.1f}", x, y);
        first = false;
      } else {
        d += fmt::format("H{:.1f}V{:.1f}", x, y);
      }
      prev_y = y;
    }
    // Past the last executed op there is nothing to draw (an OOM ended the program there);
    // otherwise the last state holds to the end of the program.
    if (!has_oom) d += fmt::format("H{:.1f}", X(ops));
    (void)prev_y;
    return d;
  };
  const std::string reserved = series(4);
  svg += fmt::format("<path class=\"fill-reserved\" d=\"{}V{:.1f}H{:.1f}Z\"/>\n", reserved, Y(0), X(rows.front()[0].get<double>()));
  // What the bytes are made of (docs/attribution.md), stacked as PyTorch's memory_viz draws a
  // snapshot: weights at the bottom, then weight transients, activations, the allocator's rounding
  // (up to allocated); the reserved area above it is slack. Each band is the area under its
  // cumulative top, drawn top down so the lower ones cover the rest.
  const Json& parts = get_arr(trace, "parts");
  bool stacked = parts.size() == rows.size();
  const Json& held = get_arr(trace, "held");
  bool held_rows = held.size() == rows.size();
  for (std::size_t i = 0; held_rows && i < held.size(); ++i) held_rows = held[i].is_number();
  for (std::size_t i = 0; stacked && i < parts.size(); ++i) {
    stacked = parts[i].is_array() && parts[i].size() == 3 && parts[i][0].is_number() && parts[i][1].is_number() && parts[i][2].is_number();
  }
  if (stacked) {
    auto area = [&](const std::function<double(std::size_t)>& top) {
      std::string d;
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const double x = X(rows[i][0].get<double>()), y = Y(top(i));
        d += i == 0 ? fmt::format("M{:.1f} {:.1f}", x, y) : fmt::format("H{:.1f}V{:.1f}", x, y);
      }
      if (!has_oom) d += fmt::format("H{:.1f}", X(ops));
      return fmt::format("{}V{:.1f}H{:.1f}Z", d, Y(0), X(rows.front()[0].get<double>()));
    };
    auto part = [&](std::size_t i, std::size_t upto) {
      double v = 0;
      for (std::size_t c = 0; c < upto; ++c) v += parts[i][c].get<double>();
      return v;
    };
    // On raw every tensor is its own cudaMalloc: reserved - allocated is the driver's pages, rounding too.
    const bool raw = cv.contains("scenario") && get_str(cv["scenario"], "allocator") == "raw";
    // Other streams' frees, right above allocated: of the unallocated bytes, those the op's
    // stream could not reuse (docs/attribution.md); the rest up to reserved is slack.
    if (held_rows) {
      svg += fmt::format("<path class=\"part a-held\" d=\"{}\"/>\n", area([&](std::size_t i) {
                           return std::min(rows[i][3].get<double>() + held[i].get<double>(), rows[i][4].get<double>());
                         }));
    }
    svg += fmt::format("<path class=\"part a-rounding\" d=\"{}\"/>\n",
                       area([&](std::size_t i) { return rows[i][raw ? 4 : 3].get<double>(); }));
    svg += fmt::format("<path class=\"part a-activations\" d=\"{}\"/>\n", area([&](std::size_t i) { return part(i, 3); }));
    svg += fmt::format("<path class=\"part a-transients\" d=\"{}\"/>\n", area([&](std::size_t i) { return part(i, 2); }));
    svg += fmt::format("<path class=\"part a-weights\" d=\"{}\"/>\n", area([&](std::size_t i) { return part(i, 1); }));
  }
  svg += fmt::format("<path class=\"s-used\" fill=\"none\" stroke-width=\"1.5\" d=\"{}\"/>\n", series(5));
  svg += fmt::format("<path class=\"s-allocated\" fill=\"none\" stroke-width=\"1\" d=\"{}\"/>\n", series(3));
  svg += fmt::format("<path class=\"s-reserved\" fill=\"none\" stroke-width=\"2\" d=\"{}\"/>\n", reserved);
  svg += fmt::format("<path class=\"s-live\" fill=\"none\" stroke-width=\"1.5\" d=\"{}\"/>\n", series(2));

  // Predicted and predicted + reserve, per checked stage.
  for (const Json& st : get_arr(cv, "stages")) {
    if (!get_bool(st, "checked")) continue;
    const double x0 = X(get_num(st, "begin")), x1 = X(get_num(st, "end"));
    // The plan's budgets beside the bands: loaded weights, then + the offload buffer (+ the
    // activation allowance is the predicted line).
    if (stacked && st.contains("budget") && st["budget"].is_object()) {
      const double w = get_num(st["budget"], "weights"), b = w + get_num(st["budget"], "offload");
      svg += fmt::format("<line class=\"budget b-weights\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke-width=\"1\" "
                         "stroke-dasharray=\"6 3\"/>",
                         x0, x1, Y(w), Y(w));
      if (b > w) {
        svg += fmt::format("<line class=\"budget b-offload\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke-width=\"1\" "
                           "stroke-dasharray=\"6 3\"/>",
                           x0, x1, Y(b), Y(b));
      }
    }
    svg += fmt::format("<line class=\"s-limit\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke-width=\"2\" "
                       "stroke-dasharray=\"8 4\"/>",
                       x0, x1, Y(get_num(st, "limit")), Y(get_num(st, "limit")));
    svg += fmt::format("<line class=\"s-predicted\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke-width=\"1\" "
                       "stroke-dasharray=\"2 3\"/>\n",
                       x0, x1, Y(get_num(st, "predicted")), Y(get_num(st, "predicted")));
  }
  if (has_oom && device_total > 0 && device_total <= ymax) {
    svg += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#d1242f\" stroke-width=\"1\" "
                       "stroke-dasharray=\"1 3\"/><text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">device total {}</text>\n",
                       L, W - R, Y(device_total), Y(device_total), W - R - 4, Y(device_total) - 4, bytes_label(device_total));
  }

  // Markers: the judged peak, the OOM.
  const Json& v = cv.contains("verdict") ? cv["verdict"] : Json::object();
  if (get_str(v, "kind") == "violation" || get_str(v, "kind") == "pass") {
    const double x = X(get_num(v, "op")), y = Y(get_num(v, "measured"));
    svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\" fill=\"none\" stroke=\"#d1242f\" stroke-width=\"2\"/>", x, y);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" style=\"fill:#d1242f;font-weight:600\">peak {} ({} over predicted + reserve)</text>\n",
                       std::min(x + 8, W - 330), y - 8, bytes_label(get_num(v, "measured")),
                       signed_mib1(get_i64(v, "overshoot")));
  }
  if (has_oom) {
    const double x = X(get_num(oom, "op")), y = Y(get_num(oom, "reserved") + get_num(oom, "request"));
    svg += fmt::format("<path d=\"M{0:.1f} {1:.1f}l-6 -10h12z\" fill=\"#d1242f\"/><line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" "
                       "y2=\"{2:.1f}\" stroke=\"#d1242f\" stroke-width=\"1.5\"/>",
                       x, y, H - B);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" style=\"fill:#d1242f;font-weight:600\">OOM at op {}: {} requested</text>\n",
                       std::min(x + 8, W - 280), y - 12, get_u64(oom, "op"), bytes_label(get_num(oom, "request")));
  }
  svg += "</svg>\n";

  std::string legend = "<div class=\"legend\">";
  for (const auto& [key, label, color] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"used", "device used", "var(--used)"},
           {"reserved", "allocator reserved", "var(--reserved)"},
           {"allocated", "allocated", "var(--allocated)"},
           {"live", "live (requested)", "var(--live)"},
           {"limit", "predicted + reserve", "var(--limit)"},
           {"predicted", "predicted", "var(--limit)"}}) {
    legend += fmt::format("<button type=\"button\" data-series=\"{}\"><span class=\"sw\" style=\"background:{}\"></span>{}</button>", key,
                          color, label);
  }
  if (stacked) {
    legend += fmt::format(
        "<button type=\"button\" data-series=\"parts\"><span class=\"sw\" style=\"height:10px;background:linear-gradient(to top,"
        "#cbd5e1 {0}%,#fde68a {0}% {1}%,#bbf7d0 {1}% {2}%,#e9d5ff {2}%{3})\"></span>weights / weight transients / activations / "
        "rounding{4} (slack above)</button>",
        held_rows ? 20 : 25, held_rows ? 40 : 50, held_rows ? 60 : 75, held_rows ? " 80%,#fca5a5 80%" : "",
        held_rows ? " / other streams' frees" : "");
    legend += "<button type=\"button\" data-series=\"budget\"><span class=\"sw\" style=\"background:#475569\"></span>budget: loaded "
              "weights, + offload buffer</button>";
  }
  legend += "</div>\n";
  return fmt::format("<figure class=\"timeline\">\n{}{}<figcaption>{} of {} ops{}; stage boundaries dashed; "
                     "click a legend entry to hide or show it.</figcaption>\n</figure>\n",
                     legend, svg, rows.size(), get_u64(trace, "ops"),
                     get_bool(trace, "downsampled") ? " (downsampled: each bucket's highest reserved row, the peak and OOM ops)" : "");
}

std::string loads_html(const Json& cv) {
  const Json& loads = get_arr(cv, "loads");
  if (loads.empty()) return "";
  std::string out = "<h3>What the plan put on the device</h3>\n<table><thead><tr><th>model</th><th>stage</th><th class=\"num\">resident</th>"
                    "<th class=\"num\">offloaded</th><th class=\"num\">offload buffer</th><th class=\"num\">modules resident</th>"
                    "<th>split</th></tr></thead><tbody>\n";
  for (const Json& l : loads) {
    const double loaded = get_num(l, "loaded"), off = get_num(l, "offloaded");
    const double total = std::max(1.0, loaded + off);
    out += fmt::format("<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
                       "<td class=\"num\">{} / {}</td><td><div class=\"split\" title=\"{}\"><span class=\"res\" style=\"width:{:.1f}%\"></span>"
                       "<span class=\"off\" style=\"width:{:.1f}%\"></span></div></td></tr>\n",
                       xml_escape(get_str(l, "model")), get_u64(l, "stage"), mib1(get_u64(l, "loaded")), mib1(get_u64(l, "offloaded")),
                       mib1(get_u64(l, "offload_buffer")), get_u64(l, "resident_modules"), get_u64(l, "modules"),
                       xml_escape(get_str(l, "log")), 100.0 * loaded / total, 100.0 * off / total);
  }
  out += "</tbody></table>\n<pre>";
  for (const Json& l : loads) out += xml_escape(get_str(l, "model") + ": " + get_str(l, "log")) + "\n";
  return out + "</pre>\n";
}

std::string stages_html(const Json& cv) {
  std::string out = "<h3>Predicted vs measured, per stage</h3>\n<table><thead><tr><th>stage</th><th>op</th><th>model</th><th class=\"num\">ops</th>"
                    "<th class=\"num\">predicted</th><th class=\"num\">predicted + reserve</th><th class=\"num\">measured (reserved peak)</th>"
                    "<th class=\"num\">overshoot</th></tr></thead><tbody>\n";
  for (const Json& st : get_arr(cv, "stages")) {
    const bool checked = get_bool(st, "checked");
    const std::int64_t over = static_cast<std::int64_t>(get_u64(st, "measured")) - static_cast<std::int64_t>(get_u64(st, "limit"));
    out += fmt::format("<tr><td class=\"num\">{}</td><td>{}</td><td>{}</td><td class=\"num\">{}-{}</td><td class=\"num\">{}</td>"
                       "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>\n",
                       get_u64(st, "stage"), xml_escape(get_str(st, "op")), xml_escape(get_str(st, "model")), get_u64(st, "begin"),
                       get_u64(st, "end"), checked ? mib1(get_u64(st, "predicted")) : "not checked",
                       checked ? mib1(get_u64(st, "limit")) : "", mib1(get_u64(st, "measured")), checked ? signed_mib1(over) : "");
  }
  return out + "</tbody></table>\n";
}

std::string around_html(const Json& cv) {
  const Json& rows = get_arr(cv, "around_peak");
  if (rows.empty()) return "";
  const Json& v = cv.contains("verdict") ? cv["verdict"] : Json::object();
  const std::uint64_t peak = get_u64(v, "op");
  const std::uint64_t oom_op = cv.contains("oom") && cv["oom"].is_object() ? get_u64(cv["oom"], "op") : ~0ull;
  std::string out = "<h3>Trace around the peak</h3>\n<table><thead><tr><th class=\"num\">op</th><th>kind</th><th>phase</th>"
                    "<th class=\"num\">stream</th><th>what</th><th class=\"num\">bytes</th><th class=\"num\">live</th>"
                    "<th class=\"num\">allocated</th><th class=\"num\">reserved</th><th class=\"num\">device used</th></tr></thead><tbody>\n";
  for (const Json& r : rows) {
    const std::uint64_t op = get_u64(r, "op");
    const char* cls = op == oom_op ? " class=\"oomrow\"" : op == peak ? " class=\"hl\"" : "";
    out += fmt::format("<tr{}><td class=\"num\">{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"mono\">{}</td>"
                       "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
                       "<td class=\"num\">{}</td></tr>\n",
                       cls, op, xml_escape(get_str(r, "kind")), xml_escape(get_str(r, "phase")), get_u64(r, "stream"),
                       xml_escape(get_str(r, "what")), mib1(get_u64(r, "bytes")), mib1(get_u64(r, "live")),
                       mib1(get_u64(r, "allocated")), mib1(get_u64(r, "reserved")), mib1(get_u64(r, "device_used")));
  }
  return out + "</tbody></table>\n";
}

std::string case_html(const Json& cv, const std::string& id) {
  std::string out;
  const Json& sc = cv.contains("scenario") ? cv["scenario"] : Json::object();
  out += fmt::format("<p class=\"context\">{} device ({} available), allocator <b>{}</b>, policy {}, {} offload stream(s), {}</p>\n",
                     bytes_label(get_num(sc, "device_total")), bytes_label(get_num(sc, "available")),
                     xml_escape(get_str(sc, "allocator")), xml_escape(get_str(sc, "policy")), get_u64(sc, "streams"),
                     xml_escape(get_str(sc, "workload")));
  if (const Json& v = cv.contains("verdict") ? cv["verdict"] : Json::object(); v.is_object()) {
    if (v.contains("cause")) out += fmt::format("<p class=\"cause\"><b>Cause:</b> {}</p>\n", xml_escape(get_str(v, "cause")));
    if (v.contains("explanation")) out += fmt::format("<p class=\"why\"><b>Why:</b> {}</p>\n", xml_escape(get_str(v, "explanation")));
    if (v.value("activation_dependent", false)) {
      out += fmt::format("<p class=\"cause\"><b>Activation-dependent:</b> at the predictor's estimate this case gives {}: it rests on "
                         "how the activations were sized</p>\n",
                         xml_escape(get_str(v, "at_budget")));
    }
    if (v.contains("rests_on")) out += fmt::format("<p class=\"rests\"><b>Rests on:</b> {}</p>\n", xml_escape(get_str(v, "rests_on")));
  }
  out += timeline_svg(cv, id);
  out += loads_html(cv) + stages_html(cv) + around_html(cv);
  return out;
}

std::string histogram_svg(const Json& mode) {
  const Json& h = mode.contains("histogram") ? mode["histogram"] : Json::object();
  const Json& bins = get_arr(h, "bins");
  if (bins.empty()) return "";
  const Json& ooms = get_arr(h, "ooms");
  const double bucket = get_num(h, "bucket"), lo = get_num(h, "lo");
  const double W = 760, H = 220, L = 44, R = 12, T = 16, B = 38;
  double cmax = 1;
  for (const Json& b : bins) cmax = std::max(cmax, b.get<double>());
  const double n = static_cast<double>(bins.size());
  const double reserve = get_num(mode, "reserve"), rec = get_num(mode, "recommended");
  const double x_lo = lo, x_hi = std::max(lo + n * bucket, rec + bucket) + bucket;
  auto X = [&](double v) { return L + (W - L - R) * ((v - x_lo) / (x_hi - x_lo)); };
  auto Y = [&](double c) { return T + (H - T - B) * (1.0 - c / cmax); };
  std::string svg = fmt::format("<svg viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" aria-label=\"overshoot histogram\" "
                                "xmlns=\"http://www.w3.org/2000/svg\">\n<rect width=\"{0}\" height=\"{1}\" fill=\"#ffffff\"/>\n",
                                W, H);
  const double cstep = std::max(1.0, nice_step(cmax, 4));
  for (double c = 0; c <= cmax; c += cstep) {
    svg += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/><text x=\"{:.1f}\" y=\"{:.1f}\" "
                       "text-anchor=\"end\">{:.0f}</text>\n",
                       L, W - R, Y(c), Y(c), L - 5, Y(c) + 4, c);
  }
  for (std::size_t i = 0; i < bins.size(); ++i) {
    const double c = bins[i].get<double>();
    if (c <= 0) continue;
    const double b0 = lo + static_cast<double>(i) * bucket, b1 = b0 + bucket;
    const char* color = b1 <= 0 ? "#16a34a" : b0 >= reserve ? "#d1242f" : "#2563eb";
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"><title>{} to {}: {} case(s)</title></rect>\n",
                       X(b0) + 0.5, Y(c), std::max(1.0, X(b1) - X(b0) - 1), Y(0) - Y(c), color,
                       signed_mib1(static_cast<std::int64_t>(b0)), signed_mib1(static_cast<std::int64_t>(b1)), c);
    const double o = i < ooms.size() ? ooms[i].get<double>() : 0;
    if (o > 0) {
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#6e1016\"><title>{} OOM(s): lower bounds</title></rect>\n",
                         X(b0) + 0.5, Y(o), std::max(1.0, X(b1) - X(b0) - 1), Y(0) - Y(o), o);
    }
  }
  const double xstep = nice_step((x_hi - x_lo) / static_cast<double>(MiB), 6) * static_cast<double>(MiB);
  for (double v = std::ceil(x_lo / xstep) * xstep; v <= x_hi; v += xstep) {
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:.0f}</text>", X(v), H - B + 14, to_mib_d(v));
  }
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">measured - predicted (MiB)</text>\n", (L + W - R) / 2, H - 6);
  // Labels to the left of their line near the right edge.
  auto label_at = [&](double x) {
    return x > W - R - 90 ? fmt::format("x=\"{:.1f}\" text-anchor=\"end\"", x - 3) : fmt::format("x=\"{:.1f}\"", x + 3);
  };
  svg += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#59636e\" stroke-dasharray=\"4 3\"/>"
                     "<text {3} y=\"{4:.1f}\">reserve {5}</text>\n",
                     X(reserve), T, H - B, label_at(X(reserve)), T + 10, mib1(static_cast<std::uint64_t>(reserve)));
  svg += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#ea580c\" stroke-width=\"2\"/>"
                     "<text {3} y=\"{4:.1f}\" style=\"fill:#ea580c\">recommended {5}</text>\n",
                     X(rec), T, H - B, label_at(X(rec)), T + 24, mib1(static_cast<std::uint64_t>(rec)));
  if (get_u64(h, "clamped") > 0) {
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{} case(s) further below in the first bar</text>\n", L + 4, T + 10,
                       get_u64(h, "clamped"));
  }
  svg += fmt::format("<line class=\"axis\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>\n</svg>\n", L, W - R, Y(0), Y(0));
  return svg;
}

std::string matrix_html(const Json& doc) {
  if (!doc.contains("matrix")) return "";
  const Json& m = doc["matrix"];
  std::map<std::pair<std::string, std::string>, bool> known_by_key;
  for (const Json& f : get_arr(doc, "findings")) known_by_key[{get_str(f, "signature"), get_str(f, "policy")}] = get_bool(f, "known");
  std::string out = "<h2 id=\"matrix\">Properties by policy and allocator</h2>\n<table><thead><tr><th>policy</th><th>allocator</th>"
                    "<th class=\"num\">cases</th>";
  for (const Json& p : get_arr(m, "properties")) out += fmt::format("<th>{} {}</th>", xml_escape(get_str(p, "id")), xml_escape(get_str(p, "name")));
  out += "</tr></thead><tbody>\n";
  for (const Json& pol : get_arr(m, "policies")) {
    for (const Json& al : get_arr(m, "allocators")) {
      const Json* cell = nullptr;
      for (const Json& c : get_arr(m, "cells")) {
        if (get_str(c, "policy") == pol.get<std::string>() && get_str(c, "allocator") == al.get<std::string>()) cell = &c;
      }
      const std::uint64_t n = cell ? get_u64(*cell, "cases") : 0;
      out += fmt::format("<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td>", xml_escape(pol.get<std::string>()),
                         xml_escape(al.get<std::string>()), n);
      for (const Json& p : get_arr(m, "properties")) {
        const std::string kind = get_str(p, "kind");
        if (n == 0) {
          out += "<td class=\"cell-skip\">not run</td>";
          continue;
        }
        const std::string pol_name = pol.get<std::string>();
        if (kind == "waste" && (pol_name.rfind("exact", 0) == 0 || pol_name.rfind("comfy:feb2026", 0) == 0 ||
                                pol_name.rfind("comfy:sep2026", 0) == 0)) {
          out += "<td class=\"cell-skip\">not judged</td>";  // class C is the classic offload buffer's
          continue;
        }
        bool knee_findings = false;
        for (const Json& f : get_arr(*cell, "findings")) knee_findings |= get_str(f, "signature").rfind("knee:", 0) == 0;
        if (kind == "knee" && get_u64(*cell, "knee_pairs") == 0 && !knee_findings) {
          out += "<td class=\"cell-skip\">not judged</td>";  // no case of the cell was paired
          continue;
        }
        std::uint64_t fresh = 0, known = 0;
        for (const Json& f : get_arr(*cell, "findings")) {
          const std::string sig = get_str(f, "signature");
          if (sig.rfind(kind + ":", 0) != 0) continue;
          const auto it = known_by_key.find({sig, get_str(f, "policy")});
          (it != known_by_key.end() && it->second ? known : fresh) += get_u64(f, "count");
        }
        if (fresh > 0) {
          out += fmt::format("<td class=\"cell-bad\">fails: {} case(s)</td>", fresh);
        } else if (known > 0) {
          out += fmt::format("<td class=\"cell-known\">known: {} case(s)</td>", known);
        } else {
          out += "<td class=\"cell-ok\">holds</td>";
        }
      }
      out += "</tr>\n";
    }
  }
  return out + "</tbody></table>\n";
}

}  // namespace

std::string html_report(const Json& doc, const std::string& report_dir) {
  const LinkFn link = [&](const std::string& p) { return link_from(p, report_dir); };
  const Json c = doc.value("counts", Json::object());
  const std::string command = doc.contains("run") ? get_str(doc["run"], "command") : "fuzz";
  const std::string verdict = verdict_line(doc);
  const char* vclass = get_u64(c, "new_signatures") > 0 ? "bad" : get_u64(c, "signatures") > 0 ? "known" : "ok";
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  h += fmt::format("<title>vramfuzz {}: {}</title>\n<style>{}</style>\n</head>\n<body>\n", xml_escape(command), xml_escape(verdict), kCss);
  h += fmt::format("<header>\n<h1>vramfuzz {} <span class=\"verdict {}\">{}</span></h1>\n", xml_escape(command), vclass,
                   xml_escape(verdict));
  const Json env = doc.value("environment", Json::object());
  const Json cfg = doc.value("config", Json::object());
  std::string seeds;
  for (const Json& s : get_arr(doc, "seeds")) seeds += (seeds.empty() ? "" : ", ") + std::to_string(s.get<std::uint64_t>());
  h += fmt::format("<p class=\"context\">{} on {} ({}), policy {}, allocator {}, seed {}{}</p>\n<pre>{}</pre>\n</header>\n",
                   xml_escape(doc.contains("run") ? get_str(doc["run"], "timestamp") + " UTC" : ""), xml_escape(get_str(env, "backend")),
                   xml_escape(get_str(env, "device")), xml_escape(get_str(cfg, "policy")), xml_escape(get_str(cfg, "allocator")),
                   xml_escape(seeds), doc.contains("run") && get_bool(doc["run"], "interrupted") ? "; interrupted by a signal" : "",
                   xml_escape(get_str(doc, "command")));
  if (doc.contains("recovered")) {
    h += fmt::format("<p class=\"context\"><b>Recovered</b> from {} after the run was stopped before writing its summary. Not "
                     "recovered:</p>\n<ul>\n",
                     xml_escape(get_str(doc["recovered"], "from")));
    for (const Json& n : get_arr(doc["recovered"], "not_recovered")) h += "<li>" + xml_escape(n.get<std::string>()) + "</li>\n";
    h += "</ul>\n";
  }
  h += "<div class=\"cards\">";
  for (const auto& [label, value] : std::vector<std::pair<std::string, std::string>>{
           {"cases", std::to_string(get_u64(c, "cases"))},
           {"findings", std::to_string(get_u64(c, "findings"))},
           {"signatures", std::to_string(get_u64(c, "signatures"))},
           {"new signatures", std::to_string(get_u64(c, "new_signatures"))},
           {"expected OOMs", std::to_string(get_u64(c, "expected_ooms"))},
           {"errors", std::to_string(get_u64(c, "errors"))},
           {"seconds", fmt::format("{:.1f}", get_num(c, "seconds"))}}) {
    h += fmt::format("<div class=\"card\"><b>{}</b><span>{}</span></div>", xml_escape(value), xml_escape(label));
  }
  h += "</div>\n";

  Table findings = findings_table(doc, link);
  const std::vector<const Json*> ordered = findings_by_severity(doc);  // the table's rows and the sections below
  if (!findings.rows.empty()) {
    // The signature links to its section below.
    for (std::size_t i = 0; i < findings.rows.size() && i < ordered.size(); ++i) {
      if (ordered[i]->contains("case")) findings.links[i][0] = fmt::format("#finding-{}", i + 1);
    }
    h += "<h2 id=\"findings\">Findings</h2>\n" + to_html(findings);
  }
  h += matrix_html(doc);
  if (doc.contains("corpus")) {
    const Json& k = doc["corpus"];
    h += fmt::format("<h2 id=\"corpus\">Regression corpus</h2>\n<p>{} repros replayed from <code>{}</code>: {} still fail, {} no longer reproduce.</p>\n",
                     get_u64(k, "replayed"), xml_escape(get_str(k, "dir")), get_u64(k, "still_fail"), get_u64(k, "no_longer_reproduce"));
    const Table gone = corpus_table(doc);
    if (!gone.rows.empty()) h += to_html(gone);
    const Table unknown = corpus_table(doc, true);
    if (!unknown.rows.empty()) {
      h += fmt::format("<p>{} undetermined (the replay was an error, so neither fixed nor failing):</p>\n", unknown.rows.size()) +
           to_html(unknown);
    }
  }

  std::size_t i = 0;
  for (const Json* fp : ordered) {
    const Json& f = *fp;
    ++i;
    if (!f.contains("case")) continue;
    const Json& cv = f["case"];
    const bool known = get_bool(f, "known"), noise = !known && f.value("noise", false);
    h += fmt::format("<article class=\"finding\" id=\"finding-{}\">\n<h2>{} <span class=\"tag {}\">{}</span></h2>\n<p>policy "
                     "<code>{}</code>: {}</p>\n",
                     i, xml_escape(get_str(f, "signature")), known || noise ? "known" : "bad", known ? "known" : noise ? "noise" : "new",
                     xml_escape(get_str(f, "policy")), xml_escape(corpus_note(doc, f)));
    h += fmt::format("<p><b>{}</b></p>\n<p>{}</p>\n", xml_escape(get_str(cv, "title")),
                     xml_escape(cv.contains("verdict") ? get_str(cv["verdict"], "message") : ""));
    std::string rel = "-";
    if (f.contains("reliability")) {
      rel = fmt::format("reproduced {} of {} runs{}", get_u64(f["reliability"], "reproduced"), get_u64(f["reliability"], "runs"),
                        get_bool(f, "flaky") ? " (flaky)" : "");
    }
    h += fmt::format("<p>{} case(s), worst overshoot {}; {}; repro: <a href=\"{}\">{}</a> ({}); replay from the folder "
                     "of this report:</p>\n<pre>{}</pre>\n",
                     get_u64(f, "count"), signed_mib1(get_i64(f, "worst_overshoot")), rel, xml_escape(link(get_str(f, "repro"))),
                     xml_escape(link(get_str(f, "repro"))), xml_escape(repro_size(f)),
                     xml_escape(replay_command(get_str(f, "repro"), get_str(f, "file"), report_dir)));
    h += case_html(cv, fmt::format("timeline-{}", i));
    h += "</article>\n";
  }

  if (doc.contains("calibrate")) {
    const Json& cal = doc["calibrate"];
    h += fmt::format("<h2 id=\"calibrate\">Calibration: {}</h2>\n<p>Per allocator mode, measured - predicted at each case's worst checked "
                     "stage (OOMs as lower bounds, dark red). Green: under the prediction; blue: covered by the current reserve; "
                     "red: over it. Margin {}.</p>\n",
                     xml_escape(get_str(cal, "policy")), mib1(get_u64(cal, "margin")));
    h += to_html(calibrate_mode_table(doc));
    for (const Json& m : get_arr(cal, "modes")) {
      h += fmt::format("<h3>{}: need {}, recommended {}</h3>\n", xml_escape(get_str(m, "allocator")), mib1(get_u64(m, "need")),
                       mib1(get_u64(m, "recommended")));
      h += histogram_svg(m);
      if (m.contains("worst")) {
        const Json& w = m["worst"];
        h += fmt::format("<p>Worst case: case {} ({}{}), <a href=\"{}\">{}</a></p>\n", get_u64(w, "case_index"),
                         signed_mib1(get_i64(w, "delta")), get_bool(w, "oom") ? ", an OOM: at least" : "",
                         xml_escape(link(get_str(w, "file"))), xml_escape(get_str(w, "file")));
        if (w.contains("case")) {
          h += "<details><summary>Its shrunk repro</summary>\n" +
               case_html(w["case"], "worst-" + get_str(m, "allocator")) + "</details>\n";
        }
      }
    }
    h += "<details><summary>Per workload class</summary>\n" + to_html(calibrate_class_table(doc, false)) + "</details>\n";
  }
  h += fmt::format("<footer>{} &middot; {} &middot; host {}</footer>\n", xml_escape(get_str(doc, "tool")),
                   xml_escape(get_str(doc, "schema")), xml_escape(doc.contains("run") ? get_str(doc["run"], "hostname") : ""));
  h += fmt::format("<script>{}</script>\n</body>\n</html>\n", kJs);
  return h;
}

}  // namespace vf::report

#include "reports/tables.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "reports/json_util.h"
#include "reports/render.h"

namespace vf::report {

std::string reserve_arg(std::uint64_t bytes) { return fmt::format("{}MiB", bytes / MiB + (bytes % MiB != 0 ? 1 : 0)); }
std::string mib1(std::uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / static_cast<double>(MiB)); }
std::string signed_mib1(std::int64_t bytes) {
  return fmt::format("{:+.1f} MiB", static_cast<double>(bytes) / static_cast<double>(MiB));
}

std::string to_text(const Table& t) {
  std::vector<std::size_t> width(t.headers.size(), 0);
  for (std::size_t c = 0; c < t.headers.size(); ++c) width[c] = t.headers[c].size();
  for (const auto& row : t.rows) {
    for (std::size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t c = 0; c < width.size(); ++c) {
      const std::string& v = c < cells.size() ? cells[c] : std::string();
      const bool right = c < t.right.size() && t.right[c];
      const std::string pad(width[c] - std::min(width[c], v.size()), ' ');
      out += (c ? "  " : "") + (right ? pad + v : (c + 1 == width.size() ? v : v + pad));
    }
    return out + "\n";
  };
  std::string out = line(t.headers);
  for (const auto& row : t.rows) out += line(row);
  return out;
}

std::string md_escape(std::string_view text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') {
      out += "\\|";
    } else if (ch == '\n') {
      out += ' ';
    } else {
      out += ch;
    }
  }
  return out;
}

std::string to_markdown(const Table& t) {
  std::string out = "|";
  for (const std::string& h : t.headers) out += " " + md_escape(h) + " |";
  out += "\n|";
  for (std::size_t c = 0; c < t.headers.size(); ++c) out += c < t.right.size() && t.right[c] ? "---:|" : "---|";
  out += "\n";
  for (std::size_t r = 0; r < t.rows.size(); ++r) {
    out += "|";
    for (std::size_t c = 0; c < t.rows[r].size(); ++c) {
      const std::string link = r < t.links.size() && c < t.links[r].size() ? t.links[r][c] : "";
      const std::string cell = md_escape(t.rows[r][c]);
      out += " " + (link.empty() ? cell : fmt::format("[{}]({})", cell, link)) + " |";
    }
    out += "\n";
  }
  return out;
}

std::string to_html(const Table& t, const std::string& css_class) {
  std::string out = css_class.empty() ? "<table>\n<thead><tr>" : fmt::format("<table class=\"{}\">\n<thead><tr>", css_class);
  for (std::size_t c = 0; c < t.headers.size(); ++c) {
    out += fmt::format("<th{}>{}</th>", c < t.right.size() && t.right[c] ? " class=\"num\"" : "", xml_escape(t.headers[c]));
  }
  out += "</tr></thead>\n<tbody>\n";
  for (std::size_t r = 0; r < t.rows.size(); ++r) {
    out += "<tr>";
    for (std::size_t c = 0; c < t.rows[r].size(); ++c) {
      const std::string link = r < t.links.size() && c < t.links[r].size() ? t.links[r][c] : "";
      const std::string cell = xml_escape(t.rows[r][c]);
      out += fmt::format("<td{}>{}</td>", c < t.right.size() && t.right[c] ? " class=\"num\"" : "",
                         link.empty() ? cell : fmt::format("<a href=\"{}\">{}</a>", xml_escape(link), cell));
    }
    out += "</tr>\n";
  }
  return out + "</tbody>\n</table>\n";
}

std::string corpus_note(const Json& doc, const Json& f) {
  const std::string dir = doc.contains("corpus") ? get_str(doc["corpus"], "dir") : "";
  auto short_name = [&](const std::string& file) {
    const std::string rel = dir.empty() ? "" : std::filesystem::path(file).lexically_normal().lexically_relative(
                                                   std::filesystem::path(dir).lexically_normal()).string();
    return rel.empty() || rel.rfind("..", 0) == 0 ? file : rel;
  };
  if (get_bool(f, "known")) {
    std::string by;
    for (const Json& file : get_arr(f, "known_by")) by += (by.empty() ? "" : ", ") + short_name(file.get<std::string>());
    return by.empty() ? "known" : fmt::format("known ({})", by);
  }
  if (f.value("noise", false)) {
    const std::uint64_t min = doc.contains("config") && doc["config"].contains("min_overshoot") && doc["config"]["min_overshoot"].is_number()
                                  ? doc["config"]["min_overshoot"].get<std::uint64_t>()
                                  : 0;
    return min ? fmt::format("noise: below --min-overshoot {}", format_mib(min)) : "noise: below --min-overshoot";
  }
  std::string others;
  for (const Json& p : get_arr(f, "corpus_other_policies")) others += (others.empty() ? "" : "; ") + p.get<std::string>();
  return others.empty() ? "new" : fmt::format("new; the corpus has it under {}", others);
}

std::vector<const Json*> findings_by_severity(const Json& doc) {
  // New before known, then the overshoot as a share of its device, then bytes.
  std::vector<const Json*> order;
  for (const Json& f : get_arr(doc, "findings")) order.push_back(&f);
  std::stable_sort(order.begin(), order.end(), [](const Json* a, const Json* b) {
    const bool new_a = !get_bool(*a, "known") && !a->value("noise", false), new_b = !get_bool(*b, "known") && !b->value("noise", false);
    if (new_a != new_b) return new_a;
    const double sa = a->value("severity", 0.0), sb = b->value("severity", 0.0);
    if (sa != sb) return sa > sb;
    return get_i64(*a, "worst_overshoot") > get_i64(*b, "worst_overshoot");
  });
  return order;
}

std::string repro_size(const Json& f) {
  const std::uint64_t modules = get_u64(f, "repro_modules");
  const std::uint64_t repeats = f.contains("repro_repeats") ? get_u64(f, "repro_repeats") : 0;
  std::string out = fmt::format("{} module{}", modules, modules == 1 ? "" : "s");
  if (repeats > 0) out += fmt::format(", {} of them repeats", repeats);
  return out;
}

Table findings_table(const Json& doc, const LinkFn& link) {
  Table t;
  t.headers = {"signature", "why", "policy", "count", "worst overshoot", "of device", "repro", "reliability", "corpus"};
  t.right = {false, false, false, true, true, true, false, false, false};
  for (const Json* fp : findings_by_severity(doc)) {
    const Json& f = *fp;
    const std::string repro = get_str(f, "repro");
    const std::string file = get_str(f, "file");
    std::string repro_cell, target;
    if (!repro.empty()) {
      target = link(repro);
      repro_cell = fmt::format("{} ({})", target, repro_size(f));
    } else if (!file.empty()) {
      target = link(file);
      repro_cell = target + " (not shrunk)";
    } else {
      repro_cell = fmt::format("case seed {:#x}", get_u64(f, "first_case_seed"));
    }
    std::string reliability;
    if (f.contains("reliability")) {
      reliability = fmt::format("{}/{}{}", get_u64(f["reliability"], "reproduced"), get_u64(f["reliability"], "runs"),
                                get_bool(f, "flaky") ? " flaky" : "");
    } else {
      reliability = "-";
    }
    const std::string share = f.contains("severity") ? fmt::format("{:.2f}%", f.value("severity", 0.0) * 100.0) : "-";
    t.rows.push_back({get_str(f, "signature"), f.contains("why") ? get_str(f, "why") : "-", get_str(f, "policy"),
                      std::to_string(get_u64(f, "count")),
                      // A waste finding's bytes are the offload buffer it left unused, not an overshoot.
                      get_str(f, "signature").rfind("waste:", 0) == 0 ? format_mib(static_cast<Bytes>(std::max<std::int64_t>(0, get_i64(f, "worst_overshoot")))) + " unused"
                                                                      : signed_mib1(get_i64(f, "worst_overshoot")),
                      share, repro_cell, reliability,
                      corpus_note(doc, f)});
    t.links.push_back({"", "", "", "", "", "", target, "", ""});
  }
  return t;
}

Table corpus_table(const Json& doc, bool undetermined) {
  Table t;
  t.headers = {"repro", "recorded signature", "policy", "now"};
  t.right = {false, false, false, false};
  if (!doc.contains("corpus")) return t;
  for (const Json& e : get_arr(doc["corpus"], "entries")) {
    if (get_bool(e, "still_fails") || e.value("undetermined", false) != undetermined) continue;
    t.rows.push_back({get_str(e, "file"), get_str(e, "signature"), get_str(e, "policy"), get_str(e, "verdict")});
  }
  return t;
}

namespace {

std::string pct(double share) { return fmt::format("{:.2f}%", share * 100.0); }

}  // namespace

Table calibrate_mode_table(const Json& doc) {
  Table t;
  t.headers = {"allocator", "cases", "OOMs", "p50", "p90", "p99", "max", "need", "verified at", "recommended", "reserve",
               "violations", "median slack", "slack/device"};
  t.right = {false, true, true, true, true, true, true, true, true, true, true, true, true, true};
  if (!doc.contains("calibrate")) return t;
  for (const Json& m : get_arr(doc["calibrate"], "modes")) {
    std::string verified = "-";
    const bool unverified = get_str(m, "verification") == "not verified";
    if (unverified) verified = "not verified";
    if (m.contains("verified_need") && !m["verified_need"].is_null()) {
      verified = mib1(get_u64(m, "verified_need")) + (get_bool(m, "verified") ? "" : " (not held)");
      if (get_u64(m, "verify_ooms") > 0) verified += fmt::format(" ({} OOM)", get_u64(m, "verify_ooms"));
    }
    t.rows.push_back({get_str(m, "allocator"), std::to_string(get_u64(m, "cases")), std::to_string(get_u64(m, "ooms")),
                      signed_mib1(get_i64(m, "p50")), signed_mib1(get_i64(m, "p90")), signed_mib1(get_i64(m, "p99")),
                      signed_mib1(get_i64(m, "max")), mib1(get_u64(m, "need")), verified,
                      reserve_arg(get_u64(m, "recommended")) + (unverified ? " (unverified)" : ""),
                      mib1(get_u64(m, "reserve")), std::to_string(get_u64(m, "violations")),
                      signed_mib1(get_i64(m, "slack_median")), pct(get_num(m, "slack_share"))});
  }
  return t;
}

Table calibrate_class_table(const Json& doc, bool only_needing) {
  Table t;
  t.headers = {"allocator", "workload (storage->compute, placement, pixels)", "cases", "OOMs", "excluded", "p50", "p90",
               "max", "need", "recommended", "violations"};
  t.right = {false, false, true, true, true, true, true, true, true, true, true};
  if (!doc.contains("calibrate")) return t;
  // Per mode, the classes that need the most first.
  std::vector<std::pair<std::size_t, const Json*>> rows;  // (mode order, row)
  std::vector<std::string> order;
  for (const Json& c : get_arr(doc["calibrate"], "classes")) {
    if (only_needing && get_u64(c, "need") == 0 && get_u64(c, "ooms") == 0) continue;
    const std::string mode = get_str(c, "allocator");
    auto it = std::find(order.begin(), order.end(), mode);
    if (it == order.end()) it = order.insert(order.end(), mode);
    rows.emplace_back(static_cast<std::size_t>(it - order.begin()), &c);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    return get_u64(*a.second, "need") > get_u64(*b.second, "need");
  });
  for (const auto& [mode_index, c] : rows) {
    t.rows.push_back({get_str(*c, "allocator"), get_str(*c, "workload"), std::to_string(get_u64(*c, "cases")),
                      std::to_string(get_u64(*c, "ooms")),
                      std::to_string(get_u64(*c, "expected_ooms") + get_u64(*c, "errors")), signed_mib1(get_i64(*c, "p50")),
                      signed_mib1(get_i64(*c, "p90")), signed_mib1(get_i64(*c, "max")), mib1(get_u64(*c, "need")),
                      reserve_arg(get_u64(*c, "recommended")), std::to_string(get_u64(*c, "violations"))});
  }
  return t;
}

}  // namespace vf::report

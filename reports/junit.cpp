// JUnit XML in the shape CI tools accept (Jenkins' junit-10.xsd, GitLab, GitHub test reporters):
// testsuites > testsuite (one per policy) > testcase (one per property x allocator mode). A
// property fails in a cell when a new signature of its kind was found there; CI tools show only
// the failure's `message`, so it carries signature, overshoot, seed and replay command, and the
// body adds the repro paths. Known findings (in the regression corpus with the same signature
// under the same policy key) are `skipped`, as the exit code ignores them; a cell no case reached
// is `skipped` too; backend faults are `error`s. Replay commands and paths are written from the
// folder junit.xml is in, and say so.
#include <map>

#include <fmt/format.h>

#include "reports/json_util.h"
#include "reports/render.h"

namespace vf::report {

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        // XML 1.0 has no place for other control characters.
        if (static_cast<unsigned char>(ch) >= 0x20 || ch == '\n' || ch == '\t' || ch == '\r') out += ch;
        break;
    }
  }
  return out;
}

namespace {

// What a finding's bytes are: an overshoot, or (waste) the offload buffer left unused.
std::string_view overshoot_word(const std::string& signature) { return signature.rfind("waste:", 0) == 0 ? "unused buffer" : "overshoot"; }

struct Testcase {
  std::string name, classname;
  double time = 0;
  std::string failure_message, failure_type, failure_body;
  std::string skipped_message;
  std::string error_message;
};

std::string fmt_time(double seconds) { return fmt::format("{:.3f}", seconds < 0 ? 0.0 : seconds); }

}  // namespace

std::string junit_xml(const Json& doc, const std::string& report_dir) {
  const Json& matrix = doc.contains("matrix") ? doc["matrix"] : Json::object();
  const Json counts = doc.value("counts", Json::object());
  const double seconds = get_num(counts, "seconds");
  const std::uint64_t total_cases = std::max<std::uint64_t>(1, get_u64(counts, "cases"));
  const std::string timestamp = doc.contains("run") ? get_str(doc["run"], "timestamp") : "";
  const std::string hostname = doc.contains("run") ? get_str(doc["run"], "hostname") : "";
  const std::string run_command = doc.contains("run") ? get_str(doc["run"], "command") : "fuzz";

  // Repro, finding file and known-ness per signature and policy key, for the failure bodies and
  // replay commands.
  std::map<std::pair<std::string, std::string>, Json> by_key;
  for (const Json& f : get_arr(doc, "findings")) by_key[{get_str(f, "signature"), get_str(f, "policy")}] = f;

  std::string suites;
  std::uint64_t all_tests = 0, all_failures = 0, all_errors = 0;
  for (const Json& policy_j : get_arr(matrix, "policies")) {
    const std::string policy = policy_j.get<std::string>();
    std::vector<Testcase> cases;
    for (const Json& alloc_j : get_arr(matrix, "allocators")) {
      const std::string alloc = alloc_j.get<std::string>();
      const Json* cell = nullptr;
      for (const Json& c : get_arr(matrix, "cells")) {
        if (get_str(c, "policy") == policy && get_str(c, "allocator") == alloc) cell = &c;
      }
      const std::uint64_t n = cell ? get_u64(*cell, "cases") : 0;
      for (const Json& prop : get_arr(matrix, "properties")) {
        Testcase tc;
        tc.name = fmt::format("{} {} [{}]", get_str(prop, "id"), get_str(prop, "name"), alloc);
        tc.classname = fmt::format("vramfuzz.{}.{}", policy, alloc);
        tc.time = seconds * static_cast<double>(n) / static_cast<double>(total_cases) /
                  static_cast<double>(get_arr(matrix, "properties").size());
        if (n == 0) {
          const bool dynamic = policy.rfind("comfy:feb2026", 0) == 0 || policy.rfind("comfy:sep2026", 0) == 0;
          if (dynamic && alloc == "caching-expandable") {
            tc.skipped_message = "dynamic VRAM cannot run with expandable segments: ComfyUI removes expandable_segments:True";
          } else if (policy.rfind("comfy:feb2026", 0) == 0 && alloc != "async") {
            tc.skipped_message = "comfy:feb2026 is modelled with cudaMallocAsync only";
          } else {
            tc.skipped_message = fmt::format("no case of this campaign ran {} with {}", policy, alloc);
          }
          cases.push_back(std::move(tc));
          continue;
        }
        const std::string kind = get_str(prop, "kind");
        const bool dynamic_policy = policy.rfind("comfy:feb2026", 0) == 0 || policy.rfind("comfy:sep2026", 0) == 0;
        if (kind == "waste" && (policy.rfind("exact", 0) == 0 || dynamic_policy)) {
          tc.skipped_message = "not judged: waste (class C) is judged for ComfyUI's classic offload buffer only";
          cases.push_back(std::move(tc));
          continue;
        }
        // P4 is judged on the pairs: a cell with none (calibrate, --knee-every 0) is not judged,
        // unless it has knee findings (a summary rebuilt after a kill does not know its pairs).
        bool knee_findings = false;
        for (const Json& f : get_arr(*cell, "findings")) knee_findings |= get_str(f, "signature").rfind("knee:", 0) == 0;
        if (kind == "knee" && get_u64(*cell, "knee_pairs") == 0 && !knee_findings) {
          tc.skipped_message = "not judged: no passing case of this cell was run again a step smaller (fuzz --knee-every K, K > 0)";
          cases.push_back(std::move(tc));
          continue;
        }
        std::vector<std::string> fresh, known, noisy;
        std::string body;
        std::uint64_t fresh_count = 0;
        for (const Json& f : get_arr(*cell, "findings")) {
          const std::string sig = get_str(f, "signature");
          if (sig.rfind(kind + ":", 0) != 0) continue;
          const std::pair<std::string, std::string> key{sig, get_str(f, "policy")};
          const Json& g = by_key.count(key) ? by_key[key] : f;
          const std::string replay = replay_command(get_str(g, "repro"), get_str(g, "file"), report_dir);
          const std::string under = key.second.empty() ? "" : ", policy " + key.second;
          if (g.value("noise", false) && !get_bool(g, "known")) {
            noisy.push_back(fmt::format("{} x{}: {} {}, seed {:#x}{}, within the allocator's rounding noise (below --min-overshoot)",
                                        sig, get_u64(f, "count"), overshoot_word(sig), format_signed_mib(get_i64(f, "worst_overshoot")),
                                        get_u64(f, "first_case_seed"), under));
            continue;
          }
          if (get_bool(g, "known")) {
            std::string by;
            for (const Json& file : get_arr(g, "known_by")) by += (by.empty() ? "" : ", ") + file.get<std::string>();
            known.push_back(fmt::format("{} x{}: {} {}, seed {:#x}{}{}", sig, get_u64(f, "count"), overshoot_word(sig),
                                        format_signed_mib(get_i64(f, "worst_overshoot")), get_u64(f, "first_case_seed"), under,
                                        by.empty() ? "" : ", known by " + by));
            continue;
          }
          std::string elsewhere;  // the corpus has the signature, but under another policy
          for (const Json& p : get_arr(g, "corpus_other_policies")) elsewhere += (elsewhere.empty() ? "" : "; ") + p.get<std::string>();
          // The cause before the replay command, which runs to the end of the line (pasted as it is).
          const std::string why = g.contains("why") ? "; why: " + get_str(g, "why") + ";" : std::string(",");
          const std::string line =
              fmt::format("{} x{}: {} {}, seed {:#x}{}{}{}{}", sig, get_u64(f, "count"), overshoot_word(sig),
                          format_signed_mib(get_i64(f, "worst_overshoot")), get_u64(f, "first_case_seed"), under,
                          elsewhere.empty() ? "" : " (new under this policy; the corpus has it under " + elsewhere + ")", why,
                          replay.empty() ? fmt::format(" replay: {} (case seed {:#x})", get_str(doc, "command"), get_u64(f, "first_case_seed"))
                                         : " replay from the folder of junit.xml: " + replay);
          fresh.push_back(line);
          fresh_count += get_u64(f, "count");
          // Paths from the folder of junit.xml, as the replay command.
          body += fmt::format("{}{}\n  repro: {}\n  finding: {}\n  {}\n", sig, under,
                              get_str(g, "repro").empty() ? "(not shrunk)" : link_from(get_str(g, "repro"), report_dir),
                              get_str(g, "file").empty() ? "(not written: no --out)" : link_from(get_str(g, "file"), report_dir),
                              replay.empty() ? "rerun the campaign: " + get_str(doc, "command")
                                             : "replay (from the folder of junit.xml): " + replay);
          if (g.contains("case")) body += fmt::format("  {}\n", get_str(g["case"], "title"));
        }
        if (!fresh.empty()) {
          std::string msg;
          for (const std::string& l : fresh) msg += (msg.empty() ? "" : "; ") + l;
          tc.failure_message = fresh.size() == 1 ? msg : fmt::format("{} new signatures: {}", fresh.size(), msg);
          tc.failure_type = kind;
          const std::uint64_t pairs = get_u64(*cell, "knee_pairs");
          tc.failure_body = kind == "knee" && pairs > 0
                                ? fmt::format("{} of {} pairs ({} with {}) broke {}:\n{}", fresh_count, pairs, policy, alloc, get_str(prop, "name"), body)
                                : fmt::format("{} of {} cases ({} with {}) broke {}:\n{}", fresh_count, n, policy, alloc, get_str(prop, "name"), body);
        } else if (!known.empty() || !noisy.empty()) {
          std::string msg;
          for (const std::string& l : known) msg += (msg.empty() ? "" : "; ") + l;
          if (!msg.empty()) msg = "known (in the regression corpus under the same policy): " + msg;
          std::string noise;
          for (const std::string& l : noisy) noise += (noise.empty() ? "" : "; ") + l;
          if (!noise.empty()) msg += (msg.empty() ? "noise: " : "; noise: ") + noise;
          tc.skipped_message = msg;
        }
        if (get_u64(*cell, "errors") > 0) {
          tc.error_message = fmt::format("{} of {} cases ended in an error (backend or predictor): the property was not checked for them",
                                         get_u64(*cell, "errors"), n);
        }
        cases.push_back(std::move(tc));
      }
    }
    std::uint64_t failures = 0, errors = 0, skipped = 0;
    double time = 0;
    std::string body;
    for (const Testcase& tc : cases) {
      // One outcome element per testcase (failure, else error, else skipped): CI reporters read
      // the first child and compute passed = tests - failures - errors - skipped, so a testcase
      // carrying two would be counted twice. Backend errors next to a failure go into its text.
      const bool failed = !tc.failure_message.empty();
      const bool errored = !failed && !tc.error_message.empty();
      failures += failed ? 1 : 0;
      errors += errored ? 1 : 0;
      skipped += !failed && !errored && !tc.skipped_message.empty() ? 1 : 0;
      time += tc.time;
      body += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"{}\"", xml_escape(tc.classname), xml_escape(tc.name),
                          fmt_time(tc.time));
      if (tc.failure_message.empty() && tc.skipped_message.empty() && tc.error_message.empty()) {
        body += "/>\n";
        continue;
      }
      body += ">\n";
      if (failed) {
        const std::string text = tc.error_message.empty() ? tc.failure_body : tc.failure_body + "\nalso: " + tc.error_message;
        body += fmt::format("      <failure message=\"{}\" type=\"{}\">{}</failure>\n", xml_escape(tc.failure_message),
                            xml_escape(tc.failure_type), xml_escape(text));
      } else if (errored) {
        body += fmt::format("      <error message=\"{}\" type=\"backend-error\"/>\n", xml_escape(tc.error_message));
      } else {
        body += fmt::format("      <skipped message=\"{}\"/>\n", xml_escape(tc.skipped_message));
      }
      body += "    </testcase>\n";
    }
    all_tests += cases.size();
    all_failures += failures;
    all_errors += errors;
    std::string props = "    <properties>\n";
    const Json env = doc.value("environment", Json::object());
    for (const auto& [k, v] : std::map<std::string, std::string>{
             {"command", get_str(doc, "command")},
             {"backend", get_str(env, "backend")},
             {"device", get_str(env, "device")},
             {"tool", get_str(doc, "tool")},
             {"seeds", doc.contains("seeds") ? doc["seeds"].dump() : "[]"},
             {"shard", doc.contains("config") ? get_str(doc["config"], "shard") : ""}}) {
      props += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", xml_escape(k), xml_escape(v));
    }
    props += "    </properties>\n";
    suites += fmt::format(
        "  <testsuite name=\"vramfuzz {} {}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{}\" "
        "timestamp=\"{}\" hostname=\"{}\">\n{}{}  </testsuite>\n",
        xml_escape(run_command), xml_escape(policy), cases.size(), failures, errors, skipped, fmt_time(time),
        xml_escape(timestamp.empty() ? "1970-01-01T00:00:00" : timestamp), xml_escape(hostname.empty() ? "localhost" : hostname),
        props, body);
  }
  return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"vramfuzz\" tests=\"{}\" failures=\"{}\" "
                     "errors=\"{}\" time=\"{}\">\n{}</testsuites>\n",
                     all_tests, all_failures, all_errors, fmt_time(seconds), suites);
}

}  // namespace vf::report

#include "reports/recover.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "harness/case_file.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/core/json_schema.h"
#include "harness/repro.h"
#include "reports/json_util.h"
#include "reports/summary_schema.h"

namespace vf::report {

namespace fs = std::filesystem;

std::string run_marker_json(const CampaignConfig& cfg, const RunInfo& info) {
  Json j;
  j["schema"] = kRunSchema;
  j["tool"] = tool_version();
  j["command"] = info.command;
  j["command_line"] = info.command_line;
  j["config"] = campaign_config(cfg, info.backend);
  j["keep"] = cfg.keep_per_signature;
  j["shrink"] = cfg.shrink;
  j["started"] = info.timestamp;
  j["hostname"] = info.hostname;
  j["pid"] = static_cast<std::uint64_t>(::getpid());
  return j.dump(2) + "\n";
}

namespace {

using nlohmann::json;

std::vector<std::pair<std::string, std::string>> pairs_of(const json& list) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const json& kv : list) {
    const std::string& s = kv.get_ref<const std::string&>();
    const std::size_t eq = s.find('=');
    out.emplace_back(s.substr(0, eq), eq == std::string::npos ? "" : s.substr(eq + 1));
  }
  return out;
}

// The campaign as run.json records it (checked: a damaged marker is bad input naming the field).
struct Marker {
  CampaignConfig cfg;
  RunInfo info;
};

Marker read_marker(const std::string& dir) {
  using namespace vf::schema;
  const std::string path = (fs::path(dir) / "run.json").string();
  const json doc = parse_json_text(read_text_file(path), path);
  object({req("schema", one_of({std::string(kRunSchema)})), req("tool", str()), req("command", one_of({"fuzz"})),
          req("command_line", str()), req("config", campaign_config_check()), req("keep", u64_in(0, 0xffffffffu)),
          req("shrink", boolean()), req("started", str()), req("hostname", str()), req("pid", u64())})(JsonIn(doc, path));
  const json& c = doc["config"];
  Marker m;
  CampaignConfig& cfg = m.cfg;
  const JsonIn cj(c, path + ".config");
  const auto has = [&](const char* k) { return c.contains(k); };
  cfg.seed = c["seed"].get<std::uint64_t>();
  if (has("cases")) cfg.cases = c["cases"].get<std::uint64_t>();
  if (has("seconds")) cfg.seconds = c["seconds"].get<double>();
  if (has("policy") && c["policy"] != "drawn") {
    // An external predictor's label is kept as written: recovery reads the file, it never starts
    // the predictor (exec:NAME is a name from a hello, not a command to run).
    const std::string text = c["policy"].get<std::string>();
    if (text.starts_with("exec:")) {
      if (text.size() == 5) throw InputError(cj.path() + ".policy", "exec: without a predictor name");
      cfg.gen.policy = text;
    } else {
      cfg.gen.policy = parse_policy(text, cj.path() + ".policy", StartCommand::refuse).label();
    }
  }
  if (has("overrides")) cfg.gen.policy_overrides = pairs_of(c["overrides"]);
  if (has("allocator") && c["allocator"] != "drawn") {
    cfg.gen.allocator = parse_allocator_mode_field(c["allocator"].get<std::string>(), cj.path() + ".allocator");
  }
  if (has("allocator_options")) cfg.gen.allocator_options = pairs_of(c["allocator_options"]);
  if (has("vram") && c["vram"].is_number()) cfg.gen.vram = c["vram"].get<std::uint64_t>();
  if (has("model") && !c["model"].get_ref<const std::string&>().empty()) {
    auto spec = std::make_shared<ModelSpec>();
    spec->name = c["model"].get<std::string>();
    cfg.gen.model = std::move(spec);
  }
  if (has("shard")) {
    const std::string shard = c["shard"].get<std::string>();
    const std::size_t slash = shard.find('/');
    cfg.shard_index = static_cast<std::uint32_t>(std::stoul(shard.substr(0, slash)));
    cfg.shard_count = static_cast<std::uint32_t>(std::stoul(shard.substr(slash + 1)));
  }
  if (has("corpus")) cfg.corpus_dir = c["corpus"].get<std::string>();
  if (has("min_overshoot")) cfg.min_overshoot = c["min_overshoot"].get<std::uint64_t>();
  if (has("activations")) cfg.activations = c["activations"].get<std::string>();
  if (has("knee_every")) cfg.knee_every = c["knee_every"].get<std::uint32_t>();
  cfg.out_dir = dir;  // where it is now: the paths below start with it
  cfg.command_line = doc["command_line"].get<std::string>();
  cfg.keep_per_signature = doc["keep"].get<std::uint32_t>();
  cfg.shrink = doc["shrink"].get<bool>();
  m.info = run_info("fuzz", cfg.command_line, has("backend") ? c["backend"].get<std::string>() : "sim", dir);
  m.info.hostname = doc["hostname"].get<std::string>();
  m.info.timestamp = doc["started"].get<std::string>();
  return m;
}

// The corpus's repros by finding key, read (not replayed): a finding is known when one of them
// has its signature under its policy key, as in the campaign.
struct CorpusIndex {
  std::map<FindingKey, std::vector<std::string>> by_key;
  std::map<std::string, std::set<std::string>> policies_by_signature;
};

CorpusIndex index_corpus(const std::string& dir, Catalog& catalog) {
  CorpusIndex idx;
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) {
    const json doc = parse_json_text(read_text_file(f), f);
    const bool repro_like = doc.is_object() && doc.contains("schema") && doc["schema"].is_string() &&
                            (doc["schema"].get_ref<const std::string&>().rfind("vramfuzz.repro/", 0) == 0 ||
                             doc["schema"].get_ref<const std::string&>().rfind("vramfuzz.finding/", 0) == 0);
    if (!repro_like) continue;
    try {
      (void)check_case_document(doc);
      const Scenario s = load_case_file(f, catalog);
      const FindingKey key{doc["signature"].get<std::string>(), s.policy.key()};
      idx.by_key[key].push_back(f);
      idx.policies_by_signature[key.signature].insert(key.policy);
    } catch (const InputError& e) {
      throw InputError(f, e.what());
    }
  }
  return idx;
}

struct FoundFile {
  std::string file;
  FindingKey key;
  std::string policy_label, allocator;
  std::uint64_t case_index = 0, case_seed = 0;
  std::int64_t overshoot = 0;
  std::string device;
  Bytes device_total = 0;
  std::string cause;
  bool activation_dependent = false;
  // A knee whose smaller half did not merely exceed its prediction (and, not knowing, any knee
  // whose file does not say): never noise.
  bool knee_of_oom = true;
};

}  // namespace

Recovered recover_campaign(const std::string& dir) {
  Recovered out;
  std::vector<std::string>& notes = out.not_recovered;
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / "run.json", ec)) {
    throw InputError(dir, "has no summary.json and no run.json: not the output of a `vramfuzz fuzz --out` run that can be recovered "
                          "(a calibration's samples are not on disk; a --devices run keeps one run.json per OUT/shard-N: recover "
                          "each, then `vramfuzz merge`)");
  }
  Marker m = read_marker(dir);
  CampaignConfig& cfg = m.cfg;
  Catalog catalog;
  SimBackend sim;

  // Every finding file, by key. A file cut short by the kill is a temporary (written atomically:
  // a temporary, then a rename) and is not a finding.
  std::vector<FoundFile> found;
  std::vector<std::string> folders;
  const fs::path findings_dir = fs::path(dir) / "findings";
  for (const auto& pol : fs::directory_iterator(findings_dir, ec)) {
    if (!pol.is_directory()) continue;
    for (const auto& sig : fs::directory_iterator(pol.path(), ec)) {
      if (sig.is_directory()) folders.push_back(sig.path().string());
    }
  }
  std::sort(folders.begin(), folders.end());
  std::map<std::string, std::string> folder_of;  // finding key (signature + policy) -> its folder
  for (const std::string& folder : folders) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(folder, ec)) {
      const std::string name = e.path().filename().string();
      if (name.find(".tmp.") != std::string::npos) {
        notes.push_back(fmt::format("{}: a file being written when the run stopped (left as it is)", e.path().string()));
        continue;
      }
      if (e.is_regular_file() && name.rfind("case-", 0) == 0 && e.path().extension() == ".json") files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      try {
        const json doc = parse_json_text(read_text_file(f), f);
        if (check_case_document(doc) != CaseDocKind::finding) throw InputError(f, "not a vramfuzz.finding/1 file");
        const Scenario s = load_case_file(f, catalog);
        FoundFile x;
        x.file = f;
        x.key = {doc["signature"].get<std::string>(), s.policy.key()};
        x.policy_label = s.policy.label();
        x.allocator = std::string(allocator_mode_name(s.allocator.mode));
        x.case_index = doc.value("case_index", std::uint64_t{0});
        x.case_seed = doc.value("case_seed", std::uint64_t{0});
        if (doc.contains("verdict")) {
          x.overshoot = doc["verdict"].value("overshoot", std::int64_t{0});
          if (doc["verdict"].contains("knee_small")) {
            x.knee_of_oom = doc["verdict"].value("knee_small", std::string()).rfind("violation:", 0) != 0;
          }
          x.cause = doc["verdict"].value("cause", "");
          x.activation_dependent = doc["verdict"].value("activation_dependent", false);
        }
        x.device_total = s.device.total;
        if (doc.contains("environment")) x.device = doc["environment"].value("device", "");
        folder_of[x.key.signature + "\n" + x.key.policy] = folder;
        found.push_back(std::move(x));
      } catch (const InputError& e) {
        notes.push_back(fmt::format("{}: damaged, left out ({})", f, e.what()));
      }
    }
  }

  CorpusIndex corpus;
  if (!cfg.corpus_dir.empty()) {
    if (fs::is_directory(cfg.corpus_dir, ec)) {
      corpus = index_corpus(cfg.corpus_dir, catalog);
    } else {
      notes.push_back(fmt::format("the corpus {} is not there (from here): every finding counts as new", cfg.corpus_dir));
    }
  }

  CampaignResult r;
  r.stopped = true;
  std::uint64_t last_index = 0;
  bool any = false;
  for (const FoundFile& x : found) {
    ++r.findings;
    if (r.environment.empty()) r.environment = x.device;
    SignatureCount& sc = r.signatures[x.key];
    ++sc.count;
    if (sc.count == 1 || x.overshoot > sc.worst_overshoot) {
      sc.worst_overshoot = x.overshoot;
      sc.worst_device = x.device_total;
    }
    if (sc.count == 1 || x.case_index < sc.first_case_index) {
      sc.first_case_index = x.case_index;
      sc.first_case_seed = x.case_seed;
      sc.first_file = x.file;
      sc.cause = x.cause;
      sc.activation_dependent = x.activation_dependent;
    }
    sc.known = corpus.by_key.count(x.key) > 0;
    sc.knee_of_oom = sc.knee_of_oom || x.knee_of_oom;
    sc.noise = is_noise(x.key.signature, sc.worst_overshoot, cfg.min_overshoot, sc.knee_of_oom);
    CellCount& cell = r.cells[{x.policy_label, x.allocator}];
    ++cell.cases;
    CellCount::Finding& cf = cell.findings[x.key];
    if (++cf.count == 1 || x.case_index < cf.first_case_index) {
      cf.first_case_index = x.case_index;
      cf.first_case_seed = x.case_seed;
    }
    if (cf.count == 1 || x.overshoot > cf.worst_overshoot) cf.worst_overshoot = x.overshoot;
    last_index = any ? std::max(last_index, x.case_index) : x.case_index;
    any = true;
  }
  // Cases that passed leave nothing on disk: the cases up to the last finding are a lower bound.
  const std::uint64_t stride = std::max<std::uint32_t>(1, cfg.shard_count);
  r.cases = any ? (last_index - std::min<std::uint64_t>(last_index, cfg.shard_index)) / stride + 1 : 0;

  // Repros: the one of each key whose shrink finished (repro.json is written atomically after it).
  struct ReproCase {
    std::string file;
    json doc;
  };
  std::map<FindingKey, ReproCase> repros;
  for (auto& [key, sc] : r.signatures) {
    const std::string folder = folder_of[key.signature + "\n" + key.policy];
    const std::string repro = (fs::path(folder) / "repro.json").string();
    if (!fs::exists(repro, ec)) {
      if (cfg.shrink && !sc.known) {
        notes.push_back(fmt::format("{} under {}: no repro.json: its shrink was in progress when the run stopped (the finding files are "
                                    "listed; `vramfuzz shrink {}` makes one)",
                                    key.signature, key.policy, sc.first_file));
      }
      continue;
    }
    try {
      json doc = parse_json_text(read_text_file(repro), repro);
      if (check_case_document(doc) != CaseDocKind::repro || doc["signature"] != key.signature) {
        throw InputError(repro, "not the repro of " + key.signature);
      }
      sc.repro_file = repro;
      // The repro's cause, as an uninterrupted run shows it (the first case's otherwise).
      if (doc.contains("cause") && doc["cause"].is_string()) sc.cause = doc["cause"].get<std::string>();
      if (doc.contains("at_budget")) sc.activation_dependent = doc.value("activation_dependent", false);
      if (doc.contains("shrink")) {
        const json& sh = doc["shrink"];
        if (sh.contains("final")) {
          sc.repro_modules = sh["final"].value("modules", std::uint64_t{0});
          sc.repro_repeats = sh["final"].value("repeats", std::uint64_t{0});
        }
        sc.shrink_execs = sh.value("executions", std::uint64_t{0});
      }
      if (doc.contains("reliability")) sc.flaky = doc["reliability"].value("flaky", false);
      if (!fs::exists(fs::path(folder) / "repro.md", ec)) {
        notes.push_back(fmt::format("{}: no repro.md (the run stopped between the two files; `vramfuzz shrink {} --force` writes both)",
                                    repro, sc.first_file));
      }
      repros[key] = ReproCase{repro, std::move(doc)};
    } catch (const InputError& e) {
      notes.push_back(fmt::format("{}: damaged, left out ({})", repro, e.what()));
    }
  }

  Json summary = summary_from_campaign(cfg, r, m.info);
  summary.erase("corpus");  // what the corpus replay said is not on disk
  for (Json& f : summary["findings"]) {
    const FindingKey key{f["signature"].get<std::string>(), f["policy"].get<std::string>()};
    f["known_by"] = corpus.by_key.count(key) ? Json(corpus.by_key[key]) : Json::array();
    std::set<std::string> others;
    for (const std::string& p : corpus.policies_by_signature[key.signature]) {
      if (p != key.policy) others.insert(p);
    }
    f["corpus_other_policies"] = others;
    const auto it = repros.find(key);
    if (it == repros.end()) continue;
    const json& doc = it->second.doc;
    if (doc.contains("reliability")) {
      f["reliability"] = {{"runs", doc["reliability"]["runs"]}, {"reproduced", doc["reliability"]["reproduced"]}};
    }
    // The timeline: the repro's case run again, with its trace, on sim (deterministic: the trace
    // the shrink saw) when the campaign ran on sim.
    if (m.info.backend != "sim") continue;
    const Scenario s = load_case_file(it->second.file, catalog);
    const CaseResult cr = run_case(s, sim, true);
    Json cv = case_view(s, cr, doc.value("title", key.signature), replay_command(it->second.file, "", dir));
    if (doc.contains("reliability")) {
      cv["reliability"] = {{"runs", doc["reliability"]["runs"]}, {"reproduced", doc["reliability"]["reproduced"]},
                           {"flaky", doc["reliability"].value("flaky", false)}};
    }
    if (doc.contains("shrink")) {
      const json& sh = doc["shrink"];
      cv["shrink"] = {{"executions", sh.value("executions", std::uint64_t{0})},
                      {"original_modules", sh.contains("original") ? sh["original"].value("modules", std::uint64_t{0}) : 0},
                      {"final_modules", sh.contains("final") ? sh["final"].value("modules", std::uint64_t{0}) : 0},
                      {"budget_exhausted", sh.value("budget_exhausted", false)}};
    }
    f["case"] = std::move(cv);
  }
  if (m.info.backend != "sim" && !repros.empty()) notes.push_back("the repros' timelines: the campaign ran on " + m.info.backend + ", not re-run here");
  notes.push_back(fmt::format("counts.cases: {} is the cases up to the last finding; the cases after it (and the count that passed) "
                              "are not on disk",
                              r.cases));
  notes.push_back(fmt::format("finding counts: the finding files on disk (at most --keep {} per signature and policy); later findings "
                              "of a signature were counted in memory only",
                              cfg.keep_per_signature));
  notes.push_back("expected OOMs, errors, the P4 pairs run (knee_pairs) and the run's wall time: not on disk (0 here; P4 is judged where knee findings were recovered)");
  if (!cfg.corpus_dir.empty()) notes.push_back("the corpus replay (which repros still fail): not on disk; known findings are marked from the corpus's repros");
  summary["recovered"] = {{"from", fmt::format("{}/run.json and the finding files under {}/findings", dir, dir)}, {"not_recovered", notes}};
  // What report and merge will read back: check it as they will.
  check_summary(json::parse(summary.dump()), (fs::path(dir) / "summary.json").string());
  out.summary = std::move(summary);
  return out;
}

}  // namespace vf::report

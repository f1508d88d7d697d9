// `vramfuzz gpu-check`: the driver (sections, time boxes, the results file), the agreement and
// fuzz sections, and the Markdown summary. Calibration and kernels: gpu_check_device.cpp.
#include "harness/cuda/gpu_check.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <functional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/campaign.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/cuda/backend.h"
#include "harness/cuda/gpu_check_detail.h"
#include "harness/oracle.h"
#include "harness/sim/async_pool.h"

namespace vf::cuda {

namespace detail {

double to_mib_d(Bytes b) { return static_cast<double>(b) / static_cast<double>(MiB); }

Json device_json(const DeviceInfo& d) {
  return Json{{"name", d.name},
              {"total", d.total},
              {"cc", fmt::format("{}.{}", d.cc_major, d.cc_minor)},
              {"sm_count", d.sm_count},
              {"driver_version", d.driver_version},
              {"runtime_version", d.runtime_version},
              {"pci_bus_id", d.pci_bus_id},
              {"vmm_supported", d.vmm_supported},
              {"pools_supported", d.pools_supported},
              {"description", d.describe()}};
}

namespace {

double signed_mib(std::int64_t b) { return static_cast<double>(b) / static_cast<double>(MiB); }

}  // namespace

// ---- agreement: the same generated scenarios on sim and on the device --------------------------

void section_agreement(CheckContext& c, const Deadline& dl, Json& out) {
  CudaBackendConfig bc;
  bc.transfer = Transfer::skip;   // allocator peaks do not depend on the bytes copied
  bc.sample_interval_ms = 0;      // the device view is not compared here
  bc.nvml_interval_ms = 0;
  CudaBackend cuda(c.rt, bc);
  SimBackend sim;
  Catalog catalog;
  out["vram"] = c.cfg.vram;
  out["policy"] = "comfy:dec2025";
  out["dynamic_policy"] = "comfy:sep2026";
  out["transfer"] = "skip";
  out["cases_per_mode"] = c.cfg.agreement_cases;
  out["device"] = device_json(cuda.device());
  Json modes = Json::object();
  // The classic path in every mode, then dynamic VRAM (comfy:sep2026: aimdo over real VMM pages,
  // its 2 s poll on the wall clock) in the modes ComfyUI runs it with, keyed "sep2026/<mode>".
  struct Cell {
    std::string_view policy;
    AllocatorMode mode;
  };
  std::vector<Cell> cells;
  for (const AllocatorMode mode : kAllAllocatorModes) cells.push_back({"comfy:dec2025", mode});
  for (const AllocatorMode mode : {AllocatorMode::raw, AllocatorMode::caching, AllocatorMode::async}) cells.push_back({"comfy:sep2026", mode});
  std::size_t k = 0;
  for (const Cell& cell : cells) {
    const AllocatorMode mode = cell.mode;
    const bool dynamic = cell.policy != "comfy:dec2025";
    const std::string key = dynamic ? fmt::format("sep2026/{}", allocator_mode_name(mode)) : std::string(allocator_mode_name(mode));
    const double share = dl.left() / static_cast<double>(cells.size() - k);
    const Deadline mode_dl(share);
    Json rows = Json::array();
    std::uint32_t exact = 0;
    std::uint32_t agree = 0;
    std::uint32_t errors = 0;
    std::uint32_t warnings = 0;
    double max_abs = 0;
    double sum_abs = 0;
    Json worst = nullptr;
    std::uint32_t i = 0;
    // The mode's entry after `n` cases (a checkpoint after every case, the final one at the end).
    auto entry = [&](std::uint32_t n) {
      // Cases that ended in an error have no peak to compare: the mean is over the others.
      const std::uint32_t compared = n - errors;
      return Json{{"cases", n},
                  {"stopped_by_time_box", n < c.cfg.agreement_cases},
                  {"exact", exact},
                  {"verdicts_agree", agree},
                  {"errors", errors},
                  {"warnings", warnings},
                  {"max_abs_diff_mib", max_abs},
                  {"mean_abs_diff_mib", compared > 0 ? Json(sum_abs / compared) : Json(nullptr)},
                  {"worst", worst},
                  {"rows", rows}};
    };
    for (; i < c.cfg.agreement_cases && !mode_dl.passed(); ++i) {
      const std::uint64_t seed = case_seed(c.cfg.seed + 0x9e3779b9ull * (k + 1), i);
      PrngChoices choices(seed);
      GenConfig g;
      g.policy = std::string(cell.policy);
      g.allocator = mode;
      g.vram = c.cfg.vram;
      const Scenario s = generate_scenario(choices, g, catalog);
      const CaseResult simr = run_case(s, sim, false);
      const auto t0 = std::chrono::steady_clock::now();
      const ExecResult real = cuda.execute(s, simr.program, ExecOptions{});
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const Verdict rv = judge(s, simr.plan, simr.program, real);
      const std::int64_t diff = static_cast<std::int64_t>(real.reserved_peak) - static_cast<std::int64_t>(simr.exec.reserved_peak);
      std::int64_t stage_diff = 0;
      for (std::size_t st = 0; st < real.stage_reserved_peak.size() && st < simr.exec.stage_reserved_peak.size(); ++st) {
        const std::int64_t d = static_cast<std::int64_t>(real.stage_reserved_peak[st]) -
                               static_cast<std::int64_t>(simr.exec.stage_reserved_peak[st]);
        if (std::llabs(d) > std::llabs(stage_diff)) stage_diff = d;
      }
      const bool same_verdict = rv.kind == simr.verdict.kind && rv.signature == simr.verdict.signature;
      exact += diff == 0 && stage_diff == 0 ? 1 : 0;
      agree += same_verdict ? 1 : 0;
      errors += real.error ? 1 : 0;
      warnings += static_cast<std::uint32_t>(real.warnings.size());
      const double abs_mib = std::abs(signed_mib(real.error ? 0 : std::max(std::llabs(diff), std::llabs(stage_diff))));
      if (!real.error) sum_abs += abs_mib;
      Json row = {{"seed", seed},
                  {"name", s.name},
                  {"ops", simr.program.ops.size()},
                  {"sim_reserved_peak", simr.exec.reserved_peak},
                  {"real_reserved_peak", real.reserved_peak},
                  {"diff_mib", signed_mib(diff)},
                  {"max_stage_diff_mib", signed_mib(stage_diff)},
                  {"sim_verdict", simr.verdict.signature.empty() ? std::string(verdict_kind_name(simr.verdict.kind)) : simr.verdict.signature},
                  {"real_verdict", rv.signature.empty() ? std::string(verdict_kind_name(rv.kind)) : rv.signature},
                  {"sim_oom_op", simr.exec.oom ? Json(simr.exec.oom->op) : Json(nullptr)},
                  {"real_oom_op", real.oom ? Json(real.oom->op) : Json(nullptr)},
                  {"seconds", seconds}};
      if (real.error) row["error"] = *real.error;
      if (!real.warnings.empty()) row["warnings"] = real.warnings;
      if (dynamic && simr.exec.dynamic && real.dynamic) {
        const DynamicReport& a = *simr.exec.dynamic;
        const DynamicReport& b = *real.dynamic;
        row["dynamic"] = {{"sim", {{"faults", a.faults}, {"copies", a.copies}, {"refused", a.refused}, {"evicted", a.pages_evicted},
                                   {"polls", a.polls}, {"vbar_peak", a.vbar_peak}, {"cast_peak", a.cast_peak}, {"elapsed_us", a.elapsed_us}}},
                          {"real", {{"faults", b.faults}, {"copies", b.copies}, {"refused", b.refused}, {"evicted", b.pages_evicted},
                                    {"polls", b.polls}, {"vbar_peak", b.vbar_peak}, {"cast_peak", b.cast_peak}, {"elapsed_us", b.elapsed_us}}}};
      }
      if (!real.error && (worst.is_null() || abs_mib > max_abs)) {
        max_abs = abs_mib;
        worst = {{"seed", seed}, {"name", s.name}, {"diff_mib", signed_mib(diff)}, {"max_stage_diff_mib", signed_mib(stage_diff)},
                 {"scenario", Json::parse(scenario_to_json(s, -1))}};
      }
      rows.push_back(std::move(row));
      modes[key] = entry(i + 1);
      out["modes"] = modes;
      c.checkpoint(out);
      if (real.fatal) {
        throw SectionFailure(fmt::format("sticky CUDA error in mode {}: {}", allocator_mode_name(mode), real.error.value_or("")));
      }
    }
    modes[key] = entry(i);
    out["modes"] = modes;  // partial results survive a later failure
    ++k;
  }
}

// ---- fuzz: a real campaign at the emulated card -------------------------------------------------

void section_fuzz(CheckContext& c, const Deadline& dl, Json& out) {
  CudaBackendConfig bc;
  bc.transfer = Transfer::copy;
  CudaBackend cuda(c.rt, bc);
  Catalog catalog;
  CampaignConfig cfg;
  cfg.seed = c.cfg.seed;
  // The campaign's budget includes shrinking (the campaign gives each shrink at most what is left
  // of it); should_stop ends both (between cases, between shrink candidates) if the box is spent.
  cfg.seconds = std::max(1.0, c.cfg.fuzz_seconds);
  cfg.gen.policy = "comfy:sep2026,comfy:dec2025";  // what ComfyUI runs by default, and the classic path
  cfg.gen.vram = c.cfg.vram;
  cfg.out_dir = (std::filesystem::path(c.cfg.out_dir) / "fuzz").string();
  cfg.keep_per_signature = 2;
  cfg.shrink = true;
  cfg.shrink_execs = c.cfg.quick ? 20 : 60;
  cfg.shrink_seconds = c.cfg.quick ? 2 : 15;
  cfg.confirm_runs = 2;
  cfg.command_line = fmt::format("vramfuzz gpu-check --section fuzz --seed {} --vram {}", cfg.seed, format_size(c.cfg.vram));
  const double margin = c.cfg.quick ? 0.5 : 5.0;
  cfg.should_stop = [&dl, margin] { return dl.left() < margin; };
  out["seed"] = cfg.seed;
  out["vram"] = c.cfg.vram;
  out["policy"] = *cfg.gen.policy;
  out["campaign_seconds"] = cfg.seconds;
  out["device"] = device_json(cuda.device());
  const CampaignResult r = run_campaign(cfg, catalog, cuda);
  out["cases"] = r.cases;
  out["findings"] = r.findings;
  out["errors"] = r.errors;
  out["expected_ooms"] = r.expected_ooms;
  out["seconds"] = r.seconds;
  out["cases_per_second"] = r.seconds > 0 ? static_cast<double>(r.cases) / r.seconds : 0.0;
  out["stopped_by_time_box"] = r.stopped;
  Json sigs = Json::array();
  std::error_code ec;
  auto rel = [&](const std::string& p) {
    if (p.empty()) return std::string();
    return std::filesystem::relative(p, c.cfg.out_dir, ec).string();
  };
  for (const auto& [key, sc] : r.signatures) {
    sigs.push_back({{"signature", key.signature},
                    {"policy", key.policy},
                    {"count", sc.count},
                    {"worst_overshoot_mib", signed_mib(sc.worst_overshoot)},
                    {"first_case_seed", sc.first_case_seed},
                    {"first_file", rel(sc.first_file)},
                    {"repro", rel(sc.repro_file)},
                    {"repro_modules", sc.repro_modules},
                    {"shrink_executions", sc.shrink_execs},
                    {"flaky", sc.flaky}});
  }
  out["signatures"] = sigs;
  out["out_dir"] = "fuzz";
}

}  // namespace detail

namespace {

using detail::Json;

// The time box of each section. On a GPU the whole check stays under 8 minutes:
// 30 + 40 + 120 + (180 + 15) s, plus four process starts (ci/gpu-check.sh adds a hard limit of
// box + 15 s to each).
double box_seconds(const GpuCheckConfig& cfg, std::string_view section) {
  if (section == "calibration") return cfg.quick ? 10 : 30;
  if (section == "kernels") return cfg.quick ? 10 : 40;
  if (section == "agreement") return cfg.quick ? 20 : 120;
  return cfg.fuzz_seconds + (cfg.quick ? 2 : 15);
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string mib(const Json& j) {
  if (!j.is_number()) return "n/a";
  return fmt::format("{:.2f} MiB", j.get<double>() / static_cast<double>(MiB));
}

void write_doc(const std::string& dir, Json& doc) {
  doc["updated"] = now_utc();
  write_file_atomic((std::filesystem::path(dir) / "gpu-check.json").string(), doc.dump(2) + "\n");
  write_file_atomic((std::filesystem::path(dir) / "gpu-check.md").string(), gpu_check_markdown(doc));
}

// While gpu-check runs, SIGTERM / SIGINT stop the running section at its next check instead of
// killing the process, so its results are written (detail::g_stop_requested).
class StopOnSignal {
 public:
  StopOnSignal() {
    detail::g_stop_requested.store(false);
    struct sigaction sa {};
    sa.sa_handler = [](int) { detail::g_stop_requested.store(true); };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGINT, &sa, &old_int_);
  }
  ~StopOnSignal() {
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGINT, &old_int_, nullptr);
  }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

 private:
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
};

}  // namespace

std::string gpu_check_markdown(const nlohmann::ordered_json& doc) {
  std::string md = "# vramfuzz gpu-check\n\n";
  const Json& rt = doc.value("runtime", Json::object());
  md += fmt::format("- runtime: {} ({})\n", rt.value("kind", "?"), rt.value("nvml", ""));
  if (rt.contains("error")) md += fmt::format("- **runtime error**: {}\n", rt["error"].get<std::string>());
  md += fmt::format("- tool: {}; updated {}\n", doc.value("tool", "?"), doc.value("updated", "?"));
  if (doc.contains("script") && doc["script"].is_object()) {
    std::string line;
    for (const auto& [k, v] : doc["script"].items()) {
      line += fmt::format("{}{}={}", line.empty() ? "" : ", ", k, v.is_string() ? v.get<std::string>() : v.dump());
    }
    md += fmt::format("- ci/gpu-check.sh: {}\n", line);
  }
  md += "\n";
  const Json& secs = doc.value("sections", Json::object());
  md += "| section | status | seconds | headline |\n|---|---|---:|---|\n";
  for (std::string_view name : kGpuCheckSections) {
    const std::string key(name);
    if (!secs.contains(key)) {
      md += fmt::format("| {} | not run | | |\n", name);
      continue;
    }
    const Json& s = secs[key];
    std::string head;
    if (name == "calibration" && s.contains("context")) {
      const Json& sg = s.value("suggested", Json::object());
      const Json& step = sg.value("pool_granularity", Json());
      const std::string growth = step.is_number() ? mib(step) : "no single step fits";
      std::string charge = "n/a";
      const Json& sweep = s.value("cudamalloc", Json::array());
      if (!sweep.empty()) charge = mib(sweep[0]["charged"]);
      head = fmt::format("context {}; cudaMalloc(1 B) charges {}; async growth step {} (default pool); VMM granularity {}",
                         mib(s["context"].value("context_overhead", Json())), charge, growth,
                         s.contains("vmm_granularity") ? mib(s["vmm_granularity"]["minimum"]) : "n/a");
    } else if (name == "kernels" && s.contains("correctness_summary")) {
      const Json& cs = s["correctness_summary"];
      std::size_t fast = 0;
      std::size_t conv = 0;
      for (const Json& b : s.value("bandwidth", Json::array())) {
        if (!b.contains("ok")) continue;
        ++conv;
        fast += b["ok"].get<bool>() ? 1 : 0;
      }
      head = fmt::format("{} kernels, {} mismatching elements, {} unwritten; bandwidth >= {:.0f}% of D2D: {}/{}",
                         cs.value("kernels", 0), cs.value("mismatches", 0), cs.value("unwritten", 0),
                         100 * s.value("bandwidth_target", 0.7), fast, conv);
    } else if (name == "agreement" && s.contains("modes")) {
      for (const auto& [mode, m] : s["modes"].items()) {
        head += fmt::format("{}{}: {} cases, {} exact, max |Δ| {:.2f} MiB", head.empty() ? "" : "; ", mode, m.value("cases", 0),
                            m.value("exact", 0), m.value("max_abs_diff_mib", 0.0));
      }
    } else if (name == "fuzz" && s.contains("cases")) {
      head = fmt::format("{} cases ({:.1f}/s), {} findings in {} signatures, {} errors", s.value("cases", 0),
                         s.value("cases_per_second", 0.0), s.value("findings", 0), s.value("signatures", Json::array()).size(),
                         s.value("errors", 0));
    }
    if (s.contains("error")) head += fmt::format("{}error: {}", head.empty() ? "" : "; ", s["error"].get<std::string>());
    md += fmt::format("| {} | {} | {:.1f} | {} |\n", name, s.value("status", "?"), s.value("seconds", 0.0), head);
  }

  if (secs.contains("calibration") && secs["calibration"].contains("suggested")) {
    const Json& sg = secs["calibration"]["suggested"];
    md += "\n## Simulator defaults (reports/gpu/README.md)\n\n| constant | file | current | measured |\n|---|---|---:|---:|\n";
    md += fmt::format("| kDefaultContextOverhead | harness/scenario.h | {} | {} |\n", mib(Json(kDefaultContextOverhead)),
                      mib(sg.value("context_overhead", Json())));
    md += fmt::format("| kDefaultPoolGranularity | harness/sim/async_pool.h | {} | {} |\n", mib(Json(sim::kDefaultPoolGranularity)),
                      mib(sg.value("pool_granularity", Json())));
    for (const char* note : {"context_overhead_note", "pool_granularity_note"}) {
      if (sg.contains(note)) md += fmt::format("\n{}: {}\n", note, sg[note].get<std::string>());
    }
  }
  if (secs.contains("calibration")) {
    const Json& cal = secs["calibration"];
    const Json none = Json::array();
    const Json& raw = cal.contains("sequences_raw") ? cal["sequences_raw"] : none;
    const Json& pool = cal.contains("sequences_async") ? cal["sequences_async"] : none;
    if (!raw.empty() || !pool.empty()) {
      md += "\n## Recorded sequences: the simulator op by op (gpu_check_sequences.cpp)\n\n"
            "| sequence | ops | exact | max abs diff MiB | first mismatch (op: device / model) |\n|---|---:|---:|---:|---|\n";
      auto row = [&](const std::string& label, const Json& r) {
        const Json& f = r.value("first_mismatch", Json());
        const std::string first = f.is_object() ? fmt::format("{}: {} / {}", f.value("op", 0), mib(f["measured"]), mib(f["model"])) : "-";
        md += fmt::format("| {} | {} | {} | {:.2f} | {} |\n", label, r.value("ops", 0), r.value("exact", 0),
                          detail::to_mib_d(r.value("max_abs_diff", Bytes{0})), first);
      };
      for (const Json& q : raw) row(fmt::format("cudaMalloc {}", q.value("name", "?")), q["model"]);
      for (const Json& q : pool) {
        row(fmt::format("pool {} at {}", q.value("name", "?"), mib(q["model"]["granularity"])), q["model"]["result"]);
      }
    }
  }
  if (secs.contains("agreement") && secs["agreement"].contains("modes")) {
    md += "\n## Agreement: allocator reserved peak, device - sim\n\n"
          "| mode | cases | exact | verdicts agree | max abs diff MiB | mean abs diff MiB | worst case |\n"
          "|---|---:|---:|---:|---:|---:|---|\n";
    for (const auto& [mode, m] : secs["agreement"]["modes"].items()) {
      const Json& w = m.value("worst", Json());
      const std::string worst = w.is_object() ? fmt::format("{} (seed {}, {:+.2f} MiB)", w.value("name", "?"), w.value("seed", std::uint64_t{0}),
                                                            w.value("diff_mib", 0.0))
                                              : "-";
      const Json& mean = m.value("mean_abs_diff_mib", Json());
      md += fmt::format("| {} | {}{} | {} | {} | {:.2f} | {} | {} |\n", mode, m.value("cases", 0),
                        m.value("stopped_by_time_box", false) ? " (time box)" : "", m.value("exact", 0), m.value("verdicts_agree", 0),
                        m.value("max_abs_diff_mib", 0.0), mean.is_number() ? fmt::format("{:.2f}", mean.get<double>()) : "n/a", worst);
    }
  }
  if (secs.contains("kernels") && secs["kernels"].contains("bandwidth")) {
    md += "\n## Kernel bandwidth\n\n| kernel | GB/s | vs D2D copy |\n|---|---:|---:|\n";
    for (const Json& b : secs["kernels"]["bandwidth"]) {
      md += fmt::format("| {} | {:.0f} | {:.0f}%{} |\n", b.value("kernel", "?"), b.value("gbps", 0.0), 100 * b.value("ratio", 0.0),
                        b.contains("ok") && !b["ok"].get<bool>() ? " (below target)" : "");
    }
  }
  if (secs.contains("fuzz") && secs["fuzz"].contains("signatures") && !secs["fuzz"]["signatures"].empty()) {
    md += "\n## Fuzz findings\n\n| signature | count | worst overshoot MiB | repro |\n|---|---:|---:|---|\n";
    for (const Json& sg : secs["fuzz"]["signatures"]) {
      md += fmt::format("| {} | {} | {:.2f} | {} |\n", sg.value("signature", "?"), sg.value("count", 0),
                        sg.value("worst_overshoot_mib", 0.0), sg.value("repro", ""));
    }
  }
  return md;
}

int run_gpu_check(const GpuCheckConfig& cfg) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(cfg.out_dir, ec);
  if (ec) throw InfraError(fmt::format("gpu-check: cannot create {}: {}", cfg.out_dir, ec.message()));
  const std::string json_path = (fs::path(cfg.out_dir) / "gpu-check.json").string();

  // Merge into an existing results file: ci/gpu-check.sh runs each section in its own process.
  Json doc;
  if (fs::exists(json_path, ec)) {
    try {
      doc = Json::parse(read_text_file(json_path));
      if (doc.value("schema", "") != kGpuCheckSchema) doc = Json();
    } catch (const std::exception&) {
      doc = Json();
    }
  }
  if (doc.is_null()) {
    doc["schema"] = kGpuCheckSchema;
    doc["tool"] = tool_version();
    doc["started"] = now_utc();
    doc["sections"] = Json::object();
  }

  std::vector<std::string> sections = cfg.sections;
  if (sections.empty()) sections.assign(std::begin(kGpuCheckSections), std::end(kGpuCheckSections));
  for (const std::string& s : sections) {
    if (s != "report" && std::find(std::begin(kGpuCheckSections), std::end(kGpuCheckSections), s) == std::end(kGpuCheckSections)) {
      throw InputError("--section", fmt::format("unknown section \"{}\" (calibration, kernels, agreement, fuzz, report)", s));
    }
  }
  for (const auto& [k, v] : cfg.records) doc["script"][k] = v;
  if (sections.size() == 1 && sections[0] == "report") {
    write_doc(cfg.out_dir, doc);
    return kExitOk;
  }

  std::unique_ptr<Runtime> rt;
  try {
    if (cfg.fake) {
      FakeConfig f = *cfg.fake;
      if (f.backing_limit == 0) f.backing_limit = 16 * MiB;  // the kernel checks read real data back
      rt = std::make_unique<FakeRuntime>(f);
    } else {
      rt = open_cuda_runtime();
    }
  } catch (const InfraError& e) {
    doc["runtime"] = {{"kind", cfg.fake ? "fake" : "cuda"}, {"error", e.what()}};
    write_doc(cfg.out_dir, doc);
    throw;
  }
  doc["runtime"] = {{"kind", rt->kind()}, {"nvml", rt->nvml_note()}};
  doc["config"] = {{"quick", cfg.quick},
                   {"seed", cfg.seed},
                   {"vram", cfg.vram},
                   {"agreement_cases", cfg.agreement_cases},
                   {"fuzz_seconds", cfg.fuzz_seconds}};
  detail::CheckContext ctx{cfg, *rt, static_cast<bool>(cfg.fake)};
  const StopOnSignal stop_on_signal;
  using SectionFn = void (*)(detail::CheckContext&, const detail::Deadline&, Json&);
  const std::pair<std::string_view, SectionFn> fns[] = {{"calibration", &detail::section_calibration},
                                                        {"kernels", &detail::section_kernels},
                                                        {"agreement", &detail::section_agreement},
                                                        {"fuzz", &detail::section_fuzz}};
  bool failed = false;
  for (const auto& [name, fn] : fns) {
    if (std::find(sections.begin(), sections.end(), name) == sections.end()) continue;
    const std::string key(name);
    const detail::Deadline dl(box_seconds(cfg, name));
    // The section's record: its status and times, `head` (error, stopped_by), then its data.
    auto publish = [&](std::string_view status, Json head, const Json& data) {
      Json sec = {{"status", status}, {"seconds", dl.elapsed()}, {"time_box_seconds", dl.seconds()}};
      for (const auto& [k, v] : head.items()) sec[k] = v;
      for (const auto& [k, v] : data.items()) sec[k] = v;
      doc["sections"][key] = std::move(sec);
      write_doc(cfg.out_dir, doc);
    };
    // On disk before it starts (and after every measurement): a section that crashes the process
    // is seen as "running" with what it had measured.
    publish("running", Json::object(), Json::object());
    spdlog::info("gpu-check: {} (time box {:.0f} s)", name, dl.seconds());
    Json data = Json::object();
    ctx.checkpoint = [&](const Json& so_far) { publish("running", Json::object(), so_far); };
    std::string status = "ok";
    std::string error;
    try {
      fn(ctx, dl, data);
      if (dl.passed()) status = "partial";  // the time box ended it early: what is there is valid
    } catch (const std::exception& e) {
      status = "error";
      error = e.what();
      failed = true;
      spdlog::error("gpu-check: {}: {}", name, error);
    }
    ctx.checkpoint = [](const Json&) {};
    Json head = Json::object();
    if (!error.empty()) head["error"] = error;
    const bool signalled = detail::g_stop_requested.load();
    if (signalled) head["stopped_by"] = "SIGTERM/SIGINT (ci/gpu-check.sh's hard limit, or the user)";
    publish(status, std::move(head), data);
    if (signalled) {
      failed = true;
      break;
    }
  }
  spdlog::info("gpu-check: results in {}", json_path);
  return failed ? kExitInfra : kExitOk;
}

}  // namespace vf::cuda

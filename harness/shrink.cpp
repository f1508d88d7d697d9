#include "harness/shrink.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <optional>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/core/error.h"
#include "harness/predictors/external.h"

namespace vf {

CaseSize case_size(const Scenario& s) {
  CaseSize z;
  z.models = s.models.size();
  for (const ModelRef& m : s.models) {
    z.modules += m.spec->modules.size();
    for (std::size_t i = 0; i < m.spec->modules.size();) {
      const std::size_t run = repeat_run(m.spec->modules, i);
      z.repeats += run - 1;
      i += run;
    }
    for (const Module& mod : m.spec->modules) z.tensors += mod.tensors.size();
    z.bytes += m.spec->bytes;
  }
  return z;
}

std::uint32_t count_reproductions(const Scenario& s, Backend& backend, const std::string& signature, std::uint32_t runs) {
  std::uint32_t n = 0;
  for (std::uint32_t i = 0; i < runs; ++i) {
    Scenario c = s;
    if (i > 0) c.seed = splitmix64(s.seed + i);
    n += run_case(c, backend, false).verdict.signature == signature ? 1 : 0;
  }
  return n;
}

namespace {

// How plain a dtype is, for the "toward the plainest dtype that still fails" pass.
constexpr Dtype kPlainness[] = {Dtype::bf16, Dtype::fp16, Dtype::fp32, Dtype::fp8_e4m3fn, Dtype::fp8_e5m2,
                                Dtype::int8, Dtype::q8_0, Dtype::q4_0, Dtype::q4_1, Dtype::q5_0,
                                Dtype::q5_1, Dtype::q4_k, Dtype::q5_k, Dtype::q6_k, Dtype::q3_k, Dtype::q2_k};
int plainness(Dtype d) {
  for (int i = 0; i < kDtypeCount; ++i) {
    if (kPlainness[i] == d) return i;
  }
  return kDtypeCount;
}

// The labels of a shrunk case. The original's name and device name describe the original ("...,
// 12 GiB, 2 offload streams"), which the shrunk case no longer is: the name says what the case is
// now and that it was shrunk from the original (named once, however often it is shrunk again);
// a device whose size changed is named as shrunk from the original card.
void name_shrunk(const Scenario& original, Scenario& shrunk) {
  static constexpr std::string_view kFrom = "; shrunk from \"";
  std::string from = original.name;
  if (const auto at = from.find(kFrom); at != std::string::npos && from.back() == '"') {
    from = from.substr(at + kFrom.size(), from.size() - at - kFrom.size() - 1);
  } else if (from.size() >= 8 && from.ends_with("; shrunk")) {
    from.clear();
  }
  std::string now;
  for (const ModelRef& m : shrunk.models) {
    now += fmt::format("{}{} ({} module{})", now.empty() ? "" : ", ", m.id, m.spec->modules.size(), m.spec->modules.size() == 1 ? "" : "s");
  }
  now += fmt::format(", {} device, {} offload stream{}", format_size(shrunk.device.total), shrunk.streams(), shrunk.streams() == 1 ? "" : "s");
  shrunk.name = from.empty() ? now + "; shrunk" : fmt::format("{}{}{}\"", now, kFrom, from);
  if (shrunk.device.total != original.device.total && shrunk.device.name != "sim" && !shrunk.device.name.starts_with("shrunk from ")) {
    shrunk.device.name = "shrunk from " + shrunk.device.name;
  }
}

std::uint64_t floor_pow2(std::uint64_t v) { return v == 0 ? 0 : std::uint64_t{1} << (63 - __builtin_clzll(v)); }

class Shrinker {
 public:
  Shrinker(Backend& backend, const ShrinkOptions& opt) : backend_(backend), opt_(opt), start_(std::chrono::steady_clock::now()) {}

  ShrinkResult run(const Scenario& s) {
    ShrinkResult out;
    out.original_size = case_size(s);
    const CaseResult first = run_case(s, backend_, false);
    ++execs_;
    if (!first.verdict.finding()) {
      throw InputError("finding", fmt::format("the case does not fail (verdict {}: {}); nothing to shrink",
                                              verdict_kind_name(first.verdict.kind), first.verdict.message));
    }
    sig_ = first.verdict.signature;
    class_ = mechanism_class(first.verdict);
    family_ = cause_family(first.verdict);
    out.original_overshoot = first.verdict.overshoot;
    largest_ = first.verdict.overshoot;
    margin_ = std::max<std::int64_t>(static_cast<std::int64_t>(MiB), first.verdict.overshoot / 2);
    best_ = s;
    s_models_ = s.models;
    best_verdict_ = first.verdict;
    best_elapsed_us_ = first.exec.dynamic ? first.exec.dynamic->elapsed_us : 0;
    cache_[scenario_fingerprint(s, &memo_)] = true;

    bool progress = true;
    // An other process's failed allocation happens at a time: bring it forward before the case
    // gets shorter, or the shorter case ends before it.
    if (best_.policy.dynamic() && sig_.rfind("oom:others:", 0) == 0) simplify_dynamic();
    // A rounding or slack sum is recognised at once: its compact form first, before the budget
    // goes on dropping modules it cannot do without.
    repeat_worst_module();
    overlap_form();
    while (progress && within_budget()) {
      progress = false;
      progress |= focus_on_the_peak();
      progress |= drop_models();
      progress |= drop_stages();
      for (std::size_t m = 0; m < best_.models.size(); ++m) progress |= bisect_modules(m);
      progress |= drop_tensors();
      progress |= simplify_workload();
      progress |= simplify_dtypes();
      progress |= simplify_allocator_and_streams();
      if (best_.policy.dynamic()) progress |= simplify_dynamic();
      progress |= shrink_device();
      progress |= round_shapes();
      // Last resort, when nothing else moves: the overshoot is a sum of many small parts.
      if (!progress && within_budget()) progress |= redistribute_into_the_peak();
      if (!progress && within_budget()) progress |= repeat_for_waste();
    }

    recatalog();
    renumber_pads();
    out.minimal = best_;
    out.result = run_case(best_, backend_, true);
    check_activation_dependence(best_, out.result.plan, backend_, out.result.verdict);
    out.signature = sig_;
    out.largest_overshoot = largest_;
    out.margin = margin_;
    out.final_size = case_size(best_);
    out.executions = execs_;
    out.cache_hits = hits_;
    out.accepted = accepted_;
    out.budget_exhausted = exhausted_;
    out.confirm_runs = std::max<std::uint32_t>(1, opt_.confirm_runs);
    out.reproduced = count_reproductions(best_, backend_, sig_, out.confirm_runs);
    out.flaky = static_cast<double>(out.reproduced) < opt_.flaky_below * out.confirm_runs;
    out.seconds = elapsed();
    out.log = std::move(log_);
    // Labels only (they change no verdict): a case the passes did not change keeps its own.
    if (accepted_ > 0) name_shrunk(s, out.minimal);
    return out;
  }

 private:
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  bool within_budget() {
    if (execs_ >= opt_.max_execs || elapsed() >= opt_.max_seconds || (opt_.should_stop && opt_.should_stop())) exhausted_ = true;
    return !exhausted_;
  }

  // Runs a candidate (once ever): does it keep the signature with the margin?
  // `seen`: the verdict of a candidate that ran (accepted or not); untouched when it did not run.
  bool interesting(const Scenario& c, Verdict* verdict, Verdict* seen = nullptr) {
    try {
      validate_scenario(c);
    } catch (const InputError&) {
      return false;  // not a valid case: never run, never counted
    }
    const ScenarioFingerprint key = scenario_fingerprint(c, &memo_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      ++hits_;
      return false;  // seen before: either rejected, or the very case we already hold
    }
    if (!within_budget()) return false;
    ++execs_;
    SentAhead sent;
    if (auto it = ahead_.find(key); it != ahead_.end()) {
      sent = std::move(it->second);
      ahead_.erase(it);
    }
    const CaseResult r = run_case(c, backend_, false, &sent);
    // An external predictor given up: no candidate can run any more; the best so far stands.
    if (r.exec.fatal) exhausted_ = true;
    last_elapsed_us_ = r.exec.dynamic ? r.exec.dynamic->elapsed_us : 0;
    if (same_finding(r.verdict)) {
      largest_ = std::max(largest_, r.verdict.overshoot);
    }
    const bool ok = keeps(r.verdict);
    if (!ok && spdlog::should_log(spdlog::level::trace)) {  // (the arguments cost a walk of the case)
      const CaseSize z = case_size(c);
      spdlog::trace("shrink: rejected ({} modules, device {}, predicted {} + {}, measured {}): {} {:+.2f} MiB{}: {}", z.modules, format_size(c.device.total),
                    format_mib(r.verdict.predicted), format_mib(r.verdict.reserve), format_mib(r.verdict.measured), r.verdict.signature,
                    static_cast<double>(r.verdict.overshoot) / static_cast<double>(MiB), r.verdict.expected_oom ? " (expected OOM)" : "",
                    r.verdict.cause.substr(0, 90));
    }
    cache_[key] = ok;
    if (ok && verdict) *verdict = r.verdict;
    if (seen) *seen = r.verdict;
    return ok;
  }

  bool accept(const Scenario& c, const std::string& what) {
    Verdict v;
    if (!interesting(c, &v)) {
      if (sig_.rfind("waste:", 0) == 0) return fit_device_to_waste(c, what);
      // Another process's failure happens at a time: a shorter (or longer) candidate moves what
      // the events met, so try it once more with the events scaled to its length.
      const std::uint64_t ran = last_elapsed_us_;
      if (sig_.rfind("oom:others:", 0) != 0 || c.device.events.empty() || ran == 0 || best_elapsed_us_ == 0 || ran == best_elapsed_us_) {
        return false;
      }
      Scenario scaled = c;
      const double ratio = static_cast<double>(ran) / static_cast<double>(best_elapsed_us_);
      for (OthersEvent& e : scaled.device.events) e.at_us = static_cast<std::uint64_t>(static_cast<double>(e.at_us) * ratio);
      if (!interesting(scaled, &v)) return false;
      return adopt(scaled, v, what + ", the events moved with it");
    }
    return adopt(c, v, what);
  }

  // Class C lives in a band of card sizes: large enough that the measured peak, the reserve and
  // the largest offloaded module fit, small enough that the load is still partial (the weight
  // budget, free memory - min_req, below the model). A candidate with fewer modules moves the
  // band, and neither keeping the card nor shrinking it by the bytes dropped lands in it: put the
  // card just below the edge of a full load, where the room is largest.
  bool fit_device_to_waste(const Scenario& c, const std::string& what) {
    if (best_verdict_.stage >= c.stages.size() || !within_budget()) return false;
    const std::uint32_t model = c.stages[best_verdict_.stage].model;
    const std::optional<Plan> plan = plan_of(c);
    if (!plan) return false;
    const LoadPlan* lp = nullptr;
    for (const LoadPlan& l : plan->loads) {
      if (l.model == model && l.stage < best_verdict_.stage) lp = &l;
    }
    if (!lp) return false;
    const Bytes model_bytes = c.models[model].spec->bytes;
    const Bytes others = c.device.total - plan->available;  // context, other processes
    for (const Bytes below : {MiB, 32 * MiB}) {
      const Bytes free_edge = model_bytes + lp->min_req;  // the budget reaches the model here
      if (free_edge <= below) continue;
      // Free memory at the load is the available memory less what earlier loads left resident.
      const Bytes resident_before = plan->available > lp->free_before ? plan->available - lp->free_before : 0;
      Scenario d = c;
      d.device.total = (others + resident_before + free_edge - below) / MiB * MiB;
      if (d.device.total == c.device.total) continue;
      Verdict v;
      if (interesting(d, &v)) return adopt(d, v, fmt::format("{}, device {} (just short of a full load)", what, format_size(d.device.total)));
    }
    return false;
  }

  bool adopt(const Scenario& c, const Verdict& v, const std::string& what) {
    ahead_.clear();  // each was a candidate of the case before this one: abandoned
    best_ = c;
    best_verdict_ = v;
    best_elapsed_us_ = last_elapsed_us_;
    ++accepted_;
    const CaseSize z = case_size(best_);
    log_.push_back(fmt::format("{} -> {} models, {} modules, {} ({} execs)", what, z.models, z.modules, format_mib(z.bytes), execs_));
    spdlog::debug("shrink: {}", log_.back());
    return true;
  }

  // `s` with every model but model `at` dropped; `at` becomes its index there.
  static Scenario only_model(const Scenario& s, std::size_t& at) {
    Scenario alone = s;
    for (std::size_t i = alone.models.size(); i-- > 0;) {
      if (i == at) continue;
      alone = without_model(alone, static_cast<std::uint32_t>(i));
      if (i < at) --at;
    }
    return alone;
  }
  static Scenario without_model(const Scenario& s, std::uint32_t m) {
    Scenario c = s;
    c.models.erase(c.models.begin() + m);
    std::erase_if(c.activations.bytes, [&](const auto& e) { return e.first == s.models[m].id; });
    c.stages.clear();
    for (const Stage& st : s.stages) {
      if (st.model == m) continue;
      c.stages.push_back({st.op, st.model > m ? st.model - 1 : st.model});
    }
    return c;
  }

  // The plan of a case the shrinker inspects (not a candidate it runs). An external predictor can
  // fail on any request: the step is then skipped, and a predictor given up ends the shrink with
  // the best case so far.
  std::optional<Plan> plan_of(const Scenario& c) {
    try {
      return predict(c);
    } catch (const PredictorError& e) {
      spdlog::debug("shrink: the predictor failed on a case the shrinker inspects: {}", e.what());
      if (e.fatal()) exhausted_ = true;
      return std::nullopt;
    }
  }

  // The biggest step first (syzkaller's "keep what the crash names"): keep only the modules whose
  // transients (transfers, conversions, LoRA temporaries) are live at the judged op, and take the
  // bytes of the dropped resident modules off the device so the memory pressure stays the same.
  bool focus_on_the_peak() {
    const std::optional<Plan> plan = plan_of(best_);
    if (!plan) return false;
    const Program prog = lower(best_, *plan);
    if (best_verdict_.op >= prog.ops.size()) return false;
    std::vector<std::uint8_t> live(prog.buffers.size(), 0);
    for (std::uint32_t i = 0; i <= best_verdict_.op; ++i) {
      const Op& op = prog.ops[i];
      if (op.kind == OpKind::alloc) live[op.buffer] = 1;
      if (op.kind == OpKind::free) live[op.buffer] = 0;
    }
    std::vector<std::vector<std::uint8_t>> keep(best_.models.size());
    for (std::size_t m = 0; m < best_.models.size(); ++m) keep[m].assign(best_.models[m].spec->modules.size(), 0);
    bool any_transient = false;
    for (std::size_t b = 0; b < prog.buffers.size(); ++b) {
      const Buffer& buf = prog.buffers[b];
      if (!live[b] || buf.module == kNone || buf.kind == BufferKind::weight || buf.kind == BufferKind::activation) continue;
      keep[buf.model][buf.module] = 1;
      any_transient = true;
    }
    if (!any_transient) return false;
    // Which modules are resident when the judged stage runs (their bytes leave with them).
    std::vector<std::vector<std::uint8_t>> resident(best_.models.size());
    for (std::size_t m = 0; m < best_.models.size(); ++m) resident[m].assign(best_.models[m].spec->modules.size(), 0);
    for (const LoadPlan& lp : plan->loads) {
      if (lp.stage <= best_verdict_.stage) resident[lp.model] = lp.resident;
    }
    Scenario c = best_;
    Bytes resident_removed = 0;
    bool changed = false;
    for (std::size_t m = 0; m < c.models.size(); ++m) {
      const bool involved = std::find(keep[m].begin(), keep[m].end(), 1) != keep[m].end();
      if (!involved) continue;  // other models: left to drop_models
      ModelSpec& spec = editable(c, m);
      std::vector<Module> kept;
      for (std::size_t i = 0; i < spec.modules.size(); ++i) {
        if (keep[m][i]) kept.push_back(std::move(spec.modules[i]));
        else {
          changed = true;
          if (resident[m][i]) resident_removed += best_.models[m].spec->modules[i].bytes;
        }
      }
      spec.modules = std::move(kept);
      refinalize(c, m);
    }
    if (!changed) return false;
    if (!class_.empty()) {
      // A mechanism (class B's overlap) lives in the modules in flight: where they alone do not
      // fail on this card, with the resident bytes dropped off it, search the card size too (an
      // OOM needs it as tight as the original).
      std::int64_t short_by = 0;
      if (accept(c, "keep only the modules live at the peak")) return true;
      if (c.device.total <= resident_removed + MiB) return false;
      c.device.total -= resident_removed;
      return try_pads(c, "keep only the modules live at the peak, with their resident bytes off the device", short_by, false);
    }
    if (accept(c, "keep only the modules live at the peak")) return true;
    if (c.device.total <= resident_removed + MiB) return false;
    c.device.total -= resident_removed;
    return accept(c, "keep only the modules live at the peak, with their resident bytes off the device");
  }

  // The category a cause leads with (a knee's: its smaller case's, after "A fails, B passes: ").
  static std::string leading_category(const Verdict& v) {
    if (v.kind == VerdictKind::knee) {
      const std::size_t at = v.cause.find(" passes: ");
      return at == std::string::npos ? std::string() : v.cause.substr(at + 9);
    }
    return v.cause;
  }
  // A mechanism the signature does not name but the finding is about, which a smaller case
  // must keep: class B's async-offload overlap and other streams' frees (one module copied on
  // the compute stream has the same signature, and is class A's finding, not this one).
  static std::string mechanism_class(const Verdict& v) {
    const std::string c = leading_category(v);
    for (const char* cls : {"async-offload overlap", "other streams' frees"}) {
      if (c.rfind(cls, 0) == 0) return cls;
    }
    return "";
  }
  // What a classic finding's diagnosis leads with, as broadly as a user files it: the allocator's
  // own bytes (rounding or slack: class D) or the weights' transients (class A). A smaller case
  // that fails for the other reason is another finding: a rounding sum of 962 tensors must not
  // shrink into one weight whose unbudgeted dequant copy fails on its own.
  static std::string cause_family(const Verdict& v) {
    const std::string c = leading_category(v);
    if (c.rfind("allocator rounding", 0) == 0 || c.rfind("allocator slack", 0) == 0) return "allocator";
    if (c.rfind("weight transients", 0) == 0) return "weight transients";
    return "";
  }
  // What every accepted candidate keeps: the signature, the margin, the mechanism and the cause.
  bool same_finding(const Verdict& v) const {
    return v.signature == sig_ && (class_.empty() || mechanism_class(v) == class_) && (family_.empty() || cause_family(v) == family_);
  }
  bool keeps(const Verdict& v) const { return same_finding(v) && v.overshoot >= margin_; }
  static bool rounding_route(const Verdict& v) {
    const std::string c = leading_category(v);
    return c.rfind("allocator rounding", 0) == 0 || c.rfind("allocator slack", 0) == 0;
  }
  // "2 MiB + 512 B": a pad's size as a user reads it.
  static std::string exact_size_text(Bytes b) {
    if (b % MiB == 0) return fmt::format("{} MiB", b / MiB);
    return b > MiB ? fmt::format("{} MiB + {} B", b / MiB, b % MiB) : fmt::format("{} B", b);
  }
  // The bytes of the rounding or slack category a cause names ("allocator slack 974.42 MiB ...").
  static Bytes rounding_bytes(const std::string& cause) {
    const std::size_t at = cause.find_first_of("0123456789");
    if (at == std::string::npos) return 0;
    return static_cast<Bytes>(std::strtod(cause.c_str() + at, nullptr) * static_cast<double>(MiB));
  }
  // A pad module: one weight of `bytes` (a multiple of 512) in the model's compute dtype, so it
  // is ballast that only the allocator's rounding sees (no conversion, no patch).
  static Module pad_module(Bytes bytes, Dtype compute, std::uint64_t k) {
    const std::uint64_t elem = compute_elem_bytes(compute);
    Module pad;
    pad.name = fmt::format("pad.{}", k);
    Tensor w;
    w.name = "weight";
    w.dtype = compute;
    w.shape = {bytes / 512, 512 / elem};
    w.role = TensorRole::weight;
    pad.tensors.push_back(std::move(w));
    return pad;
  }
  // Class C in its compact form. Waste needs the buffer (nov2025: the largest module's cost plus
  // NS times the largest) to exceed what is in flight (the largest and its NS smaller
  // neighbours), and the modules not in flight to outweigh the largest (room for it on a card
  // whose load is still partial). So it cannot shrink below the largest module plus more than
  // G / y + 2 smaller ones of y bytes; as [largest] + k copies of one smaller module it is two
  // entries. Tried once the module passes are stuck, with the card at the edge of a full load.
  bool repeat_for_waste() {
    if (sig_.rfind("waste:", 0) != 0 || best_verdict_.stage >= best_.stages.size()) return false;
    const std::size_t m = best_.stages[best_verdict_.stage].model;
    const ModelSpec& spec = *best_.models[m].spec;
    if (spec.modules.size() <= 3) return false;
    std::size_t largest = spec.modules.size();
    for (std::size_t i = 0; i < spec.modules.size(); ++i) {
      if (spec.modules[i].cast_hook && (largest == spec.modules.size() || spec.modules[i].bytes > spec.modules[largest].bytes)) largest = i;
    }
    if (largest == spec.modules.size()) return false;
    const Module big = spec.modules[largest];
    // The smaller module: one of the model's between a sixteenth and a quarter of the largest,
    // else a pad of an eighth in the compute dtype.
    std::vector<Module> smalls;
    for (std::size_t i = 0; i < spec.modules.size(); ++i) {
      const Module& x = spec.modules[i];
      if (i != largest && x.cast_hook && x.bytes * 4 <= big.bytes && x.bytes * 16 >= big.bytes) {
        smalls.push_back(x);
        break;
      }
    }
    if (big.bytes >= 8 * 4096) smalls.push_back(pad_module(big.bytes / 8 / 512 * 512, best_.models[m].compute, 0));
    if (repeat_run(spec.modules, std::min<std::size_t>(1, spec.modules.size() - 1)) + 1 == spec.modules.size()) return false;  // already [big] + run
    for (const Module& small : smalls) {
      if (small.bytes == 0) continue;
      const std::uint64_t k0 = big.bytes / small.bytes + 3;
      for (const std::uint64_t k : {k0, k0 + 2, 2 * k0}) {
        if (k + 1 >= spec.modules.size() + 64 || !within_budget()) break;
        Scenario c = best_;
        ModelSpec& e = editable(c, m);
        std::vector<Module> mods{big};
        for (std::uint64_t j = 0; j < k; ++j) {
          mods.push_back(small);
          mods.back().name = fmt::format("block.{}", j);
        }
        e.modules = std::move(mods);
        refinalize(c, m);
        if (accept(c, fmt::format("{} + {} x [{}]", big.name, k, exact_size_text(small.bytes)))) return true;
      }
    }
    return false;
  }

  // The model's modules as [keep] + n pads (or n pads + [keep]); no keep: n pads only.
  static Scenario with_pads(const Scenario& s, std::size_t m, const Module* keep, bool keep_first, Bytes pad_bytes, std::uint64_t n) {
    Scenario c = s;
    ModelSpec& spec = editable(c, m);
    std::vector<Module> mods;
    mods.reserve(n + 1);
    if (keep && keep_first) mods.push_back(*keep);
    for (std::uint64_t k = 0; k < n; ++k) mods.push_back(pad_module(pad_bytes, c.models[m].compute, k));
    if (keep && !keep_first) mods.push_back(*keep);
    spec.modules = std::move(mods);
    refinalize(c, m);
    return c;
  }
  // Class D's compact form: an overshoot that is the allocator's rounding or slack summed over
  // hundreds of tensors cannot lose modules one chunk at a time without losing the sum, and the
  // repro then lists hundreds of unrelated modules. Replace the model's modules by the peak op's
  // module plus N pads named pad.0 ... pad.(N-1), which the scenario writes as one "repeat"
  // entry, then search N down.
  bool repeat_worst_module() {
    if (!rounding_route(best_verdict_) || best_verdict_.stage >= best_.stages.size()) return false;
    const std::size_t m = best_.stages[best_verdict_.stage].model;
    const ModelSpec& spec = *best_.models[m].spec;
    if (spec.modules.size() < 8) return false;
    const Bytes sum = rounding_bytes(leading_category(best_verdict_));
    if (sum < MiB) return false;
    // The module the judged op works on keeps the signature's activity (its conversion, its
    // patch); the pads carry the sum.
    std::optional<Module> keep;
    {
      const std::optional<Plan> plan = plan_of(best_);
      if (!plan) return false;
      const Program prog = lower(best_, *plan);
      if (best_verdict_.op < prog.ops.size() && prog.ops[best_verdict_.op].buffer != kNone) {
        const Buffer& buf = prog.buffers[prog.ops[best_verdict_.op].buffer];
        if (buf.model == m && buf.module != kNone) keep = spec.modules[buf.module];
      }
    }
    if (keep && !keep->cast_hook) keep.reset();
    // Sizes just above a boundary: 2 MiB + 512 B takes two 2 MiB pages (raw, async's pool);
    // 10 MiB + 512 B is rounded to a 12 MiB caching segment. Each wastes about 2 MiB.
    const bool caching = best_.allocator.mode == AllocatorMode::caching;
    const Bytes sizes[] = {caching ? 10 * MiB + 512 : 2 * MiB + 512, caching ? 2 * MiB + 512 : 10 * MiB + 512};
    // The sum counts every tensor on the device, the other models' too: the pads carry it alone
    // first, without the other models (which drop_models could not drop while their rounding
    // was part of the sum), then beside them.
    std::vector<std::pair<Scenario, std::size_t>> starts;  // a scenario and the model's index in it
    if (best_.models.size() > 1) {
      std::size_t at = m;
      Scenario alone = only_model(best_, at);
      starts.emplace_back(std::move(alone), at);
    }
    starts.emplace_back(best_, m);
    for (const auto& [start, mi] : starts)
    for (const Bytes pad : sizes) {
      for (const bool first : {true, false}) {
        if (!keep && !first) continue;
        // As many pads as carry the sum at about 2 MiB each; a candidate that keeps the signature
        // but falls short of the margin gets the pads it lacked, twice at most.
        std::uint64_t n = std::max<std::uint64_t>(1, (sum + 2 * MiB - 1024) / (2 * MiB - 512));
        for (int attempt = 0; attempt < 3 && within_budget(); ++attempt) {
          const Scenario c = with_pads(start, mi, keep ? &*keep : nullptr, first, pad, n);
          const std::string what = fmt::format("{}{} x [{} {}]{}", keep ? keep->name + " + " : "", n, exact_size_text(pad),
                                               dtype_name(c.models[mi].compute), start.models.size() < best_.models.size() ? ", the other models dropped" : "");
          std::int64_t short_by = 0;
          if (try_pads(c, what, short_by)) {
            shrink_pads(mi, keep ? 1 : 0);
            padded_id_ = best_.models[mi].id;
            return true;
          }
          if (short_by <= 0) break;
          n += static_cast<std::uint64_t>(short_by + short_by / 4) / (2 * MiB - 512) + 1;
        }
      }
    }
    return false;
  }
  // Class B's compact form: the async-offload overlap is made of the transfer copies of the
  // modules in flight at once (the offload streams' prefetch: streams + 1 modules), so the repro
  // is the largest of them repeated, NAME.0 ... NAME.(N-1) (one "repeat" entry), all offloaded:
  // streams + 2 copies, the last being the one whose copy no longer fits ("6 x
  // model.layers.24.mlp.down_proj on 4 offload streams"); the later passes may trim copies and
  // streams. The overlap grows with the streams, so more streams are tried too (ComfyUI's
  // --async-offload N); the card is searched as for pads.
  bool overlap_form() {
    if (class_ != "async-offload overlap" || best_verdict_.stage >= best_.stages.size()) return false;
    const std::size_t m = best_.stages[best_verdict_.stage].model;
    std::optional<Module> mod;
    {
      const std::optional<Plan> plan = plan_of(best_);
      if (!plan) return false;
      const Program prog = lower(best_, *plan);
      if (best_verdict_.op >= prog.ops.size()) return false;
      std::vector<std::uint8_t> live(prog.buffers.size(), 0);
      for (std::uint32_t i = 0; i <= best_verdict_.op; ++i) {
        const Op& op = prog.ops[i];
        if (op.buffer >= prog.buffers.size() || op.when != When::always) continue;
        if (op.kind == OpKind::alloc) live[op.buffer] = 1;
        if (op.kind == OpKind::free) live[op.buffer] = 0;
      }
      std::map<std::uint32_t, Bytes> transfer;  // module -> its live transfer bytes
      for (std::size_t b = 0; b < prog.buffers.size(); ++b) {
        const Buffer& buf = prog.buffers[b];
        if (live[b] && buf.kind == BufferKind::transfer && buf.model == m && buf.module != kNone) transfer[buf.module] += buf.bytes;
      }
      Bytes largest = 0;
      for (const auto& [i, bytes] : transfer) {
        if (bytes > largest) {
          largest = bytes;
          mod = best_.models[m].spec->modules[i];
        }
      }
    }
    if (!mod) return false;
    std::size_t at = m;
    const Scenario alone = only_model(best_, at);
    const std::string base = mod->name;
    const std::uint32_t now = std::max<std::uint32_t>(1, best_.streams());
    std::vector<std::uint32_t> streams{now};
    for (const std::uint32_t n : {2u, 4u, 8u}) {
      if (n > now) streams.push_back(n);
    }
    for (const std::uint32_t n : streams) {
      if (!within_budget()) break;
      Scenario c = alone;
      c.offload_streams = n;
      ModelSpec& spec = editable(c, at);
      spec.modules.clear();
      for (std::uint32_t k = 0; k < n + 2; ++k) {
        Module copy = *mod;
        copy.name = fmt::format("{}.{}", base, k);
        spec.modules.push_back(std::move(copy));
      }
      refinalize(c, at);
      // The card where the copies are all offloaded: what the plan needs with nothing resident
      // (its prediction on a card too small for any module), and half a module more.
      const Bytes fixed = c.device.used_by_others + c.device.context_overhead;
      Scenario tiny = c;
      tiny.device.total = fixed + 64 * MiB;
      Plan plan;
      try {
        validate_scenario(tiny);
        plan = predict(tiny);
      } catch (const InputError&) {
        continue;  // not a case this model can make (never run, never counted)
      } catch (const PredictorError& e) {
        if (e.fatal()) exhausted_ = true;
        if (exhausted_) return false;
        continue;  // the predictor failed on this one: try the next module
      }
      Bytes need = 0;
      for (const StagePlan& sp : plan.stages) need = std::max(need, sp.predicted_peak);
      c.device.total = (fixed + need + plan.reserve + mod->bytes / 2) / MiB * MiB;
      std::int64_t short_by = 0;
      if (try_pads(c, fmt::format("{} x {} on {} offload streams", n + 2, base, n), short_by, false)) {
        padded_id_ = best_.models[at].id;
        return true;
      }
    }
    return false;
  }

  // A pad candidate as it is, with the device shrunk by the bytes it dropped (the pressure kept),
  // and, for an OOM whose candidate only exceeds its prediction (the same phase, activity and
  // allocator: the card is too large for it now), with the card's available memory between the
  // prediction plus the reserve and the measured peak, where the plan fits and the peak does not.
  // `short_by`: how far the closest miss with the signature fell below the margin.
  bool try_pads(const Scenario& c, const std::string& what, std::int64_t& short_by, bool shrink_by_dropped = true) {
    // `seen` keeps the verdict of a candidate that ran; one that did not (cached, invalid, out of
    // budget) leaves it empty and is not searched from.
    auto probe = [&](const Scenario& d, const std::string& label, Verdict& seen) {
      Verdict v;
      if (interesting(d, &v, &seen)) return adopt(d, v, label);
      if (same_finding(seen)) short_by = std::max(short_by, margin_ - seen.overshoot);
      return false;
    };
    std::vector<std::pair<Scenario, Verdict>> tried;
    tried.emplace_back(c, Verdict{});
    if (probe(c, what, tried.back().second)) return true;
    Bytes now = 0, before = 0;
    for (const ModelRef& mr : c.models) now += mr.spec->bytes;
    for (const ModelRef& mr : best_.models) before += mr.spec->bytes;
    if (shrink_by_dropped && now < before && c.device.total > before - now + MiB) {
      Scenario d = c;
      d.device.total -= before - now;
      tried.emplace_back(d, Verdict{});
      if (probe(d, what + ", device shrunk by the bytes dropped", tried.back().second)) return true;
    }
    // A knee of an OOM needs the card as tight as an OOM does.
    const bool oom = sig_.rfind("oom:", 0) == 0 || (sig_.rfind("knee:", 0) == 0 && best_verdict_.knee_small.rfind("oom:", 0) == 0);
    if (!oom) return false;
    // An OOM needs the card as tight as the original's: search its size between what the plan
    // needs (below that the OOM is expected) and the candidate's. A pass, a violation or an OOM at
    // an op after the one the signature names means the card is still too large; an expected OOM,
    // or one before that op, too small.
    // A violation names its own window: a card whose available memory lies between its
    // prediction plus the reserve and its measured peak still lets the plan fit and makes the
    // peak fail. The plan can move with the card (cond batching, a partial load), so each
    // violation seen on the way re-aims the next probe at its own window; otherwise bisect.
    // (A knee's OOM is its smaller half's, whose plan the larger half's violation does not tell.)
    const bool own_oom = sig_.rfind("oom:", 0) == 0;
    const auto window = [own_oom](const Scenario& d, const Verdict& v) -> Bytes {
      if (!own_oom || v.kind != VerdictKind::violation || v.overshoot < static_cast<std::int64_t>(2 * MiB)) return 0;
      const Bytes fixed = d.device.used_by_others + d.device.context_overhead;
      return (fixed + v.predicted + v.reserve + static_cast<Bytes>(v.overshoot) / 2) / MiB * MiB;
    };
    for (const auto& [base, v] : tried) {
      if (v.message.empty() || v.kind == VerdictKind::error) continue;  // not run, or an error
      const Bytes fixed = base.device.used_by_others + base.device.context_overhead;
      Bytes lo = fixed + v.predicted + v.reserve;
      Bytes hi = base.device.total;
      Bytes aim = window(base, v);
      for (int step = 0; step < 10 && lo + MiB < hi && within_budget(); ++step) {
        Scenario d = base;
        d.device.total = aim > lo && aim < hi ? aim : (lo + (hi - lo) / 2) / MiB * MiB;
        aim = 0;
        if (d.device.total <= lo || d.device.total >= hi) break;
        Verdict seen;
        if (probe(d, fmt::format("{}, device {}", what, format_size(d.device.total)), seen)) return true;
        if (seen.message.empty()) break;  // not run (cached, out of budget)
        if (seen.expected_oom || fails_before_the_target(d, seen)) {
          lo = d.device.total;
        } else {
          hi = d.device.total;
          // The plan on this card may need less than the one the search began from.
          if (own_oom) lo = std::min(lo, fixed + seen.predicted + seen.reserve);
        }
        aim = window(d, seen);
      }
    }
    return false;
  }

  // An OOM the candidate met before it reached the op the signature names (a LoRA patch's
  // module OOMing at its dequant, the op just before): the card is too small for it, not too
  // large. The op is found in the candidate's own program: the first allocation of the judged
  // stage with the signature's phase and activity.
  bool fails_before_the_target(const Scenario& c, const Verdict& v) {
    if (v.kind != VerdictKind::oom || v.signature == sig_ || sig_.rfind("oom:", 0) != 0) return false;
    if (v.stage != best_verdict_.stage) return v.stage < best_verdict_.stage;
    const std::size_t from = sig_.find(':') + 1, to = sig_.rfind(':');
    if (to <= from) return false;
    const std::string_view what = std::string_view(sig_).substr(from, to - from);  // "forward:lora"
    const std::optional<Plan> plan = plan_of(c);
    if (!plan) return false;
    const Program prog = lower(c, *plan);
    for (std::uint32_t i = 0; i < prog.ops.size(); ++i) {
      const Op& op = prog.ops[i];
      if (op.stage != v.stage || op.kind != OpKind::alloc) continue;
      if (fmt::format("{}:{}", phase_name(op.phase), op_activity(c, prog, i)) == what) return v.op < i;
    }
    return false;
  }

  // A catalog model that kept more than a handful of modules reads better as the catalog
  // reference with the modules it keeps (its name, its storage dtype, "keep" / "drop") than as
  // an inline listing: where the passes edited it beyond dropping modules (plainer dtypes, no
  // biases) but its modules still carry the catalog's names, the catalog's own modules of those
  // names are tried instead, once, outside the budget; kept where the signature holds.
  void recatalog() {
    for (std::size_t m = 0; m < best_.models.size(); ++m) {
      const ModelRef& r = best_.models[m];
      const auto origin = std::find_if(s_models_.begin(), s_models_.end(),
                                       [&](const ModelRef& o) { return o.id == r.id && o.source.rfind("catalog:", 0) == 0; });
      if (origin == s_models_.end() || r.source != "inline" || r.spec->modules.size() <= 8) continue;
      const std::shared_ptr<const ModelSpec> whole = origin->catalog_full ? origin->catalog_full : origin->spec;
      const ModelSpec& full = *whole;
      std::set<std::string> names;
      for (const Module& mod : r.spec->modules) names.insert(mod.name);
      auto sub = std::make_shared<ModelSpec>(full);
      sub->modules.clear();
      for (const Module& mod : full.modules) {
        if (names.count(mod.name)) sub->modules.push_back(mod);
      }
      if (sub->modules.size() != names.size()) continue;  // renamed (pads): not the catalog's modules
      finalize_model(*sub, "shrink");
      Scenario c = best_;
      ModelRef& e = c.models[m];
      e.source = origin->source;  // "catalog:NAME", with the original's storage choice
      e.storage = origin->storage;
      e.storage_given = origin->storage_given;
      e.catalog_source = e.source;
      e.catalog_full = whole;
      e.spec = std::move(sub);
      // The catalog's modules weigh what the passes took off them (biases) or put on (plainer
      // dtypes): on a card the passes fitted to the edited modules, move the card by the
      // difference so the pressure stays the same.
      const std::int64_t delta = static_cast<std::int64_t>(c.models[m].spec->bytes) - static_cast<std::int64_t>(r.spec->bytes);
      for (const std::int64_t extra : {std::int64_t{0}, delta}) {
        if (extra < 0 && c.device.total <= static_cast<Bytes>(-extra) + MiB) break;
        Scenario d = c;
        d.device.total = static_cast<Bytes>(static_cast<std::int64_t>(d.device.total) + extra);
        const CaseResult res = run_case(d, backend_, false);
        spdlog::trace("shrink: {} as {}{}: {} {:+.2f} MiB", r.id, e.source, extra ? " (device moved)" : "", res.verdict.signature,
                      static_cast<double>(res.verdict.overshoot) / static_cast<double>(MiB));
        if (keeps(res.verdict)) {
          best_ = d;
          best_verdict_ = res.verdict;
          log_.push_back(fmt::format("{} as {} with {} of its {} modules{}", r.id, best_.models[m].source, best_.models[m].spec->modules.size(),
                                     full.modules.size(), extra ? fmt::format(", the device {} by the bytes they differ by", extra > 0 ? "grown" : "shrunk") : ""));
          break;
        }
        if (delta == 0) break;
      }
    }
  }

  // Pads (and waste's blocks) the module passes dropped from the middle leave gaps in their numbering, which the
  // scenario can then not write as one "repeat" entry: number them again from 0, where that keeps
  // the verdict (identical modules, so it does; checked once, outside the budget).
  void renumber_pads() {
    for (std::size_t m = 0; m < best_.models.size(); ++m) {
      for (const std::string_view base : {"pad.", "block."}) {
        const ModelSpec& spec = *best_.models[m].spec;
        std::uint64_t k = 0;
        bool gaps = false;
        for (const Module& mod : spec.modules) {
          if (!mod.name.starts_with(base)) continue;
          gaps = gaps || mod.name != fmt::format("{}{}", base, k);
          ++k;
        }
        if (!gaps) continue;
        // Only the shrinker's own runs: every module of the prefix identical (a model of the
        // user's that names modules "pad.N" differently is left as it is).
        const Module* first = nullptr;
        bool identical = true;
        for (const Module& mod : spec.modules) {
          if (!mod.name.starts_with(base)) continue;
          if (!first) first = &mod;
          identical = identical && same_contents(mod, *first);
        }
        if (!identical) continue;
        Scenario c = best_;
        ModelSpec& e = editable(c, m);
        k = 0;
        for (Module& mod : e.modules) {
          if (mod.name.starts_with(base)) mod.name = fmt::format("{}{}", base, k++);
        }
        refinalize(c, m);
        const CaseResult r = run_case(c, backend_, false);
        if (keeps(r.verdict)) {
          best_ = c;
          best_verdict_ = r.verdict;
          log_.push_back(fmt::format("{}N numbered from 0 (one run)", base));
        }
      }
    }
  }

  // The pads toward fewer: halve the excess while the signature holds (with the device shrunk by
  // the pads' bytes where plainly fewer do not fail). `kept`: the modules that are not pads.
  void shrink_pads(std::size_t m, std::size_t kept) {
    std::uint64_t lo = 1;
    while (within_budget()) {
      const ModelSpec& spec = *best_.models[m].spec;
      if (spec.modules.size() <= kept) break;
      const std::uint64_t n = spec.modules.size() - kept;
      if (n <= lo) break;
      const std::uint64_t to = lo + (n - lo) / 2;
      const bool first = kept == 0 || spec.modules[0].name.rfind("pad.", 0) != 0;
      const Module* keep = kept ? &spec.modules[first ? 0 : spec.modules.size() - 1] : nullptr;
      const Bytes pad = spec.modules[first && kept ? 1 : 0].bytes;
      Scenario c = with_pads(best_, m, keep, first, pad, to);
      const std::string what = fmt::format("{} pads", to);
      if (accept(c, what)) continue;
      const Bytes dropped = (n - to) * pad;
      if (c.device.total > dropped + MiB) {
        c.device.total -= dropped;
        if (accept(c, what + ", device shrunk by their bytes")) continue;
      }
      lo = to + 1;
    }
  }

  // Hypothesis' "redistribute across a sum": when the overshoot is the sum of many small parts
  // (allocator rounding of every tensor), no module can go alone. Keep only the module the peak
  // op works on, and give it the bytes of the ones dropped (its outer dimension scaled up), so the
  // pressure stays while the case shrinks to one module.
  bool redistribute_into_the_peak() {
    const std::optional<Plan> plan = plan_of(best_);
    if (!plan) return false;
    const Program prog = lower(best_, *plan);
    if (best_verdict_.op >= prog.ops.size()) return false;
    const Op& op = prog.ops[best_verdict_.op];
    if (op.buffer == kNone) return false;
    const Buffer& buf = prog.buffers[op.buffer];
    if (buf.module == kNone || buf.tensor == kNone) return false;
    const ModelSpec& model = *best_.models[buf.model].spec;
    if (model.modules.size() < 2) return false;
    const Module& peak = model.modules[buf.module];
    const Tensor& weight = peak.tensors[buf.tensor];
    if (weight.shape.size() < 2 || peak.bytes == 0) return false;
    // All the bytes first; if that tips the case into another failure (an OOM instead of a
    // violation), smaller factors.
    const std::uint64_t all = std::max<std::uint64_t>(2, model.bytes / peak.bytes);
    for (std::uint64_t factor : {all, std::uint64_t{8}, std::uint64_t{4}, std::uint64_t{2}, std::uint64_t{1}}) {
      if (factor > all || (factor != all && factor * 2 > all && factor != 1)) continue;
      Scenario c = best_;
      ModelSpec& spec = editable(c, buf.model);
      Module grown = spec.modules[buf.module];
      grown.tensors[buf.tensor].shape[0] = weight.shape[0] * factor;
      spec.modules = {std::move(grown)};
      refinalize(c, buf.model);
      const std::string what = fmt::format("only {} left, {}x its rows", peak.name, factor);
      if (accept(c, what)) return true;
      // The device search may already have cut the device to the bone: give it the growth (the
      // weight and up to two compute copies of it) so the case stays a violation, not an OOM.
      const Bytes growth = (factor - 1) * (weight.bytes + 2 * weight.numel * compute_elem_bytes(c.models[buf.model].compute));
      if (factor > 1 && c.device.total < (Bytes{1} << 50) - growth) {
        c.device.total += growth;
        if (accept(c, what + ", device grown to match")) return true;
      }
    }
    return false;
  }

  bool drop_models() {
    bool any = false;
    for (std::size_t i = best_.models.size(); i-- > 0 && best_.models.size() > 1;) {
      const std::string id = best_.models[i].id;
      const Bytes bytes = best_.models[i].spec->bytes;
      Scenario c = without_model(best_, static_cast<std::uint32_t>(i));
      if (accept(c, fmt::format("drop model {}", id))) {
        any = true;
        continue;
      }
      // A model resident during the judged stage was ballast: keep the pressure without it.
      if (c.device.total <= bytes + MiB) continue;
      c.device.total -= bytes;
      any |= accept(c, fmt::format("drop model {} and its bytes from the device", id));
    }
    return any;
  }

  bool drop_stages() {
    bool any = false;
    // Everything after the judged stage cannot matter.
    if (best_verdict_.stage + 1 < best_.stages.size()) {
      Scenario c = best_;
      c.stages.resize(best_verdict_.stage + 1);
      any |= accept(c, "drop the stages after the failing one");
    }
    for (std::size_t i = best_.stages.size(); i-- > 0;) {
      if (i >= best_.stages.size() || i == best_verdict_.stage) continue;
      Scenario c = best_;
      c.stages.erase(c.stages.begin() + static_cast<std::ptrdiff_t>(i));
      any |= accept(c, fmt::format("drop stage {} ({})", i, stage_op_name(best_.stages[i].op)));
    }
    return any;
  }

  // A private, editable copy of model m (a catalog model becomes inline).
  // A catalog model being edited is inline until refinalize finds it a subset of the catalog
  // model again (modules dropped, nothing else changed): then it is written as the catalog
  // reference with "keep" / "drop", in the user's terms.
  static ModelSpec& editable(Scenario& c, std::size_t m) {
    ModelRef& r = c.models[m];
    auto copy = std::make_shared<ModelSpec>(*r.spec);
    if (r.source.rfind("catalog:", 0) == 0) {
      if (!r.catalog_full) r.catalog_full = r.spec;
      r.catalog_source = r.source;
    }
    if (r.source != "inline") {
      copy->source = "inline";
      r.source = "inline";
    }
    ModelSpec& ref = *copy;
    r.spec = std::move(copy);
    return ref;
  }

  static void refinalize(Scenario& c, std::size_t m) {
    ModelRef& r = c.models[m];
    auto copy = std::make_shared<ModelSpec>(*r.spec);
    finalize_model(*copy, "shrink");
    if (r.catalog_full) {
      if (is_module_subset(*copy, *r.catalog_full)) {
        copy->source = r.catalog_full->source;
        r.source = r.catalog_source;
      } else {
        r.catalog_full.reset();  // edited beyond dropping modules: an inline model from now on
        r.catalog_source.clear();
      }
    }
    r.spec = std::move(copy);
  }

  // Bisection over the modules: remove halves, then quarters, ... Each chunk is tried as is, and
  // with the device shrunk by the removed bytes (so the remaining modules keep the same memory
  // pressure: most removed modules were resident ballast). Two orders: the module list (a block's
  // modules together), then the loader's walk order from its end (the modules it moves last, the
  // smallest: an overshoot summed over many small modules keeps failing without the ones loaded
  // after the failure, which the list order scatters over every block), when the list is stuck.
  bool bisect_modules(std::size_t m) {
    // A model the rounding route rewrote as [the peak's module] + N pads has had its count
    // searched already: dropping pads in chunks only spends the budget.
    if (!padded_id_.empty() && best_.models[m].id == padded_id_) return false;
    std::vector<std::uint32_t> list(best_.models[m].spec->modules.size());
    for (std::uint32_t i = 0; i < list.size(); ++i) list[i] = i;
    // The walk-order sweep only when the list order is stuck: a local minimum of the list order
    // is where it helps, and elsewhere it would spend the budget the other passes need.
    if (bisect_in_order(m, std::move(list), false)) return true;
    std::vector<std::uint32_t> walk;
    const std::optional<Plan> plan = plan_of(best_);
    if (!plan) return false;
    for (const LoadPlan& lp : plan->loads) {
      if (lp.model == m) {
        walk = lp.sorted;
        break;
      }
    }
    return walk.size() > 1 && bisect_in_order(m, std::move(walk), true);
  }

  // Sends `c` to the external predictor now, to be claimed by interesting(c): a candidate the
  // shrinker will run next unless the one before it is accepted. Nothing for a built-in predictor,
  // a candidate that would not run (invalid, seen before, past the budget) or one already sent.
  // False only when kCasesSentAhead requests are out already: ask again once one is claimed.
  bool send_ahead(const Scenario& c) {
    if (c.policy.predictor != PredictorKind::external) return true;
    if (ahead_.size() >= kCasesSentAhead) return false;
    if (execs_ + ahead_.size() + 1 >= opt_.max_execs) return true;
    try {
      validate_scenario(c);
    } catch (const InputError&) {
      return true;
    }
    const ScenarioFingerprint key = scenario_fingerprint(c, &memo_);
    if (cache_.contains(key) || ahead_.contains(key)) return true;
    SentAhead sent = send_external_ahead(c);
    if (sent.sent()) ahead_.emplace(key, std::move(sent));
    return true;
  }

  // Bisection over `order` (module indices of model m; chunks are ranges of positions in it).
  // Each chunk is tried as it is, then (where the card allows) with its bytes taken off the card.
  // Most tries are rejected, so with an external predictor the tries that would follow a
  // rejection are built and sent ahead while this one runs; an acceptance abandons them.
  bool bisect_in_order(std::size_t m, std::vector<std::uint32_t> order, bool walk) {
    constexpr std::size_t kMaxChunksPerLevel = 32;  // frugal: no sweep finer than n/32
    // Tries built at once: the one to run, and for an external predictor those sent ahead of it.
    const std::size_t depth = best_.policy.predictor == PredictorKind::external ? kCasesSentAhead + 1 : 1;
    struct Try {
      std::size_t done;  // the chunk's place in the sweep
      std::size_t start, len;
      std::vector<std::uint32_t> drop;  // module indices, ascending
      Scenario c;
      std::string what;
      bool sent = false;  // sent ahead (or found not to be sendable)
    };
    bool any = false;
    std::size_t n = order.size();
    for (std::size_t chunk = std::max<std::size_t>(1, n / 2); chunk >= 1 && n > 1 && within_budget(); chunk /= 2) {
      if (n / chunk > kMaxChunksPerLevel) break;
      std::deque<Try> tries;  // what follows if each try before it is rejected, in order
      std::size_t next = 0;   // the sweep position of the first chunk not in `tries`
      // The chunk at sweep position `done`: its try, and the same with its bytes off the card.
      const auto push_chunk = [&](std::size_t done) {
        // The walk order is swept from its end: the modules loaded last go first.
        const std::size_t len = std::min(chunk, n - done);
        const std::size_t start = walk ? n - done - len : done;
        std::vector<std::uint32_t> drop(order.begin() + static_cast<std::ptrdiff_t>(start),
                                        order.begin() + static_cast<std::ptrdiff_t>(start + len));
        std::sort(drop.begin(), drop.end());
        Scenario c = best_;
        ModelSpec& spec = editable(c, m);
        Bytes removed = 0;
        for (auto it = drop.rbegin(); it != drop.rend(); ++it) {
          removed += spec.modules[*it].bytes;
          spec.modules.erase(spec.modules.begin() + static_cast<std::ptrdiff_t>(*it));
        }
        refinalize(c, m);
        std::string what = walk ? fmt::format("drop walk positions [{}, {}) of {} (of {}; the loader moves them {})", start, start + len,
                                              c.models[m].id, n, start + len == n ? "last" : "in order")
                                : fmt::format("drop modules [{}, {}) of {}", start, start + len, c.models[m].id);
        // The same with the chunk's bytes off the card, where the card allows it.
        std::optional<Scenario> lighter;
        if (c.device.total > removed + MiB) {
          lighter = c;
          lighter->device.total -= removed;
          if (lighter->device.available() == 0) lighter.reset();
        }
        tries.push_back(Try{done, start, len, drop, std::move(c), what, false});
        if (lighter) tries.push_back(Try{done, start, len, std::move(drop), std::move(*lighter), what + " and their bytes from the device", false});
      };
      while (within_budget()) {
        while (tries.size() < depth && next < n && n - std::min(chunk, n - next) >= 1) {
          push_chunk(next);
          next += std::min(chunk, n - next);
        }
        if (tries.empty()) break;
        // The front one too: sent last, it would wait behind the others' replies.
        for (Try& t : tries) {
          if (!t.sent) t.sent = send_ahead(t.c);
        }
        Try t = std::move(tries.front());
        tries.pop_front();
        if (!accept(t.c, t.what)) continue;
        any = true;
        // The remaining positions, renumbered to the modules' new indices; the sweep goes on at
        // the same position, over what is left.
        tries.clear();
        order.erase(order.begin() + static_cast<std::ptrdiff_t>(t.start), order.begin() + static_cast<std::ptrdiff_t>(t.start + t.len));
        for (std::uint32_t& i : order) {
          i -= static_cast<std::uint32_t>(std::lower_bound(t.drop.begin(), t.drop.end(), i) - t.drop.begin());
        }
        n -= t.len;
        next = t.done;
      }
      ahead_.clear();  // tries of this level that were sent and not run
      if (chunk == 1) break;
    }
    return any;
  }

  bool drop_tensors() {
    bool any = false;
    for (std::size_t m = 0; m < best_.models.size(); ++m) {
      for (TensorRole role : {TensorRole::bias, TensorRole::norm, TensorRole::other, TensorRole::scale}) {
        Scenario c = best_;
        ModelSpec& spec = editable(c, m);
        bool changed = false;
        for (Module& mod : spec.modules) {
          auto keep_end = std::remove_if(mod.tensors.begin(), mod.tensors.end(), [&](const Tensor& t) { return t.role == role; });
          if (keep_end != mod.tensors.end() && keep_end != mod.tensors.begin()) {
            mod.tensors.erase(keep_end, mod.tensors.end());
            changed = true;
          }
        }
        if (!changed) continue;
        refinalize(c, m);
        any |= accept(c, fmt::format("drop every {} tensor of {}", role_name(role), c.models[m].id));
      }
    }
    return any;
  }

  bool simplify_workload() {
    bool any = false;
    // A knee pair (knee_of) differs from its workload in size only: the same change goes to both
    // (one that makes them equal is refused by validation, and the pair stays as it is).
    auto try_set = [&](auto mutate, const std::string& what) {
      Scenario c = best_;
      mutate(c.workload);
      if (c.knee_of) mutate(*c.knee_of);
      if (!(scenario_fingerprint(c, &memo_) == scenario_fingerprint(best_, &memo_))) any |= accept(c, what);
    };
    // The larger workload of a knee pair toward the smaller, one dimension at a time: the repro
    // names the smallest step that still passes.
    if (best_.knee_of) {
      using Dim = std::uint32_t Workload::*;
      for (const auto& [dim, name] : {std::pair<Dim, const char*>{&Workload::width, "width"}, {&Workload::height, "height"},
                                      {&Workload::batch, "batch"}, {&Workload::frames, "frames"}}) {
        const std::uint32_t lo = best_.workload.*dim;
        const std::uint32_t hi = (*best_.knee_of).*dim;
        if (hi <= lo) continue;
        for (const std::uint32_t to : {lo, lo + (hi - lo) / 2}) {
          if (to >= (*best_.knee_of).*dim) continue;
          Scenario c = best_;
          (*c.knee_of).*dim = to;
          if (accept(c, fmt::format("knee_of {} {}", name, to))) {
            any = true;
            break;
          }
        }
      }
    }
    try_set([](Workload& w) { w.batch = 1; }, "batch 1");
    try_set([](Workload& w) { w.frames = 1; }, "frames 1");
    try_set([](Workload& w) { w.cfg = 1.0; }, "cfg 1");
    try_set([](Workload& w) { w.text_tokens = 0; }, "default text tokens");
    try_set([](Workload& w) { w.steps = 1; }, "1 step");
    if (best_.workload.steps > 2) try_set([](Workload& w) { w.steps = 2; }, "2 steps");
    // A knee pair keeps its resolution (moving the smaller half alone would widen the pair; the
    // larger half narrows toward it above).
    for (std::uint32_t side : {256u, 512u, 768u, 1024u}) {
      if (best_.knee_of || side >= std::max(best_.workload.width, best_.workload.height)) break;
      if (accept_workload_side(side)) {
        any = true;
        break;
      }
    }
    for (std::size_t m = 0; m < best_.models.size(); ++m) {
      if (!best_.models[m].lora) continue;
      Scenario c = best_;
      c.models[m].lora = false;
      any |= accept(c, fmt::format("no LoRA on {}", c.models[m].id));
    }
    return any;
  }

  bool accept_workload_side(std::uint32_t side) {
    Scenario c = best_;
    c.workload.width = c.workload.height = side;
    return accept(c, fmt::format("{}x{}", side, side));
  }

  bool simplify_dtypes() {
    bool any = false;
    for (std::size_t m = 0; m < best_.models.size(); ++m) {
      if (best_.models[m].compute != Dtype::bf16) {
        Scenario c = best_;
        c.models[m].compute = Dtype::bf16;
        any |= accept(c, fmt::format("compute bf16 on {}", c.models[m].id));
      }
      // Each stored dtype toward a plainer one (all tensors of that dtype at once).
      std::vector<Dtype> present;
      for (const Module& mod : best_.models[m].spec->modules) {
        for (const Tensor& t : mod.tensors) {
          if (std::find(present.begin(), present.end(), t.dtype) == present.end()) present.push_back(t.dtype);
        }
      }
      for (Dtype from : present) {
        for (Dtype to : kPlainness) {
          if (plainness(to) >= plainness(from)) break;
          Scenario c = best_;
          ModelSpec& spec = editable(c, m);
          for (Module& mod : spec.modules) {
            for (Tensor& t : mod.tensors) {
              if (t.dtype == from) t.dtype = to;
            }
          }
          refinalize(c, m);
          if (accept(c, fmt::format("{} tensors of {} stored as {}", dtype_name(from), c.models[m].id, dtype_name(to)))) {
            any = true;
            break;
          }
        }
      }
    }
    return any;
  }

  // Dynamic VRAM's extras: other processes' events, block prefetch, legacy patchers.
  bool simplify_dynamic() {
    bool any = false;
    for (std::size_t i = best_.device.events.size(); i-- > 0;) {
      if (i >= best_.device.events.size()) continue;
      Scenario c = best_;
      c.device.events.erase(c.device.events.begin() + static_cast<std::ptrdiff_t>(i));
      // What is given back later cannot be more than what is still held.
      Bytes held = c.device.used_by_others;
      std::erase_if(c.device.events, [&](OthersEvent& e) {
        if (e.take) {
          held += e.bytes;
          return false;
        }
        e.bytes = std::min(e.bytes, held);
        held -= e.bytes;
        return e.bytes == 0;
      });
      any |= accept(c, fmt::format("drop other processes' event {}", i));
    }
    // Earlier events: a shorter case (fewer modules, fewer steps) still reaches them.
    for (int tries = 0; tries < 16 && !best_.device.events.empty() && best_.device.events.back().at_us > 1000; ++tries) {
      Scenario c = best_;
      for (OthersEvent& e : c.device.events) e.at_us /= 2;
      if (!accept(c, "other processes' events at half the time")) break;
      any = true;
    }
    for (std::size_t m = 0; m < best_.models.size(); ++m) {
      if (best_.models[m].prefetch) {
        Scenario c = best_;
        c.models[m].prefetch = false;
        any |= accept(c, fmt::format("no prefetch on {}", c.models[m].id));
      }
      if (best_.models[m].legacy) {
        Scenario c = best_;
        c.models[m].legacy = false;
        any |= accept(c, fmt::format("{} through ModelPatcherDynamic", c.models[m].id));
      }
    }
    return any;
  }

  bool simplify_allocator_and_streams() {
    bool any = false;
    for (std::size_t i = best_.allocator.options.size(); i-- > 0;) {
      Scenario c = best_;
      const std::string key = c.allocator.options[i].first;
      c.allocator.options.erase(c.allocator.options.begin() + static_cast<std::ptrdiff_t>(i));
      any |= accept(c, fmt::format("default {}", key));
    }
    const std::uint32_t streams = best_.streams();
    for (std::uint32_t v = 0; v < streams; ++v) {
      Scenario c = best_;
      c.offload_streams = v;
      if (accept(c, fmt::format("{} offload streams", v))) {
        any = true;
        break;
      }
    }
    if (best_.seed != 0) {
      Scenario c = best_;
      c.seed = 0;
      any |= accept(c, "seed 0");
    }
    return any;
  }

  // The smallest device that still fails: others and context folded out first, then a binary
  // search over whole MiB.
  bool shrink_device() {
    bool any = false;
    if (best_.device.used_by_others > 0) {
      Scenario c = best_;
      c.device.total -= c.device.used_by_others;
      c.device.used_by_others = 0;
      any |= accept(c, "nothing else on the device");
    }
    std::uint64_t hi = best_.device.total / MiB;  // known to fail (rounded down: tried first)
    const std::uint64_t floor_mib = (best_.device.used_by_others + best_.device.context_overhead) / MiB + 2;
    if (best_.device.total % MiB != 0) {
      Scenario c = best_;
      c.device.total = hi * MiB;
      if (!accept(c, fmt::format("device {} MiB", hi))) return any;
      any = true;
    }
    std::uint64_t lo = floor_mib;  // lo: not known to fail
    // Precision: 1/64 of the range, rounded to a power-of-two MiB (the answer is a device size a
    // person reads, not a knife edge): about six executions instead of twelve.
    const std::uint64_t step = std::max<std::uint64_t>(1, floor_pow2((hi - std::min(hi, lo)) / 64));
    while (lo + step < hi && within_budget()) {
      std::uint64_t mid = lo + (hi - lo) / 2;
      mid -= mid % step;
      if (mid <= lo) mid = lo + step;
      Scenario c = best_;
      c.device.total = mid * MiB;
      if (accept(c, fmt::format("device {} MiB", mid))) {
        hi = mid;
        any = true;
      } else {
        lo = mid;
      }
    }
    return any;
  }

  // Shapes toward round powers of two (each dimension down to the power of two below it).
  bool round_shapes() {
    bool any = false;
    for (std::size_t m = 0; m < best_.models.size(); ++m) {
      Scenario c = best_;
      ModelSpec& spec = editable(c, m);
      bool changed = false;
      for (Module& mod : spec.modules) {
        for (Tensor& t : mod.tensors) {
          for (std::size_t i = 0; i < t.shape.size(); ++i) {
            const std::uint64_t p = floor_pow2(t.shape[i]);
            // A block-quantized row must stay a whole number of blocks (32 and 256 are powers of 2).
            const bool row = i + 1 == t.shape.size();
            if (p != t.shape[i] && (!row || p >= dtype_info(t.dtype).block_elems)) {
              t.shape[i] = p;
              changed = true;
            }
          }
        }
      }
      if (!changed) continue;
      refinalize(c, m);
      any |= accept(c, fmt::format("power-of-two shapes in {}", c.models[m].id));
    }
    return any;
  }

  Backend& backend_;
  ShrinkOptions opt_;
  std::chrono::steady_clock::time_point start_;
  std::string sig_;
  std::string class_;  // mechanism_class of the original: kept by every accepted candidate
  std::string family_;  // cause_family of the original: likewise
  std::int64_t margin_ = 0;
  std::string padded_id_;  // the model repeat_worst_module rewrote (by id: drop_models moves indices)
  std::vector<ModelRef> s_models_;  // the original's models: a catalog model's whole spec and storage choice
  std::int64_t largest_ = 0;
  Scenario best_;
  std::uint64_t best_elapsed_us_ = 0;  // the modelled length of best_ (dynamic VRAM runs)
  std::uint64_t last_elapsed_us_ = 0;  // that of the candidate run last
  Verdict best_verdict_;
  // The candidates run so far, by structural fingerprint: whether each kept the signature.
  FingerprintMemo memo_;
  std::unordered_map<ScenarioFingerprint, bool, ScenarioFingerprintHash> cache_;
  // Candidates sent to an external predictor ahead of their run (send_ahead), by fingerprint.
  std::unordered_map<ScenarioFingerprint, SentAhead, ScenarioFingerprintHash> ahead_;
  std::uint64_t execs_ = 0, hits_ = 0, accepted_ = 0;
  bool exhausted_ = false;
  std::vector<std::string> log_;
};

}  // namespace

ShrinkResult shrink(const Scenario& s, Backend& backend, const ShrinkOptions& opt) {
  if (!s.from_log) return Shrinker(backend, opt).run(s);
  // A case from a ComfyUI log: its repro keeps where it came from, not the log's plan lines,
  // which a smaller case no longer has.
  Scenario t = s;
  t.from_log = s.from_log->origin_only();
  return Shrinker(backend, opt).run(t);
}

}  // namespace vf

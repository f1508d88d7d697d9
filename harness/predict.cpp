#include "harness/predict.h"

#include <algorithm>

#include <fmt/format.h>

#include "harness/overhead.h"
#include "harness/predictors/external.h"
#include "harness/predictors/predictors.h"
#include "models/activation.h"

namespace vf {

void size_stage_activation(const Scenario& s, StagePlan& sp) {
  const ModelRef& ref = s.models[sp.model];
  const ModelSpec& m = *ref.spec;
  const std::uint32_t rows = m.kind == ModelKind::text_encoder ? 1 : sp.run_batch;
  sp.activation_formula = activation_working_set(m, s.workload, rows, ref.compute, fmt::format("models[{}]", sp.model));
  // Only a forward allocates activations: the source sizes those (and is only required to cover
  // the models the pipeline runs); load and unload stages show the formula.
  if (sp.op == StageOp::forward) {
    sp.activation = size_activation(s.activations, m, ref.id, ref.compute, s.workload, rows, sp.activation_allowance, sp.activation_formula);
  } else {
    sp.activation = ActivationSizing{sp.activation_formula, ActivationSource::model, false, false, false};
  }
  sp.activation_bytes = sp.activation.bytes;
}

Plan predict(const Scenario& s) {
  if (s.policy.predictor == PredictorKind::external) return predict_external(s);
  Plan plan = plan_comfy_classic(s);
  const bool exact = s.policy.predictor == PredictorKind::exact;
  Bytes limit_need = 0;  // exact with the bound: what the allocator's fraction check can see
  if (exact) refine_exact(s, plan, limit_need);
  plan.dynamic = s.policy.dynamic();
  plan.predicted_peak = 0;
  for (const StagePlan& sp : plan.stages) {
    if (sp.checked) plan.predicted_peak = std::max(plan.predicted_peak, sp.predicted_peak);
  }
  plan.fits = plan.predicted_peak + plan.reserve <= plan.available;
  // `exact` also knows the limit an allocator option puts on the process (a memory fraction).
  if (const auto limit = exact ? allocator_limit(s) : std::nullopt) {
    const Bytes need = limit->on_requested ? plan.predicted_peak : std::max(limit_need, plan.predicted_peak + plan.reserve);
    plan.fits = plan.fits && need <= limit->bytes;
  }
  return plan;
}

namespace {

// MiB, or bytes where two decimals of MiB would print a non-zero size as 0.00 (a BatchNorm's
// statistics are 1 KiB).
std::string mib_or_bytes(Bytes b) { return b > 0 && b < MiB / 100 ? fmt::format("{} B", b) : format_mib(b); }

}  // namespace

std::string format_plan(const Scenario& s, const Plan& p) {
  std::string out = fmt::format("policy {}  reserve {}  offload streams {}  device {} ({} available)\n", p.policy,
                                format_mib(p.reserve), p.streams, format_size(s.device.total), format_mib(p.available));
  if (p.dynamic) {
    const DynamicConstants& d = s.policy.constants.dynamic;
    out += fmt::format("dynamic VRAM: aimdo headroom {} (+ {} --vram-headroom), poll every {} ms, cuMemAlloc hook +{}; "
                       "no predicted peak for dynamic models (docs/dynamic.md)\n",
                       format_mib(d.simple_headroom), format_mib(d.vram_headroom), d.poll_ms, format_mib(d.malloc_headroom));
  }
  for (const LoadPlan& lp : p.loads) {
    const ModelRef& ref = s.models[lp.model];
    out += fmt::format("[stage {}] load {} ({}, {} -> {}, {}): {}\n", lp.stage, ref.id, ref.spec->name,
                       storage_label(ref), dtype_name(ref.compute), format_mib(ref.spec->bytes), lp.log_line);
    for (const Eviction& ev : lp.evictions) {
      out += fmt::format("           evicted {} modules of {} ({})\n", ev.modules.size(), s.models[ev.model].id, format_mib(ev.bytes));
    }
    if (lp.dynamic) {
      const StagingPlan& st = lp.staging;
      out += fmt::format("           VBAR {} requested, {} pages of 32 MiB granted ({}); slices end at {}{}\n",
                         format_mib(st.vbar_request), st.vbar_pages, format_mib(st.vbar_pages * 32 * MiB), format_mib(st.vbar_end),
                         st.slices_beyond_cap ? fmt::format(", {} past the cap (always cast through a buffer)", st.slices_beyond_cap) : "");
      continue;
    }
    if (lp.free_target) out += fmt::format("           next to dynamic models: VBAR pages evicted until {} is free\n", format_mib(lp.free_target));
    if (lp.uncounted > 0) {
      // In neither of the log's figures: where they are is the plan's, not ComfyUI's, to say.
      Bytes on_device = 0;
      for (std::size_t i = 0; i < lp.resident.size(); ++i) on_device += lp.resident[i] ? ref.spec->modules[i].bytes : 0;
      const Bytes there = on_device - lp.loaded;
      out += fmt::format("           uncounted {} (modules without the cast hook: {} on the device, {} in host memory)\n",
                         mib_or_bytes(lp.uncounted), mib_or_bytes(there), mib_or_bytes(lp.uncounted - there));
    }
    if (lp.offloaded > 0) {
      out += fmt::format("           realistic transient {} (module {}) vs buffer {}\n", format_mib(lp.realistic_transient),
                         ref.spec->modules[lp.transient_module].name, format_mib(lp.offload_buffer));
    }
  }
  out += "stage  op       model                resident        buffer      allowance   activation  predicted\n";
  for (const StagePlan& sp : p.stages) {
    out += fmt::format("{:<6} {:<8} {:<20} {:>14} {:>12} {:>12} {:>12} {:>12}{}\n", sp.stage, stage_op_name(sp.op),
                       s.models[sp.model].id, format_mib(sp.resident_total), format_mib(sp.offload_buffer),
                       format_mib(sp.activation_allowance), format_mib(sp.activation_bytes),
                       sp.dynamic ? std::string("dynamic") : format_mib(sp.predicted_peak),
                       sp.dynamic ? (sp.decode_batch ? fmt::format("  (decode batch {} of {})", sp.decode_batch, s.workload.batch) : std::string())
                                  : sp.checked ? std::string() : std::string("  (not checked)"));
  }
  out += fmt::format("predicted peak {} + reserve {} = {} of {} available: {}\n", format_mib(p.predicted_peak),
                     format_mib(p.reserve), format_mib(p.predicted_peak + p.reserve), format_mib(p.available),
                     p.fits ? "fits" : "does NOT fit (an OOM is expected)");
  return out;
}

}  // namespace vf

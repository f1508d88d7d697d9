#include "harness/oracle.h"

#include <fmt/format.h>

namespace vf {

std::string_view verdict_kind_name(VerdictKind k) {
  switch (k) {
    case VerdictKind::pass: return "pass";
    case VerdictKind::violation: return "violation";
    case VerdictKind::oom: return "oom";
    case VerdictKind::error: return "error";
  }
  return "?";
}

std::string_view op_activity(const Scenario& s, const Program& p, std::uint32_t op) {
  const Op& o = p.ops[op];
  if (o.kind != OpKind::alloc && o.kind != OpKind::free) return op_kind_name(o.kind);
  const Buffer& b = p.buffers[o.buffer];
  switch (b.kind) {
    case BufferKind::weight: return "load";
    case BufferKind::transfer: return "h2d";
    case BufferKind::convert:
    case BufferKind::scaled: {
      const Tensor& t = s.models[b.model].spec->modules[b.module].tensors[b.tensor];
      const DtypeInfo& i = dtype_info(t.dtype);
      return i.gguf_quantized || t.dtype == Dtype::int8 ? "dequant" : "upcast";
    }
    case BufferKind::lora: return "lora";
    case BufferKind::activation: return "compute";
  }
  return "?";
}

Verdict judge(const Scenario& s, const Plan& plan, const Program& p, const ExecResult& r) {
  Verdict v;
  v.reserve = plan.reserve;
  const std::string_view mode = allocator_mode_name(s.allocator.mode);
  if (r.error) {
    v.kind = VerdictKind::error;
    v.signature = fmt::format("error:{}:{}", r.backend, mode);
    v.message = *r.error;
    return v;
  }
  if (r.oom) {
    const Op& op = p.ops[r.oom->op];
    v.op = r.oom->op;
    v.stage = op.stage;
    v.measured = r.stage_reserved_peak[op.stage];
    v.predicted = plan.stages[op.stage].predicted_peak;
    v.overshoot = static_cast<std::int64_t>(r.oom->reserved + r.oom->request) -
                  static_cast<std::int64_t>(v.predicted + v.reserve);
    if (!plan.fits) {
      v.expected_oom = true;
      v.message = fmt::format("expected OOM at op {} (the plan does not fit: predicted {} + reserve {} > {} available)",
                              v.op, format_mib(plan.predicted_peak), format_mib(plan.reserve), format_mib(plan.available));
      return v;
    }
    v.kind = VerdictKind::oom;
    v.signature = fmt::format("oom:{}:{}:{}", phase_name(op.phase), op_activity(s, p, v.op), mode);
    // The allocator's own account says what it asked of the device (a caching segment, pages, a
    // pool chunk), which can be far more than the tensor: without it "5 MiB requested with 7 MiB
    // free" reads as a contradiction.
    v.message = fmt::format("OOM at op {} ({}): {} requested with {} free, {} reserved{}; the plan said it fits "
                            "(predicted {} + reserve {} <= {} available)",
                            v.op, describe_op(s, p, v.op), format_mib(r.oom->request), format_mib(r.oom->device_free),
                            format_mib(r.oom->reserved), r.oom->detail.empty() ? "" : " (" + r.oom->detail + ")",
                            format_mib(plan.predicted_peak), format_mib(plan.reserve), format_mib(plan.available));
    return v;
  }
  // P1 per checked stage; the worst overshoot is the verdict.
  bool found = false;
  for (const StagePlan& sp : plan.stages) {
    if (!sp.checked || sp.stage >= r.stage_reserved_peak.size()) continue;
    const std::int64_t over = static_cast<std::int64_t>(r.stage_reserved_peak[sp.stage]) -
                              static_cast<std::int64_t>(sp.predicted_peak + plan.reserve);
    if (!found || over > v.overshoot) {
      found = true;
      v.overshoot = over;
      v.stage = sp.stage;
      v.op = r.stage_reserved_peak_op[sp.stage];
      v.measured = r.stage_reserved_peak[sp.stage];
      v.predicted = sp.predicted_peak;
    }
  }
  if (found && v.overshoot > 0) {
    const Op& op = p.ops[v.op];
    v.kind = VerdictKind::violation;
    // Over budget before the stage allocated anything: the cache earlier stages left (ComfyUI
    // counts cached-but-unused memory as free and flushes it only above 25% of free memory).
    const bool cached = v.stage < r.stage_entry_reserved.size() && v.measured <= r.stage_entry_reserved[v.stage];
    v.signature = fmt::format("violation:{}:{}:{}", phase_name(op.phase), cached ? "cached" : op_activity(s, p, v.op), mode);
    v.message = fmt::format("stage {} ({} {}): measured reserved peak {} > predicted {} + reserve {} by {} at op {} ({}){}",
                            v.stage, stage_op_name(s.stages[v.stage].op), s.models[s.stages[v.stage].model].id,
                            format_mib(v.measured), format_mib(v.predicted), format_mib(v.reserve),
                            format_mib(static_cast<Bytes>(v.overshoot)), v.op, describe_op(s, p, v.op),
                            cached ? "; all of it held in cache by earlier stages" : "");
  } else if (!plan.fits) {
    // Nothing to judge against: the plan said it would not fit, and it ran without an OOM.
    v.message = fmt::format("pass: no OOM although the plan does not fit (predicted {} + reserve {} > {} available), "
                            "so the predictor was pessimistic here; measured reserved peak {}",
                            format_mib(plan.predicted_peak), format_mib(plan.reserve), format_mib(plan.available),
                            format_mib(r.reserved_peak));
  } else {
    v.message = fmt::format("pass: worst stage {} has {} of headroom", v.stage,
                            format_mib(static_cast<Bytes>(found ? -v.overshoot : 0)));
  }
  return v;
}

}  // namespace vf

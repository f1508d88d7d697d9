#include "harness/oracle.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/attribution.h"
#include "harness/sim/aimdo.h"

namespace vf {

std::string_view verdict_kind_name(VerdictKind k) {
  switch (k) {
    case VerdictKind::pass: return "pass";
    case VerdictKind::violation: return "violation";
    case VerdictKind::waste: return "waste";
    case VerdictKind::oom: return "oom";
    case VerdictKind::error: return "error";
    case VerdictKind::knee: return "knee";
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

namespace {


// P1 over the plan's checked stages: the one whose measured reserved peak is furthest over its
// prediction + reserve goes into `v` (stage, op, measured, predicted, overshoot). False when no
// stage was checked.
bool worst_checked_stage(const Plan& plan, const ExecResult& r, Verdict& v) {
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
  return found;
}

// What the forwards' activations rest on: the scenario's source, and the models a profile had no
// entry for (sized by the formula instead).
std::string activation_basis(const Scenario& s, const Plan& plan) {
  std::string out = activation_rests_on(s.activations);
  std::vector<std::string> fell_back;
  for (const StagePlan& sp : plan.stages) {
    if (sp.op != StageOp::forward || !sp.activation.fallback) continue;
    const std::string& id = s.models[sp.model].id;
    if (std::find(fell_back.begin(), fell_back.end(), id) == fell_back.end()) fell_back.push_back(id);
  }
  if (!fell_back.empty()) out += fmt::format(" (no profile entry for {}: the formula)", fmt::join(fell_back, ", "));
  return out;
}

// Class C, over-reservation (comfyui-accounting.md §4 C; PR #11069, #11096): a passing classic
// case whose plan offloaded modules of the model it runs although the stage's measured peak plus
// the reserve left room for the largest of them, and whose offload buffer was larger than the
// transients it was budgeted for ever were: the buffer, not the card, kept them off the device.
// The worst such forward stage (most unused buffer) becomes a `waste` verdict; false when there
// is none. The unused buffer must be at least kWasteShare of the bytes offloaded: below that the
// margin is the lookahead bound working as designed (e.g. 206 MiB of an 870 MiB buffer for the
// FLUX.2 text encoder with 17 GiB offloaded) or headroom the inference floor left, not the
// over-reservation #11069 and #11096 fixed (a 12 GB buffer with a quarter of the model
// resident; a buffer larger than the usable budget with nothing resident).
constexpr double kWasteShare = 0.10;

bool judge_waste(const Scenario& s, const Plan& plan, const Program& p, const ExecResult& r, Verdict& v) {
  // A planner's walk and buffer (ComfyUI's, or an external one's): `exact` takes a preset's
  // placement to measure allocator overhead against, and makes no promise about how much it offloads.
  if (s.policy.predictor == PredictorKind::exact) return false;
  bool found = false;
  for (const StagePlan& sp : plan.stages) {
    if (sp.op != StageOp::forward || !sp.checked || sp.offload_buffer == 0 || sp.stage >= r.stage_reserved_peak.size()) continue;
    const LoadPlan* lp = nullptr;
    for (const LoadPlan& l : plan.loads) {
      if (l.model == sp.model && l.stage < sp.stage) lp = &l;
    }
    if (!lp || lp->lowvram.empty()) continue;
    const ModelSpec& spec = *s.models[sp.model].spec;
    const std::vector<Bytes>& sizes = module_sizes(spec);  // modules[i].bytes, flat
    Bytes largest = 0, offloaded_bytes = 0;
    std::uint32_t offloaded = 0, largest_module = kNone;
    for (std::uint32_t i = 0; i < lp->lowvram.size() && i < sizes.size(); ++i) {
      if (!lp->lowvram[i]) continue;
      ++offloaded;
      offloaded_bytes += sizes[i];
      if (sizes[i] > largest) {
        largest = sizes[i];
        largest_module = i;
      }
    }
    if (offloaded == 0 || largest == 0) continue;
    // The tests below that do not need the transients' peak come first, so a stage that cannot be
    // waste skips the walk over its ops (ten per module: a third of the judge at 1,000,000
    // modules). The unused room is at most the buffer, so a buffer under the share, or one no
    // larger than a waste already found, settles it as the walk would.
    const Bytes measured = r.stage_reserved_peak[sp.stage];
    // The room is judged with the activations at least at the predictor's own budget for them:
    // headroom the inference floor left above smaller activations is not the buffer's waste, and
    // the verdict must not hang on how the activations were sized.
    const Bytes at_budget = measured + sat_sub(sp.activation_allowance, sp.activation_bytes);
    if (at_budget + plan.reserve + largest > plan.available) continue;
    if (static_cast<double>(sp.offload_buffer) < kWasteShare * static_cast<double>(offloaded_bytes)) continue;
    if (found && static_cast<std::int64_t>(sp.offload_buffer) <= v.overshoot) continue;
    // The transients of this model live during the stage: exact bytes of the program's buffers.
    Bytes live = 0, peak = 0;
    const std::uint32_t end = sp.stage < p.stage_begin.size() ? p.stage_end(sp.stage) : 0;
    for (std::uint32_t k = sp.stage < p.stage_begin.size() ? p.stage_begin[sp.stage] : 0; k < end; ++k) {
      const Op& op = p.ops[k];
      if (op.buffer == kNone || (op.kind != OpKind::alloc && op.kind != OpKind::free)) continue;
      const Buffer& b = p.buffers[op.buffer];
      if (b.model != sp.model || b.kind == BufferKind::weight || b.kind == BufferKind::activation) continue;
      if (op.kind == OpKind::alloc) {
        live += b.bytes;
        peak = std::max(peak, live);
      } else {
        live -= std::min(live, b.bytes);
      }
    }
    const Bytes unused = sat_sub(sp.offload_buffer, peak);
    if (unused == 0 || static_cast<double>(unused) < kWasteShare * static_cast<double>(offloaded_bytes)) continue;
    if (found && static_cast<std::int64_t>(unused) <= v.overshoot) continue;
    found = true;
    v.kind = VerdictKind::waste;
    v.stage = sp.stage;
    v.op = r.stage_reserved_peak_op[sp.stage];
    v.measured = measured;
    v.predicted = sp.predicted_peak;
    v.overshoot = static_cast<std::int64_t>(unused);
    const std::string& id = s.models[sp.model].id;
    const std::string name = spec.modules[largest_module].name.empty() ? "(root)" : spec.modules[largest_module].name;
    v.signature = fmt::format("waste:forward:offload-buffer:{}", allocator_mode_name(s.allocator.mode));
    v.message = fmt::format("stage {} (forward {}): the plan offloaded {} module(s) of {} and budgeted an offload buffer of {}, but "
                            "the transients peaked at {}: {} of the buffer went unused, and the measured peak with the activations "
                            "at their budget ({}) + reserve {} left {} of the {} available, room for the largest offloaded module "
                            "({}, {})",
                            sp.stage, id, offloaded, id, format_mib(sp.offload_buffer), format_mib(peak), format_mib(unused), format_mib(at_budget),
                            format_mib(plan.reserve), format_mib(plan.available - at_budget - plan.reserve), format_mib(plan.available), name, format_mib(largest));
    v.cause = fmt::format("offload buffer {} budgeted, transients peaked at {}: {} unused while {} modules ({}, largest {}) were offloaded",
                          format_mib(sp.offload_buffer), format_mib(peak), format_mib(unused), offloaded, format_mib(offloaded_bytes), format_mib(largest));
    v.explanation = fmt::format(
        "Over-reservation (class C): ComfyUI sized the offload buffer for the modules it casts on the fly at {}, and that buffer "
        "came out of the weight budget, so {} of {}'s modules stayed in host memory and are copied to the device at every "
        "step. The transients they needed (transfer copies, conversions, LoRA patches) never exceeded {}, {} less than "
        "budgeted, and the measured peak (with the activations at the plan's own allowance) and the reserve left {} free: "
        "enough for {} ({}), the largest of them. The plan spent bandwidth, not memory, and no OOM follows.",
        format_mib(sp.offload_buffer), offloaded, id, format_mib(peak), format_mib(unused), format_mib(plan.available - at_budget - plan.reserve), name,
        format_mib(largest));
  }
  if (found) {
    v.rests_on = fmt::format("exact: the offload buffer is the plan's own term and the transients are the program's own tensors; "
                             "the measured peak is the {} allocator {}, with the activations at no less than the plan's "
                             "allowance ({})",
                             allocator_mode_name(s.allocator.mode), r.backend == "cuda" ? "on " + r.environment : "modelled on the simulated device",
                             activation_basis(s, plan));
  }
  return found;
}

}  // namespace

std::string activation_dependence_text(const Verdict& v) {
  return fmt::format("the activation source sized some forward's activations above the predictor's own budget for them "
                     "(max(memory_required, the inference floor)); capped at that budget, this case gives {}. The "
                     "finding rests on how vramfuzz sized the activations, not on the weights, transients and the allocator "
                     "alone: before filing it, check the activations against a measurement (a profile, docs/activations.md).",
                     v.at_budget == "pass" ? std::string("a pass") : v.at_budget);
}

namespace {

// A classic finding's explanation: the judged op's reserved bytes against the plan's terms.
void attribute_classic(const Scenario& s, const Plan& plan, const Program& p, const ExecResult& r, Verdict& v) {
  const bool measured = r.backend == "cuda";
  v.rests_on = fmt::format("{}: the {} allocator {}; the bytes each op requests are exact (the program's own tensors); {}",
                           measured ? "measured" : "modelled", allocator_mode_name(s.allocator.mode),
                           measured ? "on " + r.environment : std::string("on the simulated device"), activation_basis(s, plan));
  Attribution a;
  if (r.oom && v.kind == VerdictKind::oom) {
    a = attribute(s, plan, p, v.stage, v.op, r.oom->reserved, r.oom->allocated, r.oom->request, r.oom->held);
  } else {
    const Bytes allocated = v.stage < r.stage_allocated_at_peak.size() ? r.stage_allocated_at_peak[v.stage] : 0;
    const Bytes held = v.stage < r.stage_held_at_peak.size() ? r.stage_held_at_peak[v.stage] : 0;
    a = attribute(s, plan, p, v.stage, v.op, v.measured, allocated, std::nullopt, held);
  }
  v.cause = attribution_cause(a);
  v.explanation = attribution_paragraph(a);
}

// Dynamic VRAM's property (docs/dynamic.md "The property"): dynamic VRAM predicts no peak; it
// promises to make room by evicting. An OOM is a finding when it was avoidable: the bytes the
// failing op could not do without (the context, other processes, aimdo's headroom, the tensors
// the running model needs, the pages of the module being computed, its cast-buffer extent, and
// the request) fit on the card, so what filled it was slack some mechanism held (torch's cache,
// cast buffers grown for other modules, a prefetched block's pins, other models' weights). Else
// the workload does not fit: an expected OOM. Another process's allocation of no more than
// aimdo's headroom that fails while aimdo holds unpinned pages is a finding too (the poll that
// would have freed them was stale, or aimdo's ledger missed memory).
// The paragraph a dynamic VRAM finding carries: what its mechanism did, in the runtime's terms.
std::string explain(std::string_view mech, const DynamicOom& o, const Scenario& s, const DynamicReport& d) {
  if (mech == "torch-cache") {
    if (s.allocator.mode == AllocatorMode::async) {
      return fmt::format("The cudaMallocAsync pool kept {} of freed blocks: PyTorch sets the pool's release threshold to "
                         "UINT64_MAX, so it gives memory back only at empty_cache (ComfyUI's soft_empty_cache when a node "
                         "ends). aimdo hooks cudaMallocAsync but cannot trim the pool, and its ledger stopped counting those "
                         "bytes when they were freed, so it saw room that the driver did not have; once every unpinned VBAR "
                         "page was evicted, the {} had nowhere to go.",
                         format_mib(o.torch_cache), o.what);
    }
    return fmt::format("PyTorch's caching allocator held {} in cached blocks of its segments. aimdo sees the allocator only "
                       "where it calls cudaMalloc (a new segment, through the cuMemAlloc hook) and cannot evict cached "
                       "blocks; PyTorch releases whole unused segments only on its own OOM retry, and a segment with one "
                       "live block not at all.",
                       format_mib(o.torch_cache));
  }
  if (mech == "cast-buffer") {
    return fmt::format("aimdo's cast buffers held {}, of which the module in flight used {}: a refused fault sends its "
                       "weight through the offload stream's VRAMBuffer, which grows in 16 MiB chunks and is given back only "
                       "when the node ends (reset_cast_buffers), so each stream keeps the size of the largest cast it ever "
                       "carried while other modules run. {} of {} faults were refused in this run.",
                       format_mib(o.cast_slack + o.needed_cast), format_mib(o.needed_cast), d.refused, d.faults);
  }
  if (mech == "prefetch-pins") {
    return fmt::format("{} of VBAR pages were pinned for modules not being computed: a model that prefetches faults a whole "
                       "block's weights before the block runs and unpins them only when the next block is popped, so "
                       "eviction could not reclaim them for this {}.",
                       format_mib(o.prefetch_pins), o.what);
  }
  if (mech == "other-weights") {
    return fmt::format("{} of torch tensors belonged to models that were not running (legacy models' resident weights, "
                       "other models' force-loaded tensors): aimdo evicts only VBAR pages, never torch tensors, and "
                       "load_models_gpu unloads no model for a dynamic one.",
                       format_mib(o.other_weights));
  }
  if (mech == "resident-pages") {
    return fmt::format("{} of unpinned VBAR pages survived the eviction (below a VBAR's watermark limit).", format_mib(o.resident_pages));
  }
  return fmt::format("{} went to rounding: the allocator's block rounding and the driver's 2 MiB pages for small cudaMalloc "
                     "allocations, which aimdo's ledger books at their requested size.",
                     format_mib(o.rounding));
}

std::string_view mech_label(std::string_view mech) {
  if (mech == "torch-cache") return "torch's cached blocks";
  if (mech == "cast-buffer") return "cast-buffer slack";
  if (mech == "prefetch-pins") return "prefetch pins";
  if (mech == "other-weights") return "other models' weights";
  if (mech == "resident-pages") return "unevicted pages";
  return "rounding";
}

Bytes mech_bytes(std::string_view mech, const DynamicOom& o) {
  if (mech == "torch-cache") return o.torch_cache;
  if (mech == "cast-buffer") return o.cast_slack;
  if (mech == "prefetch-pins") return o.prefetch_pins;
  if (mech == "other-weights") return o.other_weights;
  if (mech == "resident-pages") return o.resident_pages;
  return o.rounding;
}

void judge_dynamic(const Scenario& s, const Plan& plan, const Program& p, const ExecResult& r, Verdict& v) {
  v.rests_on = fmt::format("modelled: the {} allocator and comfy-aimdo ({}) on the simulated device; {}",
                           allocator_mode_name(s.allocator.mode), s.policy.label(), activation_basis(s, plan));
  const std::string_view mode = allocator_mode_name(s.allocator.mode);
  const DynamicReport* d = r.dynamic ? &*r.dynamic : nullptr;
  const std::string summary =
      d ? fmt::format("{} faults ({} resident, {} copied, {} refused to a cast buffer), {} pages evicted, {} polls over {:.2f} s",
                      d->faults, d->resident_hits, d->copies, d->refused, d->pages_evicted, d->polls, static_cast<double>(d->elapsed_us) / 1e6)
        : std::string();
  if (r.oom) {
    const Op& op = p.ops[r.oom->op];
    v.op = r.oom->op;
    v.stage = op.stage;
    v.measured = r.stage_reserved_peak[op.stage];
    const std::uint32_t running = s.stages[op.stage].model;
    if (!d || !d->oom) {
      v.kind = VerdictKind::error;
      v.signature = fmt::format("error:{}:{}", r.backend, mode);
      v.message = "the backend reported a dynamic VRAM OOM without its account";
      return;
    }
    const DynamicOom& o = *d->oom;
    v.overshoot = static_cast<std::int64_t>(o.request) - static_cast<std::int64_t>(o.free);
    const std::string at = fmt::format("op {} ({})", v.op, describe_op(s, p, v.op));
    const std::string need =
        fmt::format("context {} + other processes {} + aimdo headroom {} + the running model's tensors {} + the module's pages {} "
                    "+ its cast extent {} + the request {} = {} of the {} card",
                    format_mib(o.context), format_mib(o.others), format_mib(o.headroom), format_mib(o.needed_tensors), format_mib(o.needed_pages), format_mib(o.needed_cast),
                    format_mib(o.request), format_mib(o.necessary()), format_size(o.total));
    const std::string slack = fmt::format("torch cache {}, cast-buffer slack {}, prefetch pins {}, other models' weights {}, "
                                          "unreached pages {}, rounding {}, free {}",
                                          format_mib(o.torch_cache), format_mib(o.cast_slack), format_mib(o.prefetch_pins), format_mib(o.other_weights),
                                          format_mib(o.resident_pages), format_mib(o.rounding), format_mib(o.free));
    if (s.models[running].spec->kind == ModelKind::vae && op.phase == Phase::forward) {
      // VAE.decode catches the OOM and decodes again in tiles: a slow decode, not a failure.
      v.message = fmt::format("pass: the VAE decode ran out of memory at {} ({} {} failed) and ComfyUI retries it tiled; {}",
                              at, format_mib(o.request), o.what, summary);
      return;
    }
    if (!o.avoidable()) {
      v.expected_oom = true;
      v.message = fmt::format("expected OOM at {}: {} {} did not fit, and it could not have: the op needs {}; held beside it: {}",
                              at, format_mib(o.request), o.what, need, slack);
      return;
    }
    v.kind = VerdictKind::oom;
    const std::string_view mech = o.mechanism();
    v.signature = fmt::format("oom:{}:{}:{}", phase_name(op.phase), mech, mode);
    v.message = fmt::format("avoidable OOM at {}: a {} of {} failed with {} free after aimdo evicted what it could ({}); the op "
                            "needs only {}; the rest was slack: {} (largest: {})",
                            at, o.what, format_mib(o.request), format_mib(o.free), r.oom->detail.empty() ? "no detail" : r.oom->detail, need, slack,
                            mech);
    v.explanation = explain(mech, o, s, *d);
    v.cause = fmt::format("{} {} held while a {} of {} failed with {} free (the op needed {} of the {} card)", mech_label(mech),
                          format_mib(mech_bytes(mech, o)), o.what, format_mib(o.request), format_mib(o.free), format_mib(o.necessary()), format_size(o.total));
    return;
  }
  if (d) {
    const DynamicConstants& k = s.policy.constants.dynamic;
    const Bytes headroom = sim::kAimdoPollHeadroom + k.vram_headroom;
    for (const OthersFailure& f : d->others_failures) {
      if (f.bytes > headroom || f.evictable + f.free < f.bytes) continue;
      v.kind = VerdictKind::oom;
      v.op = f.op;
      v.stage = f.op < p.ops.size() ? p.ops[f.op].stage : 0;
      v.overshoot = static_cast<std::int64_t>(f.bytes) - static_cast<std::int64_t>(f.free);
      // Why the headroom was gone: aimdo's last poll predates another process's allocation (it
      // could not know), or its own view already showed the headroom used up (it knew, and did
      // not evict: it acts only when an allocation it hooks needs room), or its view said there
      // was room the driver did not have (its ledger missed memory).
      const std::string_view mech = f.others_changed ? "stale-poll" : f.believed_free < f.bytes ? "headroom-unenforced" : "ledger-gap";
      v.signature = fmt::format("oom:others:{}:{}", mech, mode);
      v.message = fmt::format(
          "another process's allocation of {} failed at {:.3f} s with {} free, within the {} aimdo keeps free for it, while "
          "aimdo held {} of unpinned VBAR pages; aimdo's last poll was {:.3f} s old and with its ledger made {} free of it",
          format_mib(f.bytes), static_cast<double>(f.at_us) / 1e6, format_mib(f.free), format_mib(headroom), format_mib(f.evictable),
          static_cast<double>(f.since_poll_us) / 1e6, format_mib(f.believed_free));
      v.cause = fmt::format("another process's {} failed {:.3f} s after aimdo's last poll ({}), with {} of unpinned VBAR pages held",
                            format_mib(f.bytes), static_cast<double>(f.since_poll_us) / 1e6, mech, format_mib(f.evictable));
      if (mech == "stale-poll") {
        v.explanation = fmt::format(
            "aimdo sees other processes only through its cuMemGetInfo poll, at most one every {} ms: the simple term counts "
            "aimdo's own ledger against the card's total, and the delta term works from the last poll. The poll {:.3f} s "
            "before this allocation was taken before another process's latest allocation, so aimdo kept filling the card as "
            "if it had not happened, and the headroom it promises other processes ({}) was not there when one asked for {}. "
            "A fresh poll would have evicted the {} of unpinned pages it held.",
            k.poll_ms, static_cast<double>(f.since_poll_us) / 1e6, format_mib(headroom), format_mib(f.bytes), format_mib(f.evictable));
      } else if (mech == "headroom-unenforced") {
        v.explanation = fmt::format(
            "aimdo's own view showed only {} free: it knew the headroom it promises other processes ({}) was gone, but it "
            "evicts only when an allocation it hooks or a fault needs room{}, so torch's allocations had eaten into the headroom "
            "and nothing gave it back before another process asked for {}, while aimdo held {} of unpinned pages.",
            format_mib(f.believed_free), format_mib(headroom),
            k.async_check_ms != 0 ? fmt::format(" (and its cudaMallocAsync hook checks its budget at most once per {} ms)", k.async_check_ms)
                                  : std::string(),
            format_mib(f.bytes), format_mib(f.evictable));
      } else {
        v.explanation = fmt::format(
            "aimdo's own view said {} was free, but the driver had only {}: its ledger misses memory the process holds (the "
            "cudaMallocAsync pool's growth beyond what was asked and the blocks it caches after a free, the driver's page "
            "rounding), so the headroom it promises other processes ({}) was not there when one asked for {}, while it held "
            "{} of unpinned pages.",
            format_mib(f.believed_free), format_mib(f.free), format_mib(headroom), format_mib(f.bytes), format_mib(f.evictable));
      }
      return;
    }
  }
  // Legacy models next to dynamic ones are judged by P1 like the classic path.
  const bool found = worst_checked_stage(plan, r, v);
  if (found && v.overshoot > 0) {
    const Op& op = p.ops[v.op];
    v.kind = VerdictKind::violation;
    v.signature = fmt::format("violation:{}:{}:{}", phase_name(op.phase), op_activity(s, p, v.op), mode);
    v.message = fmt::format("stage {} (legacy {}): measured reserved peak {} > predicted {} + reserve {} by {} at op {} ({})", v.stage,
                            s.models[s.stages[v.stage].model].id, format_mib(v.measured), format_mib(v.predicted), format_mib(v.reserve),
                            format_mib(static_cast<Bytes>(v.overshoot)), v.op, describe_op(s, p, v.op));
    const std::string rests_on = v.rests_on;  // aimdo is modelled here too
    attribute_classic(s, plan, p, r, v);
    v.rests_on = rests_on;
    return;
  }
  v.overshoot = 0;
  v.message = fmt::format("pass: no OOM; device peak {} of {}, VBAR peak {}, cast buffers peak {}; {}", format_mib(r.device_peak),
                          format_size(s.device.total), format_mib(d ? d->vbar_peak : 0), format_mib(d ? d->cast_peak : 0), summary);
}

}  // namespace

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
  if (plan.dynamic) {
    judge_dynamic(s, plan, p, r, v);
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
    attribute_classic(s, plan, p, r, v);
    return v;
  }
  // P1 per checked stage; the worst overshoot is the verdict.
  const bool found = worst_checked_stage(plan, r, v);
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
    attribute_classic(s, plan, p, r, v);
  } else if (Verdict waste = v; judge_waste(s, plan, p, r, waste)) {
    // No violation and no OOM, whether the plan fits or not (over-reservation is what makes a
    // plan look as if it did not): the offload buffer kept modules off a card that had room.
    return waste;
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

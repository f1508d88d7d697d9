// The classic ComfyUI planner exactly as it was at 806369b, before issue #18 told modules
// without a cast hook apart (`git show 806369b:harness/predictors/comfy_classic.cpp`): the oracle
// of PipelineProps.CastHookModelsPlanAsBefore. It is frozen on purpose: do not fix or extend it.
// When a later change means to move the plans of cast-hook-only models, that property and this
// copy go together (so far three times: the VAE decode batch, 864a1a2; a GGUF weight's term
// counted by its packed bytes, as ComfyUI-GGUF's numel() does; partially_unload's growing buffer).
#include "properties/classic_before18.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "models/activation.h"

namespace vf::before18 {

Bytes frozen_offload_cost(const Module& m, Dtype compute, bool lora, const ComfyConstants& c);

namespace {

using i64 = std::int64_t;

i64 as_signed(Bytes b) { return static_cast<i64>(b); }  // inputs are capped far below 2^63

// Bytes of a buffer of `numel` elements in the compute dtype.
Bytes compute_copy(const Tensor& t, Dtype compute) { return t.numel * compute_elem_bytes(compute); }

// The offload-cost terms' count: numel() of the stored weight, a GGUF one's packed bytes.
Bytes counted_copy(const Tensor& t, Dtype compute) {
  return (dtype_info(t.dtype).gguf_quantized ? t.bytes : t.numel) * compute_elem_bytes(compute);
}

// Tensors ComfyUI counts in the offload cost and converts at forward time: the module's
// parameters (weight, bias, norm scale, embedding table), not the fp8 scales or buffers.
bool is_parameter(const Tensor& t) {
  return t.role == TensorRole::weight || t.role == TensorRole::bias || t.role == TensorRole::norm ||
         t.role == TensorRole::embedding;
}

std::uint32_t multiply_batch(std::uint32_t batch, double mult) {
  return static_cast<std::uint32_t>(std::max(1.0, std::floor(batch * mult + 0.5)));
}

struct ModelState {
  std::vector<std::uint8_t> resident;
  Bytes loaded = 0;
  Bytes offload_buffer = 0;
  std::uint64_t last_used = 0;  // stage counter, for eviction tie-breaks (most recent first)
};

class ComfyPlanner {
 public:
  explicit ComfyPlanner(const Scenario& s)
      : s_(s), c_(s.policy.constants), ns_(s.streams()), available_(s.device.available()), state_(s.models.size()) {
    for (std::size_t i = 0; i < s.models.size(); ++i) state_[i].resident.assign(s.models[i].spec->modules.size(), 0);
  }

  Plan run() {
    Plan plan;
    plan.policy = s_.policy.key();  // the preset and its overrides (the reserve is printed beside it)
    plan.reserve = c_.reserve;
    plan.streams = ns_;
    plan.available = available_;
    for (std::uint32_t i = 0; i < s_.stages.size(); ++i) {
      const Stage& st = s_.stages[i];
      StagePlan sp;
      sp.stage = i;
      sp.op = st.op;
      sp.model = st.model;
      state_[st.model].last_used = i + 1;
      if (st.op == StageOp::load) {
        plan.loads.push_back(load(i, st.model));
        sp.load_plan = static_cast<int>(plan.loads.size() - 1);
      } else if (st.op == StageOp::unload) {
        unload(st.model);
        sp.checked = false;
      }
      fill_activation(sp);
      sp.resident_total = resident_total();
      sp.offload_buffer = st.op == StageOp::unload ? 0 : state_[st.model].offload_buffer;
      sp.predicted_peak = sp.resident_total + sp.offload_buffer + (sp.checked ? sp.activation_allowance : 0);
      plan.stages.push_back(sp);
    }
    return plan;
  }

 private:
  Bytes resident_total() const {
    Bytes t = 0;
    for (const ModelState& m : state_) t += m.loaded;
    return t;
  }
  Bytes free_now() const { return sat_sub(available_, resident_total()); }

  const ModelSpec& spec(std::uint32_t m) const { return *s_.models[m].spec; }

  // ComfyUI's memory_required for the model at `batch` (0 when ComfyUI passes none: text encoders).
  Bytes estimate(std::uint32_t m, std::uint32_t batch) const {
    const ModelRef& ref = s_.models[m];
    return comfy_memory_required(*ref.spec, s_.workload, batch, ref.compute, c_.flash_attention,
                                 fmt::format("models[{}]", m));
  }

  // The batch per forward pass: ComfyUI batches cond and uncond together only while
  // cond_batch_safety x memory_required(2 x batch) < free memory.
  void fill_activation(StagePlan& sp) const {
    const ModelRef& ref = s_.models[sp.model];
    const ModelSpec& m = *ref.spec;
    const std::uint32_t batch = s_.workload.batch;
    sp.run_batch = batch;
    sp.passes = 1;
    Bytes est = 0;
    if (m.kind == ModelKind::diffusion) {
      est = estimate(sp.model, batch);
      if (s_.workload.cfg > 1.0) {
        const Bytes both = estimate(sp.model, batch * 2);
        if (static_cast<double>(both) * c_.cond_batch_safety < static_cast<double>(free_now())) {
          sp.run_batch = batch * 2;
          est = both;
        } else {
          sp.passes = 2;
        }
      }
    } else if (m.kind == ModelKind::vae) {
      // Moved with the planner in 864a1a2 (the VAE decode batch, as the header allows: a change
      // meant to move cast-hook-only plans moves this copy too): one sample's estimate, as many
      // samples per call as fit after the load.
      const Bytes one = std::max<Bytes>(estimate(sp.model, 1), 1);
      sp.decode_batch = static_cast<std::uint32_t>(std::clamp<Bytes>(free_now() / one, 1, batch));
      sp.run_batch = sp.decode_batch;
      sp.passes = (batch + sp.decode_batch - 1) / sp.decode_batch;
      est = estimate(sp.model, sp.decode_batch);
    }
    sp.activation_allowance = std::max(c_.inference_floor, est);
    const std::uint32_t rows = m.kind == ModelKind::text_encoder ? 1 : sp.run_batch;
    sp.activation_bytes = activation_working_set(m, s_.workload, rows, ref.compute, fmt::format("models[{}]", sp.model));
  }

  // free_memory(target): evict other models, most-offloaded first, partially (smart memory):
  // each gives up its cheapest modules until the shortfall is covered.
  void free_memory(Bytes target, std::uint32_t keep, LoadPlan& lp) {
    if (free_now() >= target) return;
    std::vector<std::uint32_t> order;
    for (std::uint32_t m = 0; m < state_.size(); ++m) {
      if (m != keep && state_[m].loaded > 0) order.push_back(m);
    }
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      const Bytes off_a = spec(a).bytes - state_[a].loaded, off_b = spec(b).bytes - state_[b].loaded;
      if (off_a != off_b) return off_a > off_b;
      if (spec(a).bytes != spec(b).bytes) return spec(a).bytes < spec(b).bytes;
      return state_[a].last_used > state_[b].last_used;
    });
    for (std::uint32_t m : order) {
      const Bytes shortfall = sat_sub(target, free_now());
      if (shortfall == 0) break;
      Eviction ev;
      ev.model = m;
      // partially_unload walks modules in ascending (offload cost, size, name); with the
      // look-ahead buffer it grows the buffer through a sliding window of the last NS modules it
      // unloaded and stops once it freed more than the shortfall plus that growth.
      const ModelRef& ref = s_.models[m];
      std::vector<std::uint32_t> mods(state_[m].resident.size());
      std::iota(mods.begin(), mods.end(), 0u);
      std::vector<Bytes> cost(mods.size());
      for (const std::uint32_t i : mods) cost[i] = frozen_offload_cost(spec(m).modules[i], ref.compute, ref.lora, c_);
      std::sort(mods.begin(), mods.end(), [&](std::uint32_t a, std::uint32_t b) {
        if (cost[a] != cost[b]) return cost[a] < cost[b];
        if (spec(m).modules[a].bytes != spec(m).modules[b].bytes) return spec(m).modules[a].bytes < spec(m).modules[b].bytes;
        return spec(m).modules[a].name < spec(m).modules[b].name;
      });
      const bool sliding = c_.account == AccountMode::lookahead;
      const Bytes old_buffer = state_[m].offload_buffer;
      Bytes buffer = old_buffer;
      std::vector<Bytes> window;
      if (sliding && !mods.empty()) window.assign(ns_, std::min<Bytes>(old_buffer / (ns_ + 1), spec(m).modules[mods[0]].bytes));
      for (const std::uint32_t mod : mods) {
        if (sliding ? shortfall + (buffer - old_buffer) < ev.bytes : ev.bytes >= shortfall) break;
        if (!state_[m].resident[mod]) continue;
        Bytes potential = cost[mod];
        for (const Bytes w : window) potential += w;
        state_[m].resident[mod] = 0;
        state_[m].loaded -= spec(m).modules[mod].bytes;
        ev.bytes += spec(m).modules[mod].bytes;
        ev.modules.push_back(mod);
        if (sliding) {
          buffer = std::max(buffer, potential);
          if (!window.empty()) {
            window.erase(window.begin());
            window.push_back(spec(m).modules[mod].bytes);
          }
        }
      }
      if (sliding) state_[m].offload_buffer = buffer;
      if (state_[m].loaded == 0) state_[m].offload_buffer = 0;
      lp.evictions.push_back(std::move(ev));
    }
  }

  void unload(std::uint32_t m) {
    std::fill(state_[m].resident.begin(), state_[m].resident.end(), 0);
    state_[m].loaded = 0;
    state_[m].offload_buffer = 0;
  }

  LoadPlan load(std::uint32_t stage, std::uint32_t m) {
    const ModelRef& ref = s_.models[m];
    const ModelSpec& model = *ref.spec;
    ModelState& st = state_[m];
    LoadPlan lp;
    lp.stage = stage;
    lp.model = m;
    lp.free_before = free_now();

    // Step 1: reserve R, floor I, extra_mem and min_req (§2.3).
    const Bytes R = c_.reserve;
    const Bytes I = c_.inference_floor + R;
    const std::uint32_t batch = s_.workload.batch;
    if (model.kind == ModelKind::diffusion) {
      lp.est_max = estimate(m, multiply_batch(batch, c_.cfg_mult));
      lp.est_min = estimate(m, batch);
      lp.extra_mem = std::max(I, lp.est_max + R);
      lp.min_req = std::max(I, lp.est_min + R);
    } else if (model.kind == ModelKind::vae) {
      // The VAE passes memory_required only; min_req falls back to extra_mem. (One sample's:
      // moved with the planner in 864a1a2.)
      lp.est_max = lp.est_min = estimate(m, 1);
      lp.extra_mem = lp.min_req = std::max(I, lp.est_max + R);
    } else {
      lp.extra_mem = lp.min_req = I;
    }

    // Step 2-3: evict to 1.1 x need + extra_mem, then to min_req.
    const Bytes need = model.bytes - st.loaded;
    free_memory(scale_bytes(need, c_.unload_factor, "policy.unload_factor") + lp.extra_mem, m, lp);
    if (free_now() < lp.min_req) free_memory(lp.min_req, m, lp);

    // Step 4: the weight budget. F counts this model's own loaded bytes as available.
    const i64 F = as_signed(free_now() + st.loaded);
    const i64 by_ratio = std::min(static_cast<i64>(static_cast<double>(F) * c_.min_weight_ratio), F - as_signed(I));
    i64 budget = std::max({as_signed(c_.weight_floor), F - as_signed(lp.min_req), by_ratio});
    lp.usable = budget - as_signed(st.loaded);
    // The walk below compares against the whole budget (what is loaded counts toward it).
    const i64 budget_total = std::max<i64>(budget, 0);

    lp.offload_cost.resize(model.modules.size());
    for (std::size_t i = 0; i < model.modules.size(); ++i) {
      lp.offload_cost[i] = frozen_offload_cost(model.modules[i], ref.compute, ref.lora, c_);
    }
    lp.sorted.resize(model.modules.size());
    std::iota(lp.sorted.begin(), lp.sorted.end(), 0);
    std::sort(lp.sorted.begin(), lp.sorted.end(), [&](std::uint32_t a, std::uint32_t b) {
      if (lp.offload_cost[a] != lp.offload_cost[b]) return lp.offload_cost[a] > lp.offload_cost[b];
      if (model.modules[a].bytes != model.modules[b].bytes) return model.modules[a].bytes > model.modules[b].bytes;
      return model.modules[a].name > model.modules[b].name;
    });

    lp.resident.assign(model.modules.size(), 0);
    if (budget_total > as_signed(model.bytes)) {
      // Step 5, full load: everything resident, no buffer.
      lp.full_load = true;
      std::fill(lp.resident.begin(), lp.resident.end(), 1);
      lp.loaded = model.bytes;
    } else {
      walk(model, lp, budget_total);
    }
    lp.offloaded = model.bytes - lp.loaded;
    st.resident = lp.resident;
    st.loaded = lp.loaded;
    st.offload_buffer = lp.offload_buffer;
    transient_window(ref, lp);
    lp.log_line = lp.full_load
                      ? fmt::format("loaded completely; {:.2f} MB usable, {:.2f} MB loaded, full load: True",
                                    static_cast<double>(lp.usable) / MiB, to_mib(lp.loaded))
                      : fmt::format("loaded partially; {:.2f} MB usable, {:.2f} MB loaded, {:.2f} MB offloaded, "
                                    "{:.2f} MB buffer reserved, lowvram patches: {}",
                                    static_cast<double>(lp.usable) / MiB, to_mib(lp.loaded), to_mib(lp.offloaded),
                                    to_mib(lp.offload_buffer), lp.lowvram_patches);
    return lp;
  }

  // ModelPatcher.load's greedy walk (§2.4 step 3): in sorted order, a module is resident if
  // loaded + module_mem + potential < budget; a miss raises the buffer to its potential.
  void walk(const ModelSpec& model, LoadPlan& lp, i64 budget) {
    Bytes largest = 0;
    for (const Module& mod : model.modules) largest = std::max(largest, mod.bytes);
    Bytes loaded = 0;
    Bytes buffer = 0;
    const bool lora = s_.models[lp.model].lora;
    for (std::size_t k = 0; k < lp.sorted.size(); ++k) {
      const std::uint32_t i = lp.sorted[k];
      const Module& mod = model.modules[i];
      Bytes potential = 0;
      switch (c_.account) {
        case AccountMode::none: break;
        case AccountMode::largest: potential = lp.offload_cost[i] + ns_ * largest; break;
        case AccountMode::lookahead:
          potential = lp.offload_cost[i];
          for (std::size_t n = 1; n <= ns_ && k + n < lp.sorted.size(); ++n) potential += model.modules[lp.sorted[k + n]].bytes;
          break;
      }
      potential = std::max(buffer, potential);
      if (as_signed(loaded + mod.bytes + potential) < budget) {
        lp.resident[i] = 1;
        loaded += mod.bytes;
      } else {
        buffer = potential;
        if (lora && mod.cast_hook) ++lp.lowvram_patches;
      }
    }
    lp.loaded = loaded;
    lp.offload_buffer = buffer;
  }

  // §5's realistic transient: the worst forward-order window of NS+1 consecutive offloaded
  // modules: all their storage bytes, plus the compute-dtype copy (and LoRA temporaries) of the
  // one being converted. Counted in the predictor's own units (no allocator rounding: that is
  // what P1 and the allocator overhead bound measure), so P3 checks the #11171 invariant itself.
  void transient_window(const ModelRef& ref, LoadPlan& lp) const {
    const ModelSpec& model = *ref.spec;
    std::vector<std::uint32_t> off;
    for (std::uint32_t i = 0; i < model.modules.size(); ++i) {
      if (!lp.resident[i]) off.push_back(i);
    }
    for (std::size_t j = 0; j < off.size(); ++j) {
      Bytes w = 0;
      for (std::size_t n = 0; n <= ns_ && j + n < off.size(); ++n) w += model.modules[off[j + n]].bytes;
      for (const Tensor& t : model.modules[off[j]].tensors) {
        if (!is_parameter(t)) continue;
        if (ref.lora && t.role == TensorRole::weight) {
          w += 2 * compute_copy(t, ref.compute);  // the private cast copy and the LoRA delta
        } else if (needs_conversion(t.dtype, ref.compute)) {
          w += compute_copy(t, ref.compute);
        }
      }
      if (w > lp.realistic_transient) {
        lp.realistic_transient = w;
        lp.transient_module = off[j];
      }
    }
  }

  const Scenario& s_;
  const ComfyConstants& c_;
  std::uint32_t ns_;
  Bytes available_;
  std::vector<ModelState> state_;
};

}  // namespace

Plan plan_comfy_classic(const Scenario& s) { return ComfyPlanner(s).run(); }

Bytes frozen_offload_cost(const Module& m, Dtype compute, bool lora, const ComfyConstants& c) {
  Bytes cost = m.bytes;
  if (!c.dequant_term) return cost;
  for (const Tensor& t : m.tensors) {
    if (!is_parameter(t)) continue;
    if (lora && t.role == TensorRole::weight) {
      // (a) a patched weight: numel x manual-cast bytes x LOWVRAM_PATCH_ESTIMATE_MATH_FACTOR
      cost += scale_bytes(counted_copy(t, compute), c.lora_math_factor, "policy.lora_math_factor");
    } else if (needs_conversion(t.dtype, compute)) {
      // (b) the #11171 upcast/dequant term: one compute-dtype copy
      cost += counted_copy(t, compute);
    }
  }
  return cost;
}

}  // namespace vf::before18

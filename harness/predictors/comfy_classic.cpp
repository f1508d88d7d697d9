// The classic ComfyUI predictor (model_management.load_models_gpu + ModelPatcher.load, before
// dynamic VRAM): reserve and inference floor, activation estimate, eviction, weight budget, offload
// cost, the sorted greedy walk with its offload buffer (reference/comfyui-accounting.md §2, §5).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/predictors/predictors.h"
#include "harness/predictors/walk_memo.h"
#include "models/activation.h"

namespace vf {
namespace {

using i64 = std::int64_t;

i64 as_signed(Bytes b) { return static_cast<i64>(b); }  // inputs are capped far below 2^63

// How far ahead a loop over a scattered order (the load walk's) starts its reads.
constexpr std::size_t kPrefetch = 8;

// Bytes of a buffer of `numel` elements in the compute dtype.
template <class T>  // Tensor, FlatTensor
Bytes compute_copy(const T& t, Dtype compute) { return t.numel * compute_elem_bytes(compute); }

// What ComfyUI's offload-cost terms count: `weight.numel() * manual_cast_dtype.itemsize`. A GGUF
// weight is ComfyUI-GGUF's GGMLTensor, a torch tensor over the packed bytes (uint8) whose `shape`
// alone is the logical one, so its numel() is the packed byte count: run on ComfyUI-GGUF 795e451
// with torch 2.15, a 3072 x 3072 weight counts 10,027,008 in q8_0 and 7,741,440 in q6_k, against
// 9,437,184 logical elements. So the term over-counts q8_0 by 6 % and under-counts the 2-6 bit
// types, whose dequantized copy (compute_copy) is what the forward allocates.
template <class T>  // Tensor, FlatTensor
Bytes counted_copy(const T& t, Dtype compute) {
  return (dtype_info(t.dtype).gguf_quantized ? t.bytes : t.numel) * compute_elem_bytes(compute);
}

// Tensors ComfyUI counts in the offload cost and converts at forward time: the module's
// parameters (weight, bias, norm scale, embedding table), not the fp8 scales or buffers.
template <class T>  // Tensor, FlatTensor
bool is_parameter(const T& t) {
  return t.role == TensorRole::weight || t.role == TensorRole::bias || t.role == TensorRole::norm ||
         t.role == TensorRole::embedding;
}

// How ComfyUI's load walk treats a module (ModelPatcher._load_list, then load).
enum class Walk : std::uint8_t {
  cast,      // listed, with the cast hook: resident if it fits, else offloaded and cast on the fly
  raw,       // listed, raw parameters without the cast hook: resident if it fits, else left where it is
  unlisted,  // never listed: a container (raw tensors beside children with parameters), or a
             // module of buffers only; only a full load's model.to(device) moves it
};

Walk walk_kind(const Module& m) {
  if (m.container) return Walk::unlisted;
  if (m.cast_hook) return Walk::cast;
  return owns_parameters(m) ? Walk::raw : Walk::unlisted;
}
// The same from ModelSpec::module_flags.
Walk walk_kind(std::uint8_t flags) {
  if ((flags & kModuleContainer) != 0) return Walk::unlisted;
  if ((flags & kModuleCastHook) != 0) return Walk::cast;
  return (flags & kModuleOwnsParameters) != 0 ? Walk::raw : Walk::unlisted;
}

bool has_weight(const Module& m) {
  return std::any_of(m.tensors.begin(), m.tensors.end(), [](const Tensor& t) { return t.role == TensorRole::weight; });
}

std::uint32_t multiply_batch(std::uint32_t batch, double mult) {
  return static_cast<std::uint32_t>(std::max(1.0, std::floor(batch * mult + 0.5)));
}

struct ModelState {
  std::vector<std::uint8_t> resident;  // per module: on the device now
  Bytes on_device = 0;                 // the bytes of the resident modules
  // ComfyUI's model_loaded_weight_memory: what it counts as loaded. The walk counts only what it
  // placed, so a module it left on the device (a raw module that no longer fits, a container after
  // a full load and an eviction) is on the device without being counted.
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
      // Dynamic VRAM: ModelPatcherDynamic stages the model (comfy_dynamic.cpp) after
      // load_models_gpu has unloaded legacy models to make room; its placement happens at run
      // time, so its stages have no predicted peak. Legacy models next to it are planned here.
      const bool dynamic = s_.dynamic_model(st.model);
      sp.dynamic = dynamic;
      if (st.op == StageOp::load) {
        plan.loads.push_back(dynamic ? load_dynamic(i, st.model) : load(i, st.model));
        sp.load_plan = static_cast<int>(plan.loads.size() - 1);
      } else if (st.op == StageOp::unload) {
        unload(st.model);
        sp.checked = false;
      }
      if (dynamic) {
        sp.checked = false;
        // The patcher's free memory counts VBAR-resident bytes as free: at the start of a node
        // (cast buffers reset, cache emptied) that is what torch tensors leave of the device.
        sp.patcher_free = free_now();
        fill_dynamic_activation(s_, sp, sp.patcher_free);
      } else {
        fill_activation(sp);
      }
      sp.resident_total = resident_total();
      sp.offload_buffer = st.op == StageOp::unload ? 0 : state_[st.model].offload_buffer;
      sp.predicted_peak = sp.resident_total + sp.offload_buffer + (sp.checked ? sp.activation_allowance : 0);
      plan.stages.push_back(sp);
    }
    return plan;
  }

 private:
  // What is on the device: the free memory ComfyUI measures is the device's.
  Bytes resident_total() const {
    Bytes t = 0;
    for (const ModelState& m : state_) t += m.on_device;
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
      // VAE.decode: memory_used_decode is per sample (its shape terms are the latent's height and
      // width); after the load it decodes batch_number = free memory / that many samples per
      // call, the rest in further calls (checked against ComfyUI v0.31.0 through the adapter).
      const Bytes one = std::max<Bytes>(estimate(sp.model, 1), 1);
      sp.decode_batch = static_cast<std::uint32_t>(std::clamp<Bytes>(free_now() / one, 1, batch));
      sp.run_batch = sp.decode_batch;
      sp.passes = (batch + sp.decode_batch - 1) / sp.decode_batch;
      est = estimate(sp.model, sp.decode_batch);
    }
    sp.activation_allowance = std::max(c_.inference_floor, est);
    size_stage_activation(s_, sp);
  }

  // The classic load walk of model m (memoized: walk_memo.h): the listed modules in descending
  // (offload cost, bytes, name), and every module's offload cost. The reference is valid until
  // the next memo_walk on this thread.
  const WalkOrder& classic_walk(std::uint32_t m) {
    const ModelRef& ref = s_.models[m];
    const ModelSpec& model = *ref.spec;
    return memo_walk(ref.spec, WalkFlavor::classic, ref.compute, ref.lora, c_, [&](WalkOrder& w) {
      const std::vector<Bytes>& bytes = module_sizes(model);  // checks the flat arrays read here
      w.cost.resize(model.modules.size());
      w.convert.resize(model.modules.size());
      for (std::uint32_t i = 0; i < model.modules.size(); ++i) {
        w.cost[i] = offload_cost(model, i, ref.compute, ref.lora, c_);
        w.convert[i] = conversion_copies(model, i, ref);
        if (walk_kind(model.module_flags[i]) != Walk::unlisted) w.order.push_back(i);
      }
      // Descending offload cost, then bytes, then name.
      sort_walk(w.order, model, [&](std::uint32_t i) { return WalkKey{~w.cost[i], ~bytes[i], 0}; }, true);
      w.walk_cost.reserve(w.order.size());
      w.walk_bytes.reserve(w.order.size());
      w.walk_flags.reserve(w.order.size());
      for (const std::uint32_t i : w.order) {
        w.walk_cost.push_back(w.cost[i]);
        w.walk_bytes.push_back(bytes[i]);
        w.walk_flags.push_back(model.module_flags[i]);
      }
    });
  }

  // free_memory(target): evict other models, most-offloaded first, partially (smart memory):
  // each gives up its cheapest modules until the shortfall is covered.
  void free_memory(Bytes target, std::uint32_t keep, LoadPlan& lp) {
    if (free_now() >= target) return;
    std::vector<std::uint32_t> order;
    for (std::uint32_t m = 0; m < state_.size(); ++m) {
      // Dynamic models give way at run time (their VBAR pages: the vbar_free op, and aimdo's
      // hooks); their force-loaded weights are restored only when that is not enough: tiny.
      if (m != keep && state_[m].on_device > 0 && !s_.dynamic_model(m)) order.push_back(m);
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
      ModelState& st = state_[m];
      const ModelRef& ref = s_.models[m];
      auto evict = [&](std::uint32_t mod) {
        const Bytes b = spec(m).modules[mod].bytes;
        st.resident[mod] = 0;
        st.on_device -= b;
        st.loaded = sat_sub(st.loaded, b);
        ev.bytes += b;
        ev.modules.push_back(mod);
      };
      // partially_unload walks the module list in ascending (offload cost, size, name). It cannot
      // move the unlisted ones, nor a raw module whose weight a LoRA patched (no cast hook to
      // patch it on the fly); modules not on the device are passed over. The list is the load
      // walk's (the same modules, in descending order of the same keys) reversed: a model's module
      // names are unique, so the keys order it totally (tests/test_predict.cpp). The model was
      // loaded with these constants, so its walk is in the memo.
      const WalkOrder& walk = classic_walk(m);
      const std::vector<std::uint32_t> mods(walk.order.rbegin(), walk.order.rend());
      const std::vector<Bytes>& cost = walk.cost;  // no memo_walk until the next model
      auto movable = [&](std::uint32_t i) {
        const Module& mod = spec(m).modules[i];
        const Walk w = walk_kind(mod);
        return st.resident[i] && (w == Walk::cast || (w == Walk::raw && !(ref.lora && has_weight(mod))));
      };
      // model_unload: a shortfall of at least what ComfyUI counts as loaded detaches the whole
      // model; a smaller one unloads partially, and detaches too when that cannot cover it.
      // Detached, everything left on the device goes and nothing counts as loaded.
      const bool detach = shortfall >= st.loaded;
      if (!detach) {
        // With the look-ahead buffer (PR #11096) partially_unload grows the model's offload
        // buffer as it goes: each module it sends to host memory may be cast on the fly next to
        // the NUM_STREAMS modules sent before it (a sliding window seeded with
        // min(B / (NS + 1), the list's first module)), and it stops only once it has freed more
        // than the shortfall plus that growth (reference/comfyui-accounting.md 2.4 step 6).
        const bool sliding = c_.account == AccountMode::lookahead;
        const Bytes old_buffer = st.offload_buffer;
        Bytes buffer = old_buffer;
        std::vector<Bytes> window;
        if (sliding && !mods.empty()) window.assign(ns_, std::min<Bytes>(old_buffer / (ns_ + 1), spec(m).modules[mods[0]].bytes));
        for (const std::uint32_t i : mods) {
          if (sliding ? shortfall + (buffer - old_buffer) < ev.bytes : ev.bytes >= shortfall) break;
          if (!movable(i)) continue;
          const Bytes potential = cost[i] + std::accumulate(window.begin(), window.end(), Bytes{0});
          evict(i);
          if (sliding) {
            buffer = std::max(buffer, potential);
            if (!window.empty()) {
              window.erase(window.begin());
              window.push_back(spec(m).modules[i].bytes);
            }
          }
        }
        if (sliding) st.offload_buffer = buffer;
      } else {
        // Detached: what partially_unload could move first, in its order, then the rest.
        for (const std::uint32_t i : mods) {
          if (movable(i)) evict(i);
        }
      }
      if (detach || ev.bytes < shortfall) {
        for (std::uint32_t i = 0; i < st.resident.size(); ++i) {
          if (st.resident[i]) evict(i);
        }
        st.loaded = 0;
      }
      if (st.loaded == 0) st.offload_buffer = 0;
      lp.evictions.push_back(std::move(ev));
    }
  }

  // load_models_gpu for a dynamic model: legacy models are unloaded (smart memory) until
  // 1.1 x the model's size + extra_mem is free, VBAR bytes of other dynamic models counting as
  // free (ComfyUI subtracts their loaded size from the requirement instead); then staging.
  LoadPlan load_dynamic(std::uint32_t stage, std::uint32_t m) {
    const ModelSpec& model = spec(m);
    // What load_models_gpu started from, before it unloaded anything (as a classic load reports
    // it, and as the real planner's state reads through the ComfyUI adapter).
    const Bytes started_free = free_now();
    LoadPlan evictions;
    Bytes extra_mem = c_.inference_floor + c_.reserve;
    if (model.kind == ModelKind::diffusion) {
      extra_mem = std::max(extra_mem, estimate(m, multiply_batch(s_.workload.batch, c_.cfg_mult)) + c_.reserve);
    } else if (model.kind == ModelKind::vae) {
      extra_mem = std::max(extra_mem, estimate(m, 1) + c_.reserve);  // memory_used: one sample's
    }
    free_memory(scale_bytes(model.bytes - std::min(model.bytes, state_[m].loaded), c_.unload_factor, "policy.unload_factor") + extra_mem,
                m, evictions);
    LoadPlan lp = stage_dynamic(s_, stage, m, started_free);
    lp.evictions = std::move(evictions.evictions);
    lp.extra_mem = extra_mem;
    ModelState& st = state_[m];
    st.resident = lp.resident;
    st.loaded = lp.loaded;
    st.on_device = lp.staging.forced_bytes + lp.staging.uncounted;
    st.offload_buffer = 0;
    return lp;
  }

  void unload(std::uint32_t m) {
    std::fill(state_[m].resident.begin(), state_[m].resident.end(), 0);
    state_[m].on_device = 0;
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
      // The VAE passes memory_required only (memory_used_decode: one sample's, whatever the
      // batch); min_req falls back to extra_mem.
      lp.est_max = lp.est_min = estimate(m, 1);
      lp.extra_mem = lp.min_req = std::max(I, lp.est_max + R);
    } else {
      lp.extra_mem = lp.min_req = I;
    }

    // Step 2-3: evict to 1.1 x need + extra_mem, then to min_req.
    const Bytes need = model.bytes - st.loaded;
    const Bytes target = scale_bytes(need, c_.unload_factor, "policy.unload_factor") + lp.extra_mem;
    free_memory(target, m, lp);
    // Next to dynamic models, free_memory also asks each of them to give up VBAR pages until the
    // target is free (partially_unload): how many, only the run knows.
    if (s_.policy.dynamic()) lp.free_target = target;
    if (free_now() < lp.min_req) free_memory(lp.min_req, m, lp);

    // Step 4: the weight budget. F counts this model's own loaded bytes as available.
    const i64 F = as_signed(free_now() + st.loaded);
    const i64 by_ratio = std::min(static_cast<i64>(static_cast<double>(F) * c_.min_weight_ratio), F - as_signed(I));
    i64 budget = std::max({as_signed(c_.weight_floor), F - as_signed(lp.min_req), by_ratio});
    lp.usable = budget - as_signed(st.loaded);
    // The walk below compares against the whole budget (what is loaded counts toward it).
    const i64 budget_total = std::max<i64>(budget, 0);

    const WalkOrder& memo = classic_walk(m);
    lp.offload_cost = memo.cost;
    lp.sorted = memo.order;

    lp.lowvram.assign(model.modules.size(), 0);
    const std::vector<Bytes>& sizes = module_sizes(model);  // modules[i].bytes, flat
    if (budget_total > as_signed(model.bytes)) {
      // Step 5, full load: the walk places every listed module and reserves no buffer, then
      // model.to(device) moves the rest, and ComfyUI counts the whole model as loaded. Its log
      // line, printed in between, counts what the walk placed.
      lp.full_load = true;
      lp.resident.assign(model.modules.size(), 1);
      for (const Bytes bytes : memo.walk_bytes) lp.loaded += bytes;
      st.loaded = model.bytes;
    } else {
      // Whatever the walk does not place stays where it was.
      lp.resident = st.resident;
      walk(memo, lp, budget_total);
      st.loaded = lp.loaded;
    }
    std::uint32_t lowvram_modules = 0;
    for (std::uint32_t i = 0; i < model.modules.size(); ++i) {
      if (!lp.lowvram[i]) continue;
      lp.offloaded += sizes[i];
      ++lowvram_modules;
    }
    lp.uncounted = model.bytes - lp.loaded - lp.offloaded;
    st.resident = lp.resident;
    st.on_device = 0;
    for (std::uint32_t i = 0; i < model.modules.size(); ++i) st.on_device += lp.resident[i] ? sizes[i] : 0;
    st.offload_buffer = lp.offload_buffer;
    transient_window(model, memo.convert, lp);
    // "loaded partially" when a module is cast on the fly, else "loaded completely", a walk
    // included where every listed module fitted or only raw ones did not ("full load: False").
    lp.log_line = lowvram_modules == 0
                      ? fmt::format("loaded completely; {:.2f} MB usable, {:.2f} MB loaded, full load: {}",
                                    static_cast<double>(lp.usable) / MiB, to_mib(lp.loaded), lp.full_load ? "True" : "False")
                      : fmt::format("loaded partially; {:.2f} MB usable, {:.2f} MB loaded, {:.2f} MB offloaded, "
                                    "{:.2f} MB buffer reserved, lowvram patches: {}",
                                    static_cast<double>(lp.usable) / MiB, to_mib(lp.loaded), to_mib(lp.offloaded),
                                    to_mib(lp.offload_buffer), lp.lowvram_patches);
    return lp;
  }

  // ModelPatcher.load's greedy walk (§2.4 step 3) over the listed modules: in sorted order, a
  // module is resident if loaded + module_mem + potential < budget; a miss raises the buffer to
  // its potential and marks a cast-hook module for casting on the fly. A raw module that misses
  // is not moved: it stays where it was (lp.resident holds that on entry).
  void walk(const WalkOrder& order, LoadPlan& lp, i64 budget) {
    // The listed modules' bytes, costs and flags in walk order (walk_memo.h): read in sequence.
    const std::vector<Bytes>& sizes = order.walk_bytes;
    const std::vector<Bytes>& costs = order.walk_cost;
    const std::vector<std::uint8_t>& flags = order.walk_flags;
    Bytes largest = 0;  // of the listed modules (only the `largest` accounting reads it)
    if (c_.account == AccountMode::largest) {
      for (const Bytes bytes : sizes) largest = std::max(largest, bytes);
    }
    Bytes loaded = 0;
    Bytes buffer = 0;
    const bool lora = s_.models[lp.model].lora;
    const std::size_t listed = lp.sorted.size();
    for (std::size_t k = 0; k < listed; ++k) {
      const std::uint32_t i = lp.sorted[k];
      // The per-module flags the walk writes are scattered over the model: in a large one each is
      // a cache miss, so the writes of the module kPrefetch places ahead start now.
      if (k + kPrefetch < listed) {
        const std::uint32_t ahead = lp.sorted[k + kPrefetch];
        __builtin_prefetch(&lp.resident[ahead], 1);
        __builtin_prefetch(&lp.lowvram[ahead], 1);
      }
      const Bytes bytes = sizes[k];
      Bytes potential = 0;
      switch (c_.account) {
        case AccountMode::none: break;
        case AccountMode::largest: potential = costs[k] + ns_ * largest; break;
        case AccountMode::lookahead:
          potential = costs[k];
          for (std::size_t n = 1; n <= ns_ && k + n < listed; ++n) potential += sizes[k + n];
          break;
      }
      potential = std::max(buffer, potential);
      if (as_signed(loaded + bytes + potential) < budget) {
        lp.resident[i] = 1;
        loaded += bytes;
      } else {
        buffer = potential;
        if ((flags[k] & kModuleCastHook) != 0) {
          lp.resident[i] = 0;
          lp.lowvram[i] = 1;
          if (lora) ++lp.lowvram_patches;
        }
      }
    }
    lp.loaded = loaded;
    lp.offload_buffer = buffer;
  }

  // The compute-dtype copies module i's forward allocates when it is offloaded: a copy of every
  // parameter whose dtype needs a conversion, and for LoRA the private cast copy and the delta of
  // each weight. The conversion term of the realistic transient below (memoized: classic_walk).
  static Bytes conversion_copies(const ModelSpec& model, std::uint32_t i, const ModelRef& ref) {
    Bytes copies = 0;
    for (std::uint32_t ti = model.tensor_first[i]; ti < model.tensor_first[i + 1]; ++ti) {
      const FlatTensor& t = model.tensors_flat[ti];
      if (!is_parameter(t)) continue;
      if (ref.lora && t.role == TensorRole::weight) {
        copies += 2 * compute_copy(t, ref.compute);  // the private cast copy and the LoRA delta
      } else if (needs_conversion(t.dtype, ref.compute)) {
        copies += compute_copy(t, ref.compute);
      }
    }
    return copies;
  }

  // §5's realistic transient: the worst forward-order window of NS+1 consecutive offloaded
  // modules: all their storage bytes, plus the compute-dtype copy (and LoRA temporaries) of the
  // one being converted (`convert`, per module: conversion_copies). Counted in the predictor's own
  // units (no allocator rounding: that is what P1 and the allocator overhead bound measure), so P3
  // checks the #11171 invariant itself. Only modules cast on the fly are transferred; a raw module
  // left in host memory is not.
  void transient_window(const ModelSpec& model, const std::vector<Bytes>& convert, LoadPlan& lp) const {
    const std::vector<Bytes>& sizes = module_sizes(model);  // modules[i].bytes, flat
    std::vector<std::uint32_t> off;
    for (std::uint32_t i = 0; i < model.modules.size(); ++i) {
      if (lp.lowvram[i]) off.push_back(i);
    }
    for (std::size_t j = 0; j < off.size(); ++j) {
      Bytes w = convert[off[j]];
      for (std::size_t n = 0; n <= ns_ && j + n < off.size(); ++n) w += sizes[off[j + n]];
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

namespace {

// A module's offload cost from its bytes, cast hook and tensors (Tensor or FlatTensor).
template <class Tensors>
Bytes offload_cost_of(Bytes bytes, bool cast_hook, const Tensors& tensors, Dtype compute, bool lora, const ComfyConstants& c) {
  Bytes cost = bytes;
  // Only a module that casts its weights converts them: a raw module (no cast hook) costs its
  // bytes, LoRA or not.
  if (!cast_hook || !c.dequant_term) return cost;
  for (const auto& t : tensors) {
    if (!is_parameter(t)) continue;
    if (lora && t.role == TensorRole::weight) {
      // (a) a patched weight: numel x manual-cast bytes x LOWVRAM_PATCH_ESTIMATE_MATH_FACTOR
      cost += scale_bytes(counted_copy(t, compute), c.lora_math_factor, "policy.lora_math_factor");
    } else if (needs_conversion(t.dtype, compute)) {
      // (b) the #11171 upcast/dequant term: one compute-dtype copy, as numel() counts it
      cost += counted_copy(t, compute);
    }
  }
  return cost;
}

}  // namespace

Bytes offload_cost(const ModelSpec& model, std::uint32_t i, Dtype compute, bool lora, const ComfyConstants& c) {
  const std::span<const FlatTensor> tensors(model.tensors_flat.data() + model.tensor_first[i], model.tensor_first[i + 1] - model.tensor_first[i]);
  return offload_cost_of(model.module_sizes[i], (model.module_flags[i] & kModuleCastHook) != 0, tensors, compute, lora, c);
}

Bytes offload_cost(const Module& m, Dtype compute, bool lora, const ComfyConstants& c) {
  return offload_cost_of(m.bytes, m.cast_hook, m.tensors, compute, lora, c);
}

}  // namespace vf

// ComfyUI's dynamic VRAM predictor (ModelPatcherDynamic, comfy/model_patcher.py; the default since
// ComfyUI 0.16): staging, not placement (reference/comfyui-dynamic-vram.md §2.1-2.2).
//
// load() sorts the modules ascending on (offload cost >= 64 KiB, -offload cost): the modules
// whose cost is under 64 KiB first, then the rest by descending cost (the #11171 cost: storage
// bytes plus a compute-dtype copy of weights stored in another dtype, or the LoRA estimate).
// Walking that order, a module with the cast hook and more than 16 KiB gets a slice of the
// model's VBAR (its weight and bias in their stored dtype, each rounded to 1 KiB, the slice at
// a 512 B-aligned offset: lower offsets are faulted first and evicted last); smaller ones ("tiny
// weights stall stream rotation") and modules without the cast hook are force-loaded as
// ordinary torch tensors, as are every other parameter and buffer. The VBAR asks for 10 x the
// model's size; aimdo caps it at the card's total in 32 MiB pages, so slices past the cap can
// only ever be cast through a buffer. Where each staged weight lives is decided at run time by
// comfy-aimdo (harness/sim/aimdo.h): the plan is the order and the force-loaded set.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "harness/predictors/predictors.h"
#include "harness/predictors/walk_memo.h"
#include "harness/sim/aimdo.h"
#include "models/activation.h"

namespace vf {
namespace {

// Modules whose offload cost is under this sort first (the "small weights" class).
constexpr Bytes kSmallCostClass = 64 * KiB;
// Modules of at most this many bytes are force-loaded ("tiny weights stall stream rotation").
constexpr Bytes kForceLoadBytes = 16 * KiB;

// ModelPatcherDynamic keeps a model's buffers (not parameters) out of the "weights" count.
bool is_buffer(TensorRole role) { return role == TensorRole::other; }

}  // namespace

LoadPlan stage_dynamic(const Scenario& s, std::uint32_t stage, std::uint32_t m, Bytes free_before) {
  const ModelRef& ref = s.models[m];
  const ModelSpec& model = *ref.spec;
  const std::size_t n = model.modules.size();
  LoadPlan lp;
  lp.stage = stage;
  lp.model = m;
  lp.dynamic = true;
  lp.free_before = free_before;
  StagingPlan& st = lp.staging;
  st.vbar_request = model.bytes * sim::kVbarRequestFactor;
  st.vbar_pages = sim::vbar_pages_for(st.vbar_request, s.device.total);

  // The modules of the load walk (_load_list): every module with the cast hook or parameters of
  // its own, but no container (a module whose children hold parameters: its own are moved to the
  // device beside the walk, uncounted). The sort key: the #11171 offload cost for modules with
  // the cast hook, their size otherwise.
  ComfyConstants costs = s.policy.constants;
  costs.dequant_term = true;
  const WalkOrder& walk = memo_walk(ref.spec, WalkFlavor::dynamic, ref.compute, ref.lora, costs, [&](WalkOrder& w) {
    // From the model's flat arrays (module_sizes checks them): a Module and its Tensors are a
    // cache miss each in a model the memo has not seen.
    const std::vector<Bytes>& bytes = module_sizes(model);
    w.cost.assign(n, 0);
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint8_t flags = model.module_flags[i];
      if ((flags & kModuleContainer) != 0 || (flags & (kModuleCastHook | kModuleOwnsParameters)) == 0) continue;
      w.order.push_back(i);
      w.cost[i] = (flags & kModuleCastHook) != 0 ? offload_cost(model, i, ref.compute, ref.lora, costs) : bytes[i];
    }
    // Small-cost class first, then descending cost, ascending bytes, ascending name.
    sort_walk(w.order, model, [&](std::uint32_t i) {
      const Bytes c = w.cost[i];
      return WalkKey{c >= kSmallCostClass ? 1u : 0u, ~c, bytes[i]};
    }, false);
  });
  st.offload_cost = walk.cost;
  st.order = walk.order;

  st.slice_offset.assign(n, 0);
  st.slice_size.assign(n, 0);
  st.forced_module.assign(n, 0);
  lp.resident.assign(n, 0);
  lp.sorted = st.order;
  Bytes cursor = 0;
  const Bytes cap = st.vbar_pages * sim::kVbarPage;
  std::vector<std::uint8_t> walked(n, 0);
  // The walk reads the model's flat arrays (ModelSpec::tensors_flat): in walk order the modules are
  // scattered over the model, and a Module and each of its Tensors were a cache miss apiece (this
  // loop took 2.5 % of a campaign's time, eight times its share of the instructions).
  const std::vector<Bytes>& module_bytes = module_sizes(model);  // checks the flat arrays too
  const std::uint32_t* const tensor_first = model.tensor_first.data();
  const FlatTensor* const tensors = model.tensors_flat.data();
  for (const std::uint32_t i : st.order) {
    walked[i] = 1;
    const bool staged = (model.module_flags[i] & kModuleCastHook) != 0 && module_bytes[i] > kForceLoadBytes;
    Bytes slice = 0;
    bool any_forced = false;
    for (std::uint32_t k = tensor_first[i]; k < tensor_first[i + 1]; ++k) {
      const FlatTensor& t = tensors[k];
      if (staged && staged_role(t.role)) {
        slice += round_up(t.bytes, sim::kTensorAlign);
        if (ref.lora && t.role == TensorRole::weight) ++st.patches;  // a LowVramPatch per LoRA'd weight
        continue;
      }
      // Force-loaded: moved to the device as it is stored (parameters are counted as "weights",
      // buffers only in the bytes).
      any_forced = true;
      if (!is_buffer(t.role)) ++st.forced;
      st.forced_bytes += t.bytes;
    }
    if (slice != 0) {
      cursor = round_up(cursor, sim::kSliceAlign);
      st.slice_offset[i] = cursor;
      st.slice_size[i] = slice;
      cursor += slice;
      st.staged += slice;
      if (cursor > cap) ++st.slices_beyond_cap;
    }
    if (!staged && any_forced) {
      st.forced_module[i] = 1;
      lp.resident[i] = 1;
    }
  }
  // Outside the walk: containers' own parameters are moved to the device uncounted; every buffer
  // is moved and counted in model_loaded_weight_memory.
  for (std::uint32_t i = 0; i < n; ++i) {
    if (walked[i]) continue;
    for (std::uint32_t k = tensor_first[i]; k < tensor_first[i + 1]; ++k) {
      if (is_buffer(tensors[k].role)) st.forced_bytes += tensors[k].bytes;
      else st.uncounted += tensors[k].bytes;
    }
    st.forced_module[i] = 1;
    lp.resident[i] = 1;
  }
  st.vbar_end = cursor;
  lp.loaded = st.forced_bytes;
  lp.offloaded = st.staged;
  lp.uncounted = st.uncounted;  // on the device, in neither of the log's figures
  lp.log_line = fmt::format("Model {} prepared for dynamic VRAM loading. {}MB Staged. {} patches attached.{}", ref.id,
                            st.staged / MiB, st.patches,
                            st.forced > 0 ? fmt::format(" Force pre-loaded {} weights: {} KB.", st.forced, st.forced_bytes / KiB) : "");
  return lp;
}

void fill_dynamic_activation(const Scenario& s, StagePlan& sp, Bytes patcher_free) {
  const ModelRef& ref = s.models[sp.model];
  const ModelSpec& m = *ref.spec;
  const ComfyConstants& c = s.policy.constants;
  const std::uint32_t batch = s.workload.batch;
  const std::string what = fmt::format("models[{}]", sp.model);
  auto estimate = [&](std::uint32_t b) { return comfy_memory_required(m, s.workload, b, ref.compute, c.flash_attention, what); };
  sp.run_batch = batch;
  sp.passes = 1;
  Bytes est = 0;
  if (m.kind == ModelKind::diffusion) {
    // samplers.py: conds are batched while 1.5 x memory_required (the BaseModel's, unpadded) is
    // under the patcher's free memory.
    est = estimate(batch);
    if (s.workload.cfg > 1.0) {
      const Bytes both = estimate(batch * 2);
      if (static_cast<double>(both) * c.cond_batch_safety < static_cast<double>(patcher_free)) {
        sp.run_batch = batch * 2;
        est = both;
      } else {
        sp.passes = 2;
      }
    }
  } else if (m.kind == ModelKind::vae) {
    // VAE.decode: batch_number = patcher free memory / the decode estimate of one image.
    const Bytes one = std::max<Bytes>(estimate(1), 1);
    sp.decode_batch = static_cast<std::uint32_t>(std::clamp<Bytes>(patcher_free / one, 1, batch));
    sp.run_batch = sp.decode_batch;
    sp.passes = (batch + sp.decode_batch - 1) / sp.decode_batch;
    est = estimate(sp.decode_batch);
  }
  sp.activation_allowance = std::max(c.inference_floor, est);
  size_stage_activation(s, sp);
}

}  // namespace vf

// The predictor under test. `comfy` reproduces ComfyUI's classic (non-dynamic) VRAM accounting:
// reserve and inference floor, activation estimate, eviction, weight budget, offload cost, the
// sorted greedy walk with its offload buffer (reference/comfyui-accounting.md §2, §5).
// `exact` takes the same placement and predicts the exact live-bytes peak of the lowered
// program: the lower bound any predictor must cover.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/core/bytes.h"
#include "harness/scenario.h"

namespace vf {

struct Eviction {
  std::uint32_t model = 0;
  std::vector<std::uint32_t> modules;  // modules unloaded from the device
  Bytes bytes = 0;
};

// ModelPatcherDynamic.load: staging, not placement. The modules in staging order get slices of
// the model's VBAR (lower offsets: evicted last, faulted first), small ones and those a LoRA
// resizes are force-loaded as ordinary torch tensors; where a staged weight really lives is
// decided at run time by comfy-aimdo.
struct StagingPlan {
  Bytes vbar_request = 0;          // 10 x the model's size
  std::uint64_t vbar_pages = 0;    // what aimdo grants: capped at floor(total VRAM / 32 MiB)
  Bytes staged = 0;                // the slices' bytes ("N MB Staged")
  Bytes vbar_end = 0;              // the end of the last slice (>= staged: 512 B alignment)
  std::uint32_t patches = 0;       // LowVramPatch objects attached ("P patches attached")
  std::uint32_t forced = 0;        // force-loaded parameters ("Force pre-loaded K weights")
  Bytes forced_bytes = 0;          // model_loaded_weight_memory ("S KB"): parameters and buffers
  Bytes uncounted = 0;             // containers' own parameters: on the device, in no figure
  std::vector<std::uint32_t> order;       // the staging order (module indices)
  std::vector<Bytes> offload_cost;        // per module: the sort key's cost (#11171 rules)
  std::vector<Bytes> slice_offset;        // per module
  std::vector<Bytes> slice_size;          // per module (0: not staged)
  std::vector<std::uint8_t> forced_module;  // per module: its tensors live on the device as torch tensors
  std::uint64_t slices_beyond_cap = 0;    // staged modules whose slice ends past the capped VBAR
};

// One `load` stage: ComfyUI's load_models_gpu + ModelPatcher.load for one model.
struct LoadPlan {
  std::uint32_t stage = 0;
  std::uint32_t model = 0;
  Bytes free_before = 0;      // free memory (predictor's view) when the load starts
  Bytes est_max = 0;          // memory_required at batch x cfg_mult (0: none given)
  Bytes est_min = 0;          // memory_required at batch x 1
  Bytes extra_mem = 0;        // max(I, est_max + R)
  Bytes min_req = 0;          // max(I, est_min + R)
  std::vector<Eviction> evictions;
  std::int64_t usable = 0;    // the weight budget after subtracting what was loaded ("U MB usable")
  bool full_load = false;     // ComfyUI's full_load: the budget exceeds the model, everything goes to the device
  // The log line's figures. `loaded` ("L MB loaded"): the modules the walk placed on the device
  // (on a full load every module it lists). `offloaded` ("O MB offloaded"): the modules cast on
  // the fly. `uncounted`: the rest, in neither figure: raw modules (no cast hook) that did not
  // fit and modules the walk does not list (containers of raw tensors, modules of buffers only).
  // loaded + offloaded + uncounted = the model's bytes; where each module is, is `resident`.
  Bytes loaded = 0;
  Bytes offloaded = 0;
  Bytes uncounted = 0;
  Bytes offload_buffer = 0;   // B: what the walk reserved for offloaded modules' transients
  std::uint32_t lowvram_patches = 0;
  // Per module, after this load: on the device (placed by the walk, moved by a full load, or left
  // there by an earlier load), and cast on the fly (transferred at every forward). A module that is
  // neither is in host memory and is not transferred: a raw one the walk did not place.
  std::vector<std::uint8_t> resident;
  std::vector<std::uint8_t> lowvram;
  std::vector<std::uint32_t> sorted;      // the walk: the modules it lists, by descending offload cost
  std::vector<Bytes> offload_cost;        // per module (a module without the cast hook: its bytes)
  Bytes realistic_transient = 0;  // P3: worst forward-order window of NS+1 offloaded modules
  std::uint32_t transient_module = 0;     // the module converted in that window
  std::string log_line;           // "loaded partially; U MB usable, L MB loaded, ..."
  bool dynamic = false;           // ModelPatcherDynamic: `staging` says what it did
  StagingPlan staging;
  // A legacy model loaded next to dynamic ones: free_memory's target, which the run reaches by
  // evicting VBAR pages (0: none).
  Bytes free_target = 0;
};

// What the predictor promises for one pipeline stage.
struct StagePlan {
  std::uint32_t stage = 0;
  StageOp op = StageOp::load;
  std::uint32_t model = 0;
  bool checked = true;              // unload stages only shrink: not checked
  Bytes resident_total = 0;         // weights of every model on the device during the stage
  Bytes offload_buffer = 0;         // of the model in use
  Bytes activation_allowance = 0;   // max(inference floor, estimate for the admitted batch)
  Bytes activation_bytes = 0;       // the working set the runtime holds (lowering allocates it)
  Bytes activation_formula = 0;     // vramfuzz's formula for the rows one forward runs (the `model` source)
  ActivationSizing activation;      // which source sized activation_bytes (scenario.activations)
  std::uint32_t run_batch = 1;      // batch per forward pass (batch, or 2 x batch when conds are batched)
  std::uint32_t passes = 1;         // 2 when CFG runs cond and uncond as separate passes
  Bytes predicted_peak = 0;         // comfy: resident + buffer + allowance; exact: live peak
  int load_plan = -1;               // index into Plan::loads for load stages
  // Dynamic VRAM: the stage's model is placed at run time (no predicted peak: `checked` is false
  // and the oracle's dynamic property judges it); the free memory its patcher reported, which
  // counts every VBAR-resident byte as free, decided the cond batch and the VAE decode batch.
  bool dynamic = false;
  Bytes patcher_free = 0;
  std::uint32_t decode_batch = 0;   // VAE: images per decode pass (0: not a VAE forward)
};

struct Plan {
  std::string policy;     // "comfy:dec2025"
  Bytes reserve = 0;      // R (comfy) or the exact reserve
  std::uint32_t streams = 0;
  Bytes available = 0;    // device total - others - context
  std::vector<LoadPlan> loads;
  std::vector<StagePlan> stages;
  Bytes predicted_peak = 0;  // max over checked stages
  bool fits = true;          // predicted_peak + reserve <= available: an OOM is not expected
  bool dynamic = false;      // a dynamic VRAM preset: the oracle's dynamic property applies
};

// Runs the scenario's policy. Pure function of the scenario.
Plan predict(const Scenario& s);

// Whether a tensor is one ModelPatcherDynamic stages in a module's VBAR slice (its weight and
// bias: weight, bias, norm and embedding roles); the others (fp8 scales, buffers) are moved to
// the device as torch tensors. By role, for the loops over ModelSpec::tensors_flat.
constexpr bool staged_role(TensorRole role) {
  return role == TensorRole::weight || role == TensorRole::bias || role == TensorRole::norm || role == TensorRole::embedding;
}
inline bool staged_tensor(const Tensor& t) { return staged_role(t.role); }

// The offload cost ComfyUI sorts by (module_mem + the upcast/dequant or LoRA term, §2.4; the
// term only for modules with the cast hook).
Bytes offload_cost(const Module& m, Dtype compute, bool lora, const ComfyConstants& c);
// The same for module `i` of a finalized model, from its flat arrays (the load walks' builds read
// every module of a model the memo has not seen: a Module and its Tensors are cache misses each).
Bytes offload_cost(const ModelSpec& model, std::uint32_t i, Dtype compute, bool lora, const ComfyConstants& c);

// Printable plan: the ComfyUI-style lines plus the per-stage prediction table.
std::string format_plan(const Scenario& s, const Plan& p);

}  // namespace vf

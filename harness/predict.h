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
  Bytes activation_bytes = 0;       // the working set the runtime really holds (lowering allocates it)
  std::uint32_t run_batch = 1;      // batch per forward pass (batch, or 2 x batch when conds are batched)
  std::uint32_t passes = 1;         // 2 when CFG runs cond and uncond as separate passes
  Bytes predicted_peak = 0;         // comfy: resident + buffer + allowance; exact: live peak
  int load_plan = -1;               // index into Plan::loads for load stages
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
};

// Runs the scenario's policy. Pure function of the scenario.
Plan predict(const Scenario& s);

// The offload cost ComfyUI sorts by (module_mem + the upcast/dequant or LoRA term, §2.4; the
// term only for modules with the cast hook).
Bytes offload_cost(const Module& m, Dtype compute, bool lora, const ComfyConstants& c);

// Printable plan: the ComfyUI-style lines plus the per-stage prediction table.
std::string format_plan(const Scenario& s, const Plan& p);

}  // namespace vf

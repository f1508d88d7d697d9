// What a classic finding's peak is made of, against what the plan budgeted (docs/attribution.md).
// At the judged op (a checked stage's reserved peak, or the failing allocation)
// the allocator's reserved bytes split into what the program holds live there, by buffer kind,
// and what the allocator adds on top of it:
//   resident weights        budgeted by the plan's loaded weights (every model on the device)
//   weight transients       transfer copies, conversions (upcast / dequant / scaled fp8), LoRA
//                           patches; budgeted by the offload buffer the walk reserved
//   activations             budgeted by the activation allowance (inference floor or estimate)
//   rounding                allocated - requested: the allocator's block and page rounding; budget 0
//   other streams' frees    of reserved - allocated, what the judged op's stream could not reuse:
//                           blocks cached for or pending on other streams (the async-offload
//                           lag of class B); budget 0
//   slack                   the rest of reserved - allocated: cached, unused blocks; budget 0
// The prediction is the sum of the three budgets; the reserve covers the rest. The diagnosis is
// the categories over their budget, with bytes and tensor counts. Live bytes are exact (the
// program's own buffers); rounding and slack come from the allocator (modelled on sim, measured
// on cuda); the activations are vramfuzz's formula.
#pragma once

#include <cstdint>
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "harness/core/bytes.h"
#include "harness/exec.h"
#include "harness/lower.h"
#include "harness/predict.h"
#include "harness/scenario.h"

namespace vf {

enum class PeakPart : std::uint8_t { weights, transfer, convert, scaled, lora, activation, rounding, held, slack };
inline constexpr std::size_t kPeakParts = 9;
std::string_view peak_part_name(PeakPart p);  // "resident weights", "transfer copies", ...

// The plan's terms a part is charged against.
enum class Budget : std::uint8_t { loaded_weights, offload_buffer, activation_allowance, none };
std::string_view budget_name(Budget b);  // "loaded weights", "offload buffer", "activation allowance", "nothing"
Budget budget_of(PeakPart p);

struct PeakShare {
  Bytes bytes = 0;
  std::uint32_t tensors = 0;  // live buffers of the part (rounding: the tensors it is spread over)
};

struct Attribution {
  std::uint32_t op = 0;
  std::uint32_t stage = 0;
  Bytes reserved = 0;    // the allocator's reserved bytes at the op (with the failing request, for an OOM)
  Bytes allocated = 0;
  Bytes requested = 0;   // live requested bytes (with the failing request)
  Bytes failed = 0;      // an OOM's failing request (0: the op is a peak, not an OOM)
  std::array<PeakShare, kPeakParts> parts{};
  // The plan's terms for the stage.
  Bytes budget_weights = 0;
  Bytes budget_offload = 0;
  Bytes budget_activation = 0;
  Bytes reserve = 0;
  // The offloaded weights whose transients are live at the op, largest first (up to 3 named).
  std::vector<std::string> transient_modules;
  std::uint32_t transient_weights = 0;  // how many distinct tensors
  Dtype storage = Dtype::fp8_e4m3fn;    // of the largest conversion transient's source (when there is one)
  Dtype compute = Dtype::bf16;
  bool has_conversion = false;
  std::uint32_t stream = 0;  // the judged op's stream (0: compute)
  // Transfer copies live at the op: of how many offloaded modules, on how many offload streams
  // (more than one module: prefetched ahead of the compute stream, the async-offload overlap).
  std::uint32_t transfer_modules = 0;
  std::uint32_t transfer_streams = 0;
  Bytes transfer_extra = 0;  // the transfer copies of every module in flight but the largest one
  AllocatorMode mode = AllocatorMode::raw;
  // Class B, the async-offload overlap: the weight transients are over their budget by more than
  // the reserve only because the copies of other offloaded modules, issued ahead on the offload
  // streams, are in flight beside the largest one's (with one module in flight the excess would
  // be within the reserve: that case is class A's, one module's transients).
  bool offload_overlap() const;

  Bytes group(Budget b) const;   // the measured bytes charged against a budget
  Bytes budget(Budget b) const;  // the plan's bytes for it (0 for none)
  // Measured - budget for each budget with something over it, and rounding, other streams'
  // frees and slack (budgeted nothing), largest first.
  struct Excess {
    Budget budget = Budget::none;
    PeakPart part = PeakPart::rounding;  // budget none: rounding, held or slack
    std::int64_t bytes = 0;
  };
  std::vector<Excess> excesses() const;
};

// At op `op` of stage `stage` with the allocator at `reserved` / `allocated`; `failed` is the
// request that failed there (an OOM), else none; `held`: of reserved - allocated, what the op's
// stream could not reuse (ExecResult::stage_held_at_peak, OomEvent::held).
Attribution attribute(const Scenario& s, const Plan& plan, const Program& p, std::uint32_t stage, std::uint32_t op, Bytes reserved,
                      Bytes allocated, std::optional<Bytes> failed, Bytes held = 0);

// The one line a table shows: the largest over-budget category with its bytes, count and budget
// ("weight transients 1120.0 MiB for 2 weights (2 offloaded, ...), fp8_e4m3fn -> fp32 conversions ..., budgeted 480.0 MiB
// (offload buffer): +640.0 MiB").
std::string attribution_cause(const Attribution& a);
// The paragraph: every part against its budget, then what went over.
std::string attribution_paragraph(const Attribution& a);

}  // namespace vf

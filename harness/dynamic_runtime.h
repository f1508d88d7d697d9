// The run-time half of dynamic VRAM: what a backend does for the ops whose outcome is decided
// while the program runs (vbar_prioritize, vbar_fault, vbar_unpin, vbar_free, node_end and the
// ops conditional on a fault), on top of the aimdo model (harness/sim/aimdo.h). Both backends
// use it: `sim` over the simulated device, `cuda` over real VMM pages.
//
// ComfyUI's side of each op (comfy/ops.py cast_modules_with_vbar, model_management's offload
// streams and cast buffers, model_patcher's partially_unload):
//   - a fault whose pages still carry the serials of the module's last copy is resident: no
//     copy; otherwise the slice is copied in (its pages are new) and the serials saved;
//   - a refused fault sends the weight through the offload stream's cast buffer: one offload
//     stream per cast_modules_with_vbar call (get_offload_stream rotates over NUM_STREAMS), the
//     call's refused modules at consecutive offsets; the module needing the largest cast so far
//     takes one more rotation (LARGEST_AIMDO_CASTED_WEIGHT) so both streams do not grow to it;
//   - vbar_free: partially_unload (pages of the model's VBAR from its top), or for a legacy
//     load free_memory's loop: each dynamic model gives up pages until the target is free;
//   - node_end: reset_cast_buffers (every cast buffer destroyed, the LARGEST rule reset),
//     vbars_reset_watermark_limits, soft_empty_cache.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/exec.h"
#include "harness/lower.h"
#include "harness/scenario.h"
#include "harness/sim/aimdo.h"

namespace vf {

// What the dynamic runtime needs of the backend's torch allocator.
class TorchView {
 public:
  virtual ~TorchView() = default;
  virtual void synchronize() = 0;
  virtual void empty_cache() = 0;
  // model_management.get_free_memory: the driver's free memory plus torch's reserved - active.
  virtual Bytes free_memory() const = 0;
};

// std::llround of a positive duration, inline: libm's llround is a call, and a campaign rounds
// about a million durations per thousand cases. Below 2^52 the truncation is the floor and
// us - floor(us) is exact, so halves round up as llround's do; anything else (2^52 and more, NaN)
// goes to llround itself.
inline std::uint64_t round_us(double us) {
  if (!(us < 0x1p52)) return static_cast<std::uint64_t>(std::llround(us));
  const auto whole = static_cast<std::uint64_t>(us);
  return whole + (us - static_cast<double>(whole) >= 0.5 ? 1 : 0);
}
// Whether OpClock::duration_us can be above 0 for an op of this kind (a backend skips the call
// for the others: most ops are allocations and frees).
constexpr bool op_takes_time(OpKind k) { return k == OpKind::h2d || k == OpKind::vbar_fault || k == OpKind::compute; }

// The modelled duration of an op, in microseconds: copies to the device at device.h2d_gbps
// (`moved` bytes: an h2d's buffer, a fault's copy), compute at device.tflops over 2 x weight
// elements x the stage's rows; allocations, frees, conversions and syncs take none. One clock per
// run, inline in the backends' loops: the rates' divisors and each model's weight-element array
// are read once, not through the scenario on every op (a dynamic campaign times about a million
// ops per thousand cases).
class OpClock {
 public:
  explicit OpClock(const Scenario& s) : copy_div_(s.device.h2d_gbps * 1e3), flops_div_(s.device.tflops * 1e6) {
    numels_.reserve(s.models.size());
    for (const ModelRef& m : s.models) numels_.push_back(m.spec->module_weight_numels.data());
  }
  std::uint64_t duration_us(const Program& p, const Op& op, Bytes moved) const {
    double us = 0;
    switch (op.kind) {
      case OpKind::h2d: us = static_cast<double>(p.buffers[op.buffer].bytes) / copy_div_; break;
      case OpKind::vbar_fault: us = static_cast<double>(moved) / copy_div_; break;
      case OpKind::compute: {
        if (op.phase != Phase::forward || op.module == kNone) return 0;  // LoRA merges at load: no model time
        // From the flat array (checked against the modules when the program was lowered): the
        // Module itself is a cache miss per op in a large model.
        const double flops = 2.0 * static_cast<double>(numels_[op.model][op.module]) * static_cast<double>(p.stage_rows[op.stage]);
        us = flops / flops_div_;
        break;
      }
      default: return 0;  // no modelled time (most ops: allocations and frees)
    }
    return us > 0 ? round_us(us) : 0;
  }

 private:
  double copy_div_;
  double flops_div_;
  std::vector<const std::uint64_t*> numels_;  // per model: its spec's module_weight_numels
};

// The live torch tensors of a run by what they are, for the account of a dynamic OOM.
struct LiveTensors {
  std::vector<Bytes> weights;  // per model: its torch weights (force-loaded, legacy resident)
  Bytes others = 0;            // activations, conversion transients, LoRA, transfer / cast buffers
  explicit LiveTensors(std::size_t models = 0) : weights(models, 0) {}
  void add(const Buffer& b) { (b.kind == BufferKind::weight ? weights[b.model] : others) += b.bytes; }
  void remove(const Buffer& b) { (b.kind == BufferKind::weight ? weights[b.model] : others) -= b.bytes; }
};

class DynamicRuntime;

// The device at a failing request of op `op`, after aimdo's eviction (exec.h's DynamicOom):
// `torch` the torch allocator's statistics, `free` the driver's free memory, `held` the physical
// bytes the process holds (torch, aimdo's pages and cast buffers, and the driver's rounding).
DynamicOom account_oom(const Scenario& s, const Op& op, const LiveTensors& live, const sim::AllocStats& torch, Bytes free, Bytes held,
                       const sim::Aimdo& aimdo, const DynamicRuntime& rt, std::string what, Bytes request);

// The run's counters at its end (exec.h's DynamicReport), from aimdo and the runtime: the same on
// the simulated device and the real one.
void fill_dynamic_report(DynamicReport& d, const sim::Aimdo& aimdo, const DynamicRuntime& rt, std::uint64_t elapsed_us);

// Another process's allocation of `bytes` at `now_us` that found only `free` free.
OthersFailure others_failure(std::uint32_t op, std::uint64_t now_us, Bytes bytes, Bytes free, const sim::Aimdo& aimdo,
                             bool others_changed);

class DynamicRuntime {
 public:
  DynamicRuntime(const Scenario& s, const Program& p, sim::Aimdo& aimdo, TorchView& torch);

  // Whether a conditional op runs, given how its module's last fault went.
  bool runs(const Op& op) const;

  struct Result {
    bool ok = true;
    std::string failure;  // "cast buffer grow" or "VBAR fault" when !ok
    Bytes request = 0;    // what did not fit
    std::string detail;
    Bytes moved = 0;      // bytes copied to the device (the op's modelled time)
    sim::DeviceAddr dest = 0;   // where they go: the slice in the VBAR, or the cast buffer (0: a torch buffer)
    std::uint32_t stream = 0;   // the offload stream that copies them (0: the compute stream)
  };
  // Runs a vbar_* or node_end op.
  Result execute(const Op& op);

  // For the oracle's account of an OOM: the pinned bytes of module (m, i)'s pages, and the
  // cast-buffer bytes mapped for it while in flight (0 when its fault was not refused; what a
  // failed grow did not map is the request, not counted here).
  Bytes module_pinned(std::uint32_t m, std::uint32_t i) const;
  Bytes module_cast(std::uint32_t m, std::uint32_t i) const;

  std::uint64_t resident_hits() const { return hits_; }
  std::uint64_t copies() const { return copies_; }
  std::uint64_t refused() const { return refused_; }

 private:
  enum class Last : std::uint8_t { none, resident, copied, refused };
  struct ModuleState {
    Last last = Last::none;
    std::uint32_t serial_at = kNone;     // where its pages' serials from its last copy are in serials_
                                         // (its page count, from its first copy on)
    std::uint32_t cast_stream = 0;       // where a refused module went, and at what offset
    Bytes cast_offset = 0;
  };
  std::uint32_t vbar_of(std::uint32_t m);
  std::uint64_t first_page(std::uint32_t m, std::uint32_t i) const;
  std::uint64_t end_page(std::uint32_t m, std::uint32_t i) const;
  std::uint32_t next_offload_stream();
  Result fault(const Op& op);

  const Scenario& s_;
  const Program& p_;
  sim::Aimdo& aimdo_;
  TorchView& torch_;
  std::uint32_t ns_;
  std::vector<std::uint32_t> vbar_;                 // per model: aimdo's VBAR id (kNone: not yet)
  std::vector<std::vector<ModuleState>> modules_;   // [model][module]
  // The page serials of every module's last copy, each module's at its serial_at (one vector for
  // the run: a vector per module was a heap allocation per first fault).
  std::vector<std::uint32_t> serials_;
  // The current cast_modules_with_vbar call: its offload stream (0: none chosen yet) and offset.
  std::uint32_t call_stream_ = 0;
  Bytes call_offset_ = 0;
  // get_offload_stream's rotation and LARGEST_AIMDO_CASTED_WEIGHT.
  bool streams_made_ = false;
  std::uint32_t stream_counter_ = 0;
  std::uint32_t largest_model_ = kNone;
  std::uint32_t largest_module_ = kNone;
  Bytes largest_size_ = 0;
  std::uint64_t hits_ = 0;
  std::uint64_t copies_ = 0;
  std::uint64_t refused_ = 0;
};

}  // namespace vf

// Backends run a lowered program and measure it: `sim` (the CPU model of device + allocator)
// and `cuda` (a real GPU). A backend reports the allocator's peaks overall and per stage, an
// optional per-op trace, and the OOM event if one happened. It never throws for a case it could
// run: a fault of the backend itself is reported in `error` (the oracle's `error` verdict).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/core/bytes.h"
#include "harness/lower.h"
#include "harness/scenario.h"
#include "harness/sim/allocator.h"

namespace vf {

struct TraceRow {
  std::uint32_t op = 0;
  Bytes live = 0;         // requested bytes live (the program's own view)
  Bytes allocated = 0;    // allocator allocated (rounded blocks)
  Bytes reserved = 0;     // allocator reserved (segments / pool / pages)
  Bytes device_used = 0;  // others + context + what the process holds
  // Dynamic VRAM: aimdo's VBAR pages and cast buffers (not in the torch allocator's figures),
  // and the modelled time when the op ended.
  Bytes vbar = 0;
  Bytes cast = 0;
  std::uint64_t time_us = 0;
  // Of reserved - allocated, what the op's stream could not reuse: other streams' frees
  // (Allocator::held_for_other_streams; 0 where the backend cannot see it).
  Bytes held = 0;
};

// Dynamic VRAM: the device at the failing request, after aimdo evicted what it could. The
// necessary bytes are what a runtime that keeps only what this op needs must still hold; the
// rest is slack by mechanism. docs/dynamic.md "The property".
struct DynamicOom {
  std::string what;              // "torch allocation", "cast buffer grow", "VBAR fault"
  Bytes request = 0;             // what failed to fit (a cast grow: the growth)
  Bytes total = 0;               // the card
  Bytes free = 0;                // what the driver had free at the failure
  Bytes context = 0;
  Bytes others = 0;              // other processes at that moment
  Bytes headroom = 0;            // aimdo's simple headroom + --vram-headroom, kept free by design
  Bytes needed_tensors = 0;      // torch tensors the op's model needs: activations, transients, its weights
  Bytes needed_pages = 0;        // VBAR pages of the module being computed (pinned)
  Bytes needed_cast = 0;         // the cast-buffer extent the module in flight uses
  // Slack, by mechanism.
  Bytes torch_cache = 0;         // torch reserved - allocated: cached blocks aimdo cannot evict
  Bytes rounding = 0;            // torch allocated - requested, and the driver's page rounding
  Bytes other_weights = 0;       // torch tensors of models not running now (legacy, force-loaded)
  Bytes cast_slack = 0;          // cast buffers beyond what the module in flight uses
  Bytes prefetch_pins = 0;       // pinned pages of modules not being computed (a prefetched block)
  Bytes resident_pages = 0;      // unpinned pages eviction did not reach (below a watermark limit)
  Bytes necessary() const { return context + others + headroom + needed_tensors + needed_pages + needed_cast + request; }
  bool avoidable() const { return necessary() <= total; }
  // The mechanism with the most slack ("torch-cache", "cast-buffer", "prefetch-pins",
  // "other-weights", "resident-pages", "rounding"; "none" when there is none).
  std::string_view mechanism() const;
};

// Dynamic VRAM: an other process's allocation that failed while the case ran.
struct OthersFailure {
  std::uint32_t op = 0;             // the op it happened before
  std::uint64_t at_us = 0;
  Bytes bytes = 0;                  // what it asked for
  Bytes free = 0;                   // what was free
  Bytes evictable = 0;              // unpinned VBAR pages aimdo held (it would give them back on a deficit)
  Bytes believed_free = 0;          // what aimdo's last poll and ledger made of free memory
  std::uint64_t since_poll_us = 0;  // the age of that poll
  bool others_changed = false;      // other processes' memory changed since that poll
};

struct DynamicReport {
  std::uint64_t elapsed_us = 0;     // modelled time of the whole case
  std::uint64_t faults = 0;         // vbar_fault ops
  std::uint64_t resident_hits = 0;  // faults that found the module's copy intact
  std::uint64_t copies = 0;         // faults that copied the module into new pages
  std::uint64_t refused = 0;        // faults refused: the module went through a cast buffer
  std::uint64_t pages_mapped = 0;
  std::uint64_t pages_evicted = 0;
  std::uint64_t polls = 0;
  std::uint64_t hook_retries = 0;   // driver allocations that failed once and succeeded after an eviction
  Bytes vbar_peak = 0;
  Bytes cast_peak = 0;
  Bytes ledger_peak = 0;
  std::optional<DynamicOom> oom;
  std::vector<OthersFailure> others_failures;
};

struct OomEvent {
  std::uint32_t op = 0;
  Bytes request = 0;
  Bytes device_free = 0;
  Bytes reserved = 0;
  Bytes allocated = 0;
  std::string detail;
  // Of reserved - allocated, what the failing request's stream could not reuse: other streams'
  // cached blocks and pending frees (sim::Allocator::held_for_other_streams; 0 where unknown).
  Bytes held = 0;
};

struct ExecOptions {
  bool record_trace = false;
};

// What the `cuda` backend measured on the real device besides the allocator's own figures
// (absent on sim). docs/cuda.md says what each figure is and how far to trust it.
struct DeviceReport {
  Bytes total = 0;               // the real device's memory (cudaMemGetInfo total)
  Bytes free_at_start = 0;       // free before the case's ballast was fitted
  Bytes ballast = 0;             // bytes held so that the case sees the emulated card
  Bytes free_before = 0;         // free when the first op ran (the case's baseline)
  Bytes free_after = 0;          // free after the last op, before cleanup
  Bytes free_after_cleanup = 0;  // free once everything was freed, synchronized and trimmed
  Bytes leaked = 0;              // baseline not back after cleanup by more than the tolerance
  Bytes sampled_used_peak = 0;   // max over the sampling thread's readings of baseline - free
  std::uint64_t samples = 0;     // how many readings the sampling thread took
  std::optional<Bytes> nvml_process_peak;  // NVML usedGpuMemory of this process, max of samples
  Bytes pool_reserved_high = 0;  // async: ReservedMemHigh at the end of the case
  Bytes pool_used_high = 0;      // async: UsedMemHigh at the end of the case
  std::uint64_t h2d_copies = 0;  // work issued: cudaMemcpyAsync H2D
  std::uint64_t memsets = 0;     // cudaMemsetAsync (--transfer skip)
  std::uint64_t launches = 0;    // kernels (upcast, dequant, touch)
  std::uint64_t fallback_touches = 0;  // conversions no kernel covers, replaced by a touch of the output
};

struct ExecResult {
  std::string backend;        // "sim" or "cuda"
  std::string environment;    // "sim" or "NVIDIA H200, driver …, CUDA …"
  std::uint32_t ops_executed = 0;
  std::vector<TraceRow> trace;  // one row per executed op when recorded
  Bytes live_peak = 0;
  Bytes allocated_peak = 0;
  Bytes reserved_peak = 0;
  std::uint32_t reserved_peak_op = 0;
  Bytes device_peak = 0;
  std::vector<Bytes> stage_reserved_peak;        // per stage: reserved after each of its ops (transitions aside)
  std::vector<std::uint32_t> stage_reserved_peak_op;
  std::vector<Bytes> stage_allocated_at_peak;    // per stage: allocated at that op (attribution: rounding, slack)
  std::vector<Bytes> stage_held_at_peak;         // per stage: of the slack there, what the op's stream could not reuse
  // Reserved when the stage's own ops begin (after its transitions): what earlier stages left
  // cached. A stage whose peak is no higher was over budget before it allocated anything.
  std::vector<Bytes> stage_entry_reserved;
  std::optional<OomEvent> oom;
  std::optional<std::string> error;
  // The backend can run no more cases in this process (a sticky CUDA error): the campaign stops.
  bool fatal = false;
  // Not failures of the case, but worth saying (device memory that did not come back, a
  // fallback); the campaign logs and counts them.
  std::vector<std::string> warnings;
  std::optional<DeviceReport> device;
  std::optional<DynamicReport> dynamic;  // dynamic VRAM presets
  sim::AllocStats final_stats;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual ExecResult execute(const Scenario& s, const Program& p, const ExecOptions& opt) = 0;
};

// How a backend is set up (the cuda backend; sim ignores `transfer`).
struct BackendOptions {
  std::string transfer = "copy";  // cuda: "copy" (H2D from pinned memory) or "skip" (cudaMemsetAsync)
  bool isolate = false;           // run each case in a child process (harness/cuda/isolate.h)
};

// "sim" always works; "cuda" throws InfraError with a one-line reason when there is no usable GPU
// or the build has no CUDA. "auto" picks cuda when it is usable, else sim. "fake[:spec]" (hidden,
// for tests) is the cuda backend on the simulator-backed fake runtime (harness/cuda/runtime_fake.h).
// Defined in backends.cpp, library vf_backends.
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options = {});
// The backend "auto" would pick, without creating it ("cuda" or "sim").
std::string best_backend();

// The CPU simulation of the device and allocator.
class SimBackend final : public Backend {
 public:
  std::string_view name() const override { return "sim"; }
  ExecResult execute(const Scenario& s, const Program& p, const ExecOptions& opt) override;
};

// The origin discussion's DEBUG-line style: one line per allocation with reserved and its delta,
// allocated, and the module's bytes.
std::string format_trace(const Scenario& s, const Program& p, const ExecResult& r, std::uint32_t first = 0,
                         std::uint32_t last = 0xffffffffu);

}  // namespace vf

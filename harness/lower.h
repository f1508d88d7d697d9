// Lowering: the plan becomes the ordered ops a runtime really performs. Resident weights are
// allocated and copied at load (LoRA patch transients where LoRA is on); at forward time, in
// forward order, resident weights whose storage dtype differs from the compute dtype get an
// upcast/dequant transient, and offloaded weights get a transfer buffer on offload stream
// i mod N (issued up to N modules ahead, as a CPU running ahead of the GPU does), a cross-stream
// wait, the upcast/dequant transient, the compute, and frees on the right streams. A raw module
// (no cast hook) the plan leaves in host memory is neither moved nor transferred. Rules and
// their sources: docs/lowering.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/core/bytes.h"
#include "harness/predict.h"
#include "harness/scenario.h"

namespace vf {

enum class OpKind : std::uint8_t {
  alloc,           // buffer allocated on `stream`
  free,            // buffer freed (ordered on the stream it was allocated on)
  h2d,             // host-to-device copy into `buffer` on `stream`
  upcast,          // float conversion: `src` (storage dtype) -> `buffer` (compute dtype)
  dequant,         // GGUF / int8 block dequantization: `src` -> `buffer`
  compute,         // the module's kernels on the compute stream, writing the activation buffer
  wait,            // `stream` waits for the work issued so far on `target`
  sync,            // device synchronize
  empty_cache,     // torch.cuda.empty_cache()
  flush_if_cached, // ComfyUI's rule: empty the cache if cached-unused > 25% of free (§1 of the reference)
  // Dynamic VRAM (docs/dynamic.md): ops on comfy-aimdo, whose outcome the backend decides.
  vbar_prioritize, // ModelPatcherDynamic.load: the model's VBAR (made on first use) to the top of the priority list
  vbar_fault,      // cast_bias_weight: fault the module's slice; copy it in when its pages are new; when the
                   // fault is refused, copy it through the offload stream's cast buffer instead
  vbar_unpin,      // uncast_bias_weight (or the prefetch queue's pop): the slice's pages may be evicted again
  vbar_free,       // partially_unload for a legacy load: evict until `amount` bytes are free (free_memory)
  node_end,        // execution.py after each node: cast buffers destroyed, watermark limits reset, soft_empty_cache
};
std::string_view op_kind_name(OpKind k);
// Kinds with no effect on the modelled device's memory: copies, conversions and kernels between
// buffers that the program allocates and frees with ops of their own.
constexpr bool memory_neutral(OpKind k) {
  return k == OpKind::h2d || k == OpKind::upcast || k == OpKind::dequant || k == OpKind::compute;
}

enum class Phase : std::uint8_t { load, patch, forward, evict, unload };
std::string_view phase_name(Phase p);

enum class BufferKind : std::uint8_t { weight, transfer, convert, scaled, lora, activation };
std::string_view buffer_kind_name(BufferKind k);

inline constexpr std::uint32_t kNone = 0xffffffffu;

// Ops that depend on how a module's last vbar_fault went (the backend decides at run time).
enum class When : std::uint8_t {
  always,
  not_resident,  // the fault found the module's copy gone (pages new, or refused): LoRA is applied again
  refused,       // the fault was refused: the weight comes through a torch buffer (no aimdo cast buffer)
};

// vbar_fault flags.
inline constexpr std::uint8_t kFaultGroupStart = 1;  // the first module of one cast_modules_with_vbar call
inline constexpr std::uint8_t kFaultSingle = 2;      // that call has this one module (the LARGEST rule applies)
// vbar_free flags: evict from the dynamic models until amounts[src] bytes are free (a legacy
// load's free_memory); without it, free amounts[src] bytes of model `model`'s VBAR.
inline constexpr std::uint8_t kVbarFreeToTarget = 1;

struct Buffer {
  Bytes bytes = 0;
  std::uint8_t stream = 0;
  BufferKind kind = BufferKind::weight;
  std::uint16_t model = 0;
  std::uint32_t module = kNone;  // kNone for activations
  std::uint32_t tensor = kNone;
  bool operator==(const Buffer&) const = default;
};

struct Op {
  OpKind kind = OpKind::sync;
  Phase phase = Phase::load;
  std::uint8_t stream = 0;
  std::uint8_t target = 0;       // wait: the stream waited on
  std::uint16_t stage = 0;
  std::uint32_t buffer = kNone;  // alloc/free/h2d/upcast/dequant destination; compute: activation
  std::uint32_t src = kNone;     // upcast/dequant source buffer (kNone: a VBAR slice or cast buffer);
                                 // vbar_free: index into Program::amounts
  std::uint32_t module = kNone;  // compute and vbar ops: the module (with `model`)
  std::uint16_t model = 0;
  When when = When::always;      // conditional ops (dynamic VRAM)
  std::uint8_t flags = 0;        // vbar_fault: kFaultGroupStart, kFaultSingle; vbar_free: kVbarFreeToTarget
  bool operator==(const Op&) const = default;
};

// Where a dynamic model's modules live in its VBAR (ModelPatcherDynamic's staging).
struct VbarLayout {
  bool dynamic = false;
  Bytes request = 0;               // the virtual size asked for (10 x the model)
  std::vector<Bytes> offset;       // per module: its slice's offset
  std::vector<Bytes> size;         // per module: its slice's size (0: not staged)
};

// A large program's op and buffer storage is recycled (core/recycle.h): its destructor keeps the
// emptied vectors for the next `lower` on the same thread.
struct Program {
  Program() = default;
  Program(const Program&) = default;
  Program(Program&&) noexcept = default;
  Program& operator=(const Program&) = default;
  Program& operator=(Program&&) noexcept = default;
  ~Program();

  std::vector<Op> ops;
  std::vector<Buffer> buffers;
  std::uint32_t streams = 1;  // compute stream + offload streams
  std::vector<std::uint32_t> stage_begin;  // first op of each stage; ops of stage i are [begin[i], begin[i+1])
  bool dynamic = false;                    // the scenario runs under a dynamic VRAM preset
  std::vector<VbarLayout> vbars;           // per model (dynamic programs)
  std::vector<Bytes> amounts;              // vbar_free targets
  // Per stage: the rows (tokens x batch) each module's matmuls run over in one forward pass,
  // for the modelled compute time.
  std::vector<std::uint64_t> stage_rows;
  std::uint32_t stage_end(std::size_t stage) const {
    return stage + 1 < stage_begin.size() ? stage_begin[stage + 1] : static_cast<std::uint32_t>(ops.size());
  }
};

// Classic presets lower as below; dynamic presets lower the dynamic forward path (lower_dynamic.cpp,
// docs/dynamic.md) and their legacy models as below.
struct LowerOptions {
  // A forward's passes (sampling steps x cond batches) emit the same ops on buffers of their own:
  // the first pass is lowered and copied for the others, its buffers renumbered, where nothing
  // the lowering keeps between passes differs (dynamic VRAM's torch cast buffers rotate over the
  // offload streams pass after pass). Off: every pass lowered on its own, the reference the
  // copies are tested against (tests/test_lower.cpp). The program is the same either way.
  bool repeat_passes = true;
  // The classic load walk visits a model's modules in the walk's order, scattered over the model
  // (equal sizes recur a block apart). Where it lists this many modules or more, and this thread
  // lowered the same model and walk before, it reads their tensors from a copy gathered in walk
  // order (kept on the thread) rather than from the model's tables, which outgrow the cache. 0:
  // at any size; SIZE_MAX: never, the reference the gathered walk is tested against. The program
  // is the same.
  std::size_t gather_walk_min = std::size_t{1} << 16;
};
Program lower(const Scenario& s, const Plan& plan, const LowerOptions& options = {});

// Ops that hand memory over from the previous stage to this one (evictions, the cache flush):
// what is reserved while they run is the previous stage's state, so a stage's measured peak is
// taken over its other ops.
inline bool is_transition(const Op& op) { return op.phase == Phase::evict || op.kind == OpKind::flush_if_cached; }
// The bytes an op asks the allocator for: its buffer's for an alloc, 0 (no request) otherwise.
inline Bytes op_request(const Program& p, const Op& op) { return op.kind == OpKind::alloc ? p.buffers[op.buffer].bytes : 0; }

// The exact live (requested) bytes of the program: the peak overall and per stage, and the op
// where each was first reached.
struct LivePeaks {
  Bytes peak = 0;
  std::uint32_t peak_op = 0;
  std::vector<Bytes> stage_peak;
  std::vector<std::uint32_t> stage_peak_op;
};
LivePeaks live_peaks(const Program& p);

// "model te: layers.3.mlp.gate_proj.weight" style names for traces and reports.
std::string describe_buffer(const Scenario& s, const Program& p, std::uint32_t buffer);
std::string describe_op(const Scenario& s, const Program& p, std::uint32_t op);

// Invariants every lowered program must satisfy (used by tests and properties); returns an empty
// string or the first broken rule.
std::string check_program(const Program& p);

}  // namespace vf

// A scenario is one case: device, allocator config, policy, models, workload, offload streams
// and the pipeline of stages. It is plain data: load/save is JSON (`vramfuzz.scenario/1`,
// docs/formats.md), validation happens at load with the path of the offending field.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/activation_source.h"
#include "harness/core/bytes.h"
#include "harness/core/callable_ref.h"
#include "harness/core/dtype.h"
#include "harness/core/workload.h"
#include "models/catalog.h"
#include "models/model.h"

namespace vf {

class JsonIn;

inline constexpr std::string_view kScenarioSchema = "vramfuzz.scenario/1";

// The context a fresh CUDA process costs before the first tensor: 554,500,096 B (528.81 MiB).
// Measured on an NVIDIA H200 (driver 580.159.04, CUDA 13.0, idle: NVML listed no other process):
// reports/gpu/h200-2026-12-04.json, sections.calibration.context.context_overhead (total - free
// after cudaFree(0), a stream, a tensor, a scratch buffer and a warm-up of every kind of device
// work, less the simulator's charge for the two buffers). It is a bare CUDA process on that card:
// a PyTorch process also loads its kernels and cuBLAS workspaces, and a consumer card's driver
// reservation differs (pytorch PR #86509 measured 287,047,680 B in a PyTorch process on another
// card); a scenario's device.context_overhead sets the real figure of the card under test.
inline constexpr Bytes kDefaultContextOverhead = 554500096;
// What a PyTorch process's context was measured to cost on a consumer card (pytorch PR #86509:
// total - free after one small tensor with lazy module loading, 287,047,680 B = 273.75 MiB).
// `from-log` assumes it for the card a ComfyUI log came from: that is a PyTorch process on the
// user's card, not vramfuzz's own bare process on an H200.
inline constexpr Bytes kPyTorchContextOverhead = 287047680;

// The largest device total a scenario or a flag may give: every later sum stays far from 2^64,
// and any real device fits.
inline constexpr Bytes kMaxDeviceBytes = Bytes{1} << 50;  // 1 PiB
// A device total given as text (`--vram 24GiB`, `--device`): parse_size, then > 0 and <= 1 PiB,
// the same limits as the scenario's device.total. InputError(what, ...) otherwise.
Bytes parse_device_total(std::string_view text, std::string_view what);

// Another process (a second app, a game, the desktop) that takes or gives back device memory
// while a case runs: at `at_us` microseconds of modelled time (docs/dynamic.md, "Time").
struct OthersEvent {
  std::uint64_t at_us = 0;
  Bytes bytes = 0;
  bool take = true;  // true: it allocates `bytes`; false: it frees `bytes` it held
};

// The modelled durations that give every op a place in time: copies to the device at
// `h2d_gbps` (decimal GB/s: PCIe 4.0 x16 with pinned memory moves about 25), compute at
// `tflops` (FLOP/s x 1e-12 a module's matmuls run at). Only dynamic VRAM's 2 s poll and
// other processes' events depend on them; docs/dynamic.md.
inline constexpr double kDefaultH2dGBps = 25.0;
inline constexpr double kDefaultTflops = 100.0;

struct DeviceSpec {
  std::string name = "sim";
  Bytes total = 24 * GiB;
  Bytes used_by_others = 0;                     // other processes, the desktop (at time 0)
  Bytes context_overhead = kDefaultContextOverhead;
  std::vector<OthersEvent> events;              // other processes later, in time order
  double h2d_gbps = kDefaultH2dGBps;
  double tflops = kDefaultTflops;
  // What our process can use at all: total - others - context (0 if they exceed the total).
  Bytes available() const { return sat_sub(sat_sub(total, used_by_others), context_overhead); }
};

enum class AllocatorMode : std::uint8_t { raw, caching, caching_expandable, async };
std::string_view allocator_mode_name(AllocatorMode m);
// The four names, and PyTorch's own backend names (PYTORCH_CUDA_ALLOC_CONF=backend:native |
// backend:cudaMallocAsync): `native` is caching, `cudaMallocAsync` is async. Case-sensitive.
std::optional<AllocatorMode> parse_allocator_mode(std::string_view s);
// What parse_allocator_mode accepts, for error messages: "raw, caching, caching-expandable or
// async (or PyTorch's backend names: native = caching, cudaMallocAsync = async)".
std::string allocator_mode_choices();
// parse_allocator_mode, or InputError(path, "unknown allocator mode ... (use <choices>)").
AllocatorMode parse_allocator_mode_field(std::string_view s, std::string_view path);
inline constexpr AllocatorMode kAllAllocatorModes[] = {AllocatorMode::raw, AllocatorMode::caching,
                                                       AllocatorMode::caching_expandable, AllocatorMode::async};

// Allocator options by the allocator's own names (max_split_size_mb, release_threshold, ...),
// kept as text so a scenario round-trips exactly; the allocator factory validates them.
struct AllocatorConfig {
  AllocatorMode mode = AllocatorMode::raw;
  std::vector<std::pair<std::string, std::string>> options;
};

// external: `exec:COMMAND`, a predictor process (harness/predictors/external.h); `preset` is the
// runtime its hello names, whose constants the overrides change.
enum class PredictorKind : std::uint8_t { comfy, exact, external };
// The dated ComfyUI states vramfuzz emulates: three of the classic accounting, two of dynamic
// VRAM (comfy-aimdo), the default since ComfyUI 0.16 (PR #12658, 2026-02-28). README "Presets" maps
// releases to them.
enum class Preset : std::uint8_t { oct2025, nov2025, dec2025, feb2026, sep2026 };
std::string_view preset_name(Preset p);
// Also "dynamic": the newest dynamic-VRAM preset.
std::optional<Preset> parse_preset(std::string_view s);
inline constexpr bool is_dynamic(Preset p) { return p == Preset::feb2026 || p == Preset::sep2026; }
inline constexpr Preset kAllPresets[] = {Preset::oct2025, Preset::nov2025, Preset::dec2025, Preset::feb2026, Preset::sep2026};

// How the offload buffer is budgeted (comfyui-accounting.md §2.4, §5).
enum class AccountMode : std::uint8_t {
  none,      // before ComfyUI PR #10733: no buffer at all
  largest,   // PR #10733: cost_i + NS x (largest module_mem in the model)
  lookahead  // PR #11096: cost_i + module_mem of the next NS modules in sorted order
};
std::string_view account_mode_name(AccountMode a);

// comfy-aimdo's constants and the behaviour that changed between its versions
// (reference/comfyui-dynamic-vram.md §2.5; the aimdo sources by tag). Structural constants
// (32 MiB VBAR pages, 16 MiB cast-buffer chunks, 16 GiB cast reservation, the 10x VBAR request)
// are named in harness/sim/aimdo.h; these are what a preset or an override sets.
struct DynamicConstants {
  // The simple term's headroom: aimdo's VRAM_HEADROOM, 256 MiB, or --reserve-vram where the
  // preset passes it to aimdo (set_simple_vram_headroom, aimdo 2026-06-15).
  Bytes simple_headroom = 256 * MiB;
  bool reserve_sets_headroom = true;
  // --vram-headroom: extra_vram_headroom, added to every deficit (aimdo 2026-06-15; 0 before).
  Bytes vram_headroom = 0;
  // budget_deficit's cuMemGetInfo poll runs at most once per this many ms; 0: a fresh reading on
  // every call (aimdo before 2026-02-24's throttle reached the fault path).
  std::uint32_t poll_ms = 2000;
  // The cudaMallocAsync hook's deficit check runs at most once per this many ms (aimdo 0.2.x:
  // 2000); 0: on every allocation.
  std::uint32_t async_check_ms = 0;
  // CUDA_MALLOC_HEADROOM: what the cuMemAlloc hook adds to the request before evicting.
  Bytes malloc_headroom = 128 * MiB;
  // The ledger of hooked allocations: false: 1 KiB floor, exact up to 1 MiB, whole 2 MiB pages
  // above (aimdo 2026-04-23); true: every allocation rounded up to 2 MiB pages (before).
  bool ledger_pages = false;
  // vbar_fault collects spikes first (vbars_free(budget_deficit(0))) and checks the whole
  // miss against a surplus before mapping (aimdo 2026-03-10, 2026-06-05); false: it evicts
  // only when a page fails.
  bool fault_surplus = true;
  // Pages count their pins (aimdo 2026-04-27); false: one pinned flag per page.
  bool pin_counts = true;
  // A module whose fault fails goes through the offload stream's aimdo VRAMBuffer (grown in
  // 16 MiB chunks, kept until the node ends); false: a plain torch allocation per module
  // (before aimdo's VRAMBuffer reached Python, 2026-02-27).
  bool aimdo_cast_buffers = true;
};

// Every constant of ComfyUI's classic accounting, with the value its preset gives it; each one
// can be overridden in the scenario (`policy.overrides`) or on the CLI (`--reserve 600MiB`).
struct ComfyConstants {
  Bytes reserve = 400 * MiB;           // EXTRA_RESERVED_VRAM (Linux)
  Bytes inference_floor = 819 * MiB + 205 * KiB;  // 0.8 GiB (the "0.8" of minimum_inference_memory)
  double min_weight_ratio = 0.0;       // MIN_WEIGHT_MEMORY_RATIO on NVIDIA
  Bytes weight_floor = 0;              // Oct-2025: 128 MiB; later 0
  double unload_factor = 1.1;          // evict until free >= 1.1 x need + extra_mem
  double cfg_mult = 2.0;               // the sampler's batch doubling for memory_required
  double cond_batch_safety = 1.5;      // conds batched while 1.5 x memory_required < free
  double lora_math_factor = 2.0;       // LOWVRAM_PATCH_ESTIMATE_MATH_FACTOR
  AccountMode account = AccountMode::lookahead;
  bool dequant_term = true;            // PR #11171: offload cost counts the upcast/dequant copy
  std::uint32_t num_streams = 2;       // NUM_STREAMS; the scenario's offload_streams wins when set
  bool flash_attention = true;         // flash / PyTorch / xformers attention in the estimate
  Dtype lora_patch_dtype = Dtype::fp16;  // dtype LoRA is merged in at load (Oct-2025: fp32)
  bool patch_sync = true;              // PR #11144: synchronize after patching each module
  DynamicConstants dynamic;            // dynamic presets only
};

// The constants of a dated preset (oct2025 = ComfyUI a125cd84; nov2025 = after #10733 and
// #10953; dec2025 = after #11096, #11171, #11173, #11144; feb2026 = ComfyUI 0.16 with
// comfy-aimdo 0.2.2; sep2026 = ComfyUI 0.31-0.38 with comfy-aimdo 0.4.10-0.5.5).
ComfyConstants preset_constants(Preset p);

struct Policy {
  PredictorKind predictor = PredictorKind::comfy;
  Preset preset = Preset::dec2025;  // exact: the placement it takes its resident set from
  ComfyConstants constants;         // preset values with overrides applied
  std::vector<std::pair<std::string, std::string>> overrides;  // as given, for round-tripping
  std::optional<Bytes> exact_reserve;  // exact predictor: reserve to add (default 0)
  // The `exact_reserve` override (exact predictor only): the reserve to add without moving the
  // placement (`reserve` moves both), bytes or `bound`: the allocator mode's overhead bound
  // for the lowered program (harness/overhead.h). Either wins over `reserve`.
  std::optional<Bytes> exact_reserve_only;
  bool exact_reserve_bound = false;
  // external: the name and version its hello gave (what a scenario records; never the command).
  std::string external_name;
  std::string external_version;
  std::string label() const;           // "comfy:dec2025", "exact:dec2025", "exec:NAME"
  // Dynamic VRAM: a dynamic preset, run by ComfyUI's planner or by an external one for that runtime.
  bool dynamic() const { return predictor != PredictorKind::exact && is_dynamic(preset); }
  // The predictor this policy is, as one string: the label, then every constant whose value
  // differs from the preset's as sorted `key=value` pairs in canonical form (sizes as GiB / MiB /
  // KiB / bytes, whichever is exact; numbers in their shortest form; booleans true/false), e.g.
  // "comfy:dec2025 dequant_term=false". An override that restates the preset's value is no
  // override. The reserve is left out: it decides how often an accounting gap shows, not which
  // gap it is (campaigns without --policy draw it per case, and a corpus repro made with one
  // reserve covers the same bug under another). Findings are known (in a regression corpus) only
  // under the same key.
  std::string key() const;
};

// Parses "comfy:dec2025", "comfy", "exact", "exact:oct2025", and "exec:COMMAND" (which starts
// COMMAND, or finds it started, and takes the runtime its hello names; "exec:NAME" finds one
// started under that name). Throws InputError(what).
// Text read from a file (a run.json, a summary) is parsed with StartCommand::refuse: exec:NAME
// must name a predictor a flag of this process already started, and nothing is ever started
// from it, so a file can never run a command.
enum class StartCommand { allow, refuse };
Policy parse_policy(std::string_view text, std::string_view what, StartCommand start = StartCommand::allow);
// Applies one override (`reserve=600MiB`, `account=lookahead`, `dequant_term=false` ...).
// Under an external predictor whose hello lists `supports.overrides`, an override it does not
// honour is refused (InputError: exit 2) when it comes from a flag or the generator; one read from
// a file is kept, and predicting that case is its error (the file may predate the predictor).
enum class OverrideFrom : std::uint8_t { flag, file };
void apply_policy_override(Policy& p, std::string_view key, std::string_view value, std::string_view what,
                           OverrideFrom from = OverrideFrom::flag);
// The override keys `p` accepts (a dynamic preset's own, the exact predictor's exact_reserve),
// in the order docs/formats.md lists them.
std::vector<std::string_view> policy_override_keys(const Policy& p);

struct ModelRef {
  std::string id;      // how stages name it ("te", "dit"); defaults to the catalog name
  std::string source;  // "catalog:NAME", "inline", or "file:<absolute path>" (resolved at load)
  StorageChoice storage;   // catalog models: how the file stores it
  bool storage_given = false;  // false: the catalog's native dtype
  Dtype compute = Dtype::bf16;  // ComfyUI's manual-cast dtype (the dtype kernels run in)
  bool lora = false;            // a LoRA patches every weight of this model
  // Dynamic presets: a model whose patcher is not ModelPatcherDynamic (custom nodes' patchers,
  // e.g. GGUF loaders) is loaded through the classic path next to the dynamic ones.
  bool legacy = false;
  // Dynamic presets: the model faults and transfers each block's weights together before the
  // block runs (comfy/model_prefetch.py; LTX-AV and MiniMax do, the catalog's models do not).
  bool prefetch = false;
  std::shared_ptr<const ModelSpec> spec;  // resolved, finalized
  // A catalog model with modules left out ("keep" / "drop" in the file, or the shrinker's): the
  // whole catalog model, whose modules `spec` keeps in order, each as the catalog has it. Null:
  // the whole model (or not a catalog model). `catalog_source` is its "catalog:NAME", kept while
  // the shrinker edits the spec (which is "inline" until it is a subset again).
  std::shared_ptr<const ModelSpec> catalog_full;
  std::string catalog_source;
};

// Whether two modules hold the same tensors (name, shape, dtype, role, in order) and cast hook:
// what a "repeat" run, a catalog subset and the shrinker's pads compare.
bool same_contents(const Module& a, const Module& b);

// Whether `sub`'s modules are modules of `full`, in its order, each with the same tensors and cast
// hook: a catalog model with modules left out, writable as "keep" / "drop".
bool is_module_subset(const ModelSpec& sub, const ModelSpec& full);

enum class StageOp : std::uint8_t { load, forward, unload };
std::string_view stage_op_name(StageOp s);

struct Stage {
  StageOp op = StageOp::load;
  std::uint32_t model = 0;  // index into Scenario::models
};

// The ComfyUI console log a scenario was reconstructed from (`vramfuzz from-log`,
// harness/from_log.h). `run` compares the plan with the log's plan lines and the run's OOM with
// the log's; a shrunk repro keeps only where it came from (file, digest, the OOM's line and text):
// its plan is no longer the log's.
struct LogPlanExpect {
  std::uint32_t line = 0;   // the log line of the plan line
  std::uint32_t stage = 0;  // the load stage it belongs to
  std::string text;         // "loaded partially; 10795.05 MB usable, ..." as the log has it
};
struct LogOomExpect {
  std::uint32_t line = 0;
  std::optional<std::uint32_t> stage;  // the stage the traceback puts it in (unset: unknown)
  std::string activity;                // "weight-cast", "load", "compute" or "" (unknown)
  std::string text;                    // PyTorch's message
};
struct FromLog {
  std::string file;            // the log's file name as given to from-log ("-": stdin)
  std::uint64_t digest = 0;    // FNV-1a 64 of its bytes
  std::vector<LogPlanExpect> plans;
  std::optional<LogOomExpect> oom;
  // PyTorch's memory summary after the OOM: the reserved and allocated peaks (whole units).
  std::uint32_t summary_line = 0;
  std::optional<Bytes> summary_reserved_peak, summary_allocated_peak;
  // Where it came from, without what only the reconstructed case can be compared with.
  FromLog origin_only() const {
    FromLog o;
    o.file = file;
    o.digest = digest;
    o.oom = oom;
    if (o.oom) o.oom->stage.reset();
    return o;
  }
};

struct Scenario {
  std::string name;  // optional label
  DeviceSpec device;
  AllocatorConfig allocator;
  Policy policy;
  std::vector<ModelRef> models;
  Workload workload;
  // Class G, the resolution knee: the larger workload this case is the smaller of (each of width,
  // height, batch and frames >= the workload's, one larger, everything else equal). When set, a
  // violation or OOM of this case is re-run at knee_of, and becomes a `knee` finding where that
  // one passes (harness/campaign.h run_case; docs/attribution.md).
  std::optional<Workload> knee_of;
  std::optional<std::uint32_t> offload_streams;  // 0..8; unset: the preset's NUM_STREAMS
  std::vector<Stage> stages;
  ActivationSpec activations;  // what sizes each forward's activations (harness/activation_source.h)
  std::uint64_t seed = 0;  // seeds allocator-side nondeterminism (async opportunistic reuse)
  std::optional<FromLog> from_log;  // the ComfyUI log it was reconstructed from

  // NUM_STREAMS as the runtime uses it (scenario value, else the policy's).
  std::uint32_t streams() const { return offload_streams ? *offload_streams : policy.constants.num_streams; }
  // Whether model `m` runs through ModelPatcherDynamic (a dynamic preset, and not legacy).
  bool dynamic_model(std::size_t m) const { return policy.dynamic() && !models[m].legacy; }
};

inline constexpr std::uint32_t kMaxOffloadStreams = 8;
// A scenario's limits, checked when it is read (and by whoever builds one from other input:
// `from-log`'s flags and reconstruction).
inline constexpr std::uint32_t kMinImageSide = 16;  // one 2x2 patch of an 8x-downsampled latent
inline constexpr std::uint32_t kMaxImageSide = 16384;
inline constexpr std::uint32_t kMaxBatch = 64;
inline constexpr std::uint32_t kMaxFrames = 1024;
inline constexpr std::uint32_t kMaxSteps = 1000;
inline constexpr std::size_t kMaxModels = 64;
inline constexpr std::size_t kMaxStages = 4096;

// JSON in / out. `load_scenario_*` validate everything and throw InputError with the field path.
Scenario load_scenario_file(const std::string& path, Catalog& catalog);
Scenario parse_scenario_json(std::string_view text, Catalog& catalog, std::string_view origin);
// From an already parsed document; `path` prefixes field paths ("scenario" inside a repro file);
// `base_dir` is where a relative "file:PATH" model source is found (parse_scenario_json uses the
// directory of `origin`, the load functions that of the file).
Scenario scenario_from_json(const nlohmann::json& doc, Catalog& catalog, const std::string& path,
                            const std::string& base_dir = "");
// The same from a value of a parsed document (parse_json_doc): its path prefixes field paths.
Scenario read_scenario(const JsonIn& j, Catalog& catalog, const std::string& base_dir = "");
// One entry of a scenario's "models" list read on its own: the inline model `models import --out`
// writes, or a catalog or file model. `path` prefixes field paths ("" for a file of its own).
ModelRef model_from_json(const nlohmann::json& doc, Catalog& catalog, const std::string& path, const std::string& base_dir = "");
// A scenario file, or a finding / repro file that embeds one under "scenario".
Scenario load_case_file(const std::string& path, Catalog& catalog);
// The same from text (`origin` names it in errors; its directory is where "file:" sources are found).
Scenario parse_case_json(std::string_view text, Catalog& catalog, std::string_view origin);
std::string scenario_to_json(const Scenario& s, int indent = 2);
// The predictor protocol's spec references (harness/predictors/protocol.h, SpecStore): while a
// SpecRefScope lives on this thread, an inline model may carry "spec_ref": N. With its spec
// (modules ...) it defines N in `specs`; without, it is the spec N defined. Outside one, a
// spec_ref is an error: a scenario file is always self-contained.
class SpecRefScope {
 public:
  explicit SpecRefScope(std::unordered_map<std::uint64_t, std::shared_ptr<const ModelSpec>>& specs);
  ~SpecRefScope();
  SpecRefScope(const SpecRefScope&) = delete;
  SpecRefScope& operator=(const SpecRefScope&) = delete;

 private:
  std::unordered_map<std::uint64_t, std::shared_ptr<const ModelSpec>>* saved_;
};
// The same document, before it is written (for writers that add to it).
nlohmann::ordered_json scenario_to_ordered_json(const Scenario& s);

// The compact text of scenario_to_ordered_json(s), byte for byte (scenario_to_json(s, -1)), with
// the models' modules (most of the text, and most of the cost of building a document) written
// straight into the string. `model(out, i)` appends model i's object; the first form writes each
// with append_model_json.
std::string scenario_json_compact(const Scenario& s);
std::string scenario_json_compact(const Scenario& s, CallableRef<void(std::string&, std::size_t)> model);
// How the predictor protocol writes a model (protocol.h, SpecRefs): `spec_ref` appended as the
// last key; `spec_held`: the predictor holds the spec, so an inline model's kind, family,
// memory_usage_factor, arch and modules are left out.
struct ModelTextOptions {
  std::optional<std::uint64_t> spec_ref;
  bool spec_held = false;
};
// Appends one model's compact JSON: what scenario_to_ordered_json writes for it, byte for byte,
// with `o` applied.
void append_model_json(std::string& out, const ModelRef& m, const ModelTextOptions& o = {});

// A structural fingerprint of everything scenario_to_json writes, computed without writing it
// (the shrinker keys its candidate cache with it): scenarios whose canonical JSON differs have
// different fingerprints (up to a 2^-128 collision), and a scenario's fingerprint does not change
// when it is copied. Whoever adds a field to scenario_to_json adds it here;
// tests/test_scenario.cpp checks the two against each other on generated and shrunk cases.
struct ScenarioFingerprint {
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  bool operator==(const ScenarioFingerprint&) const = default;
};
struct ScenarioFingerprintHash {
  std::size_t operator()(const ScenarioFingerprint& f) const { return static_cast<std::size_t>(f.a ^ (f.b * 0x9e3779b97f4a7c15ull)); }
};
// Remembers the fingerprints of inline model specs by identity (a spec is immutable once
// finalized, and candidates share the specs they do not change), so a candidate costs the specs
// it changed, not all of them. One per thread of use.
class FingerprintMemo {
 public:
  ScenarioFingerprint spec(const std::shared_ptr<const ModelSpec>& spec);

 private:
  struct Entry {
    std::weak_ptr<const ModelSpec> owner;  // the address names this spec only while it lives
    ScenarioFingerprint fp;
  };
  std::unordered_map<const ModelSpec*, Entry> by_spec_;
};
ScenarioFingerprint scenario_fingerprint(const Scenario& s, FingerprintMemo* memo = nullptr);

// Readers of a scenario's parts that other documents share (activation profiles): a dtype name,
// and a workload object with the scenario's limits.
Dtype parse_dtype_json(const JsonIn& j);
Workload parse_workload_json(const JsonIn& j);
// A size as a scenario writes it: "24GiB" / "512MiB" when exact, else the byte count.
nlohmann::json size_json(Bytes b);

// How many modules from `i` on form a run NAME.0, NAME.1, ... NAME.(k-1) with the same tensors
// and cast hook (k >= 3): what scenario_to_json writes as one entry with "repeat": k, and
// repro.md as one row. 1 when they do not.
std::size_t repeat_run(const std::vector<Module>& modules, std::size_t i);

// The dtype most of a model's weight bytes are stored in (catalog, inline and imported models
// alike; the compute dtype when it has no weight tensors).
Dtype dominant_storage(const ModelRef& m);
// How a model is stored, for people: a catalog model's storage dtype; for inline and imported
// models the dtype of most weight bytes, with its share and the others when they mix
// ("fp8_e4m3fn 97% + fp16").
std::string storage_label(const ModelRef& m);
// Re-checks the invariants load enforces (for scenarios built in code: generator, shrinker).
void validate_scenario(const Scenario& s);

// The default pipeline when a scenario lists none: load + forward of each model in order.
std::vector<Stage> default_stages(std::size_t model_count);

}  // namespace vf

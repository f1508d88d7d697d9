// P4: each allocator mode's overhead bound. B(mode, options, program) bounds, for every checked
// stage, the allocator's reserved peak minus the exact live peak of the lowered program (the
// `exact` predictor's number), so `exact` + B is a prediction no allocator model may exceed.
//
// The bound is computed by one walk over the program: at every op it keeps an upper estimate of
// what the mode can hold (live bytes plus the terms below, each argued from the allocator rules
// in docs/allocators.md, "Overhead bounds (P4)"), and B is the largest gap, over the checked
// stages, between that estimate and the stage's live peak. Reserved only grows at an alloc, so
// B also bounds the program's overall reserved peak minus its overall live peak.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "harness/core/bytes.h"
#include "harness/lower.h"
#include "harness/scenario.h"

namespace vf {

// What the estimate holds above the live (requested) bytes, by cause.
struct OverheadTerms {
  // Size rounding of each live block: 512 B (and roundup_power2_divisions), the 2 MiB pages of a
  // raw cudaMalloc, a large block's own segment rounded to 2 MiB (and its unsplit slack).
  Bytes rounding = 0;
  // Shared segments or pages partly used: raw small buffers' 2 MiB pages, the caching small
  // pool's 2 MiB segments and its 20 MiB large-buffer segments for 1-10 MiB requests.
  Bytes packing = 0;
  // Memory held for a size class above what it has live now: freed blocks cached on the stream
  // that freed them (no other stream can use them), one per size up to the most ever live at once.
  Bytes cached = 0;
  // Segments (or free space) of a size class taken by smaller blocks of later allocations, which
  // makes the class need new ones: the split segments that cannot be given back.
  Bytes stolen = 0;
  // Growth granularity: expandable segments' pages and the async pool's chunks, one partly used
  // page or chunk per arena (per piece kept around live blocks after empty_cache).
  Bytes growth = 0;
  Bytes total() const { return rounding + packing + cached + stolen + growth; }
};

struct OverheadBreakdown {
  AllocatorMode mode = AllocatorMode::raw;
  Bytes bound = 0;            // B: the largest (estimate - stage live peak) over checked stages
  std::uint32_t stage = 0;    // the stage that needs all of B
  std::uint32_t op = 0;       // the op of that stage where the estimate peaks
  Bytes live = 0;             // live bytes after `op`
  Bytes stage_live_peak = 0;  // the exact predictor's peak for that stage
  Bytes estimate = 0;         // the upper estimate of reserved after `op` = live + terms.total()
  OverheadTerms terms;        // at `op`
  // Caching modes: the most their per_process_memory_fraction check can see, i.e. the estimate
  // before an allocation plus the native segment size that allocation would ask for (the check
  // compares reserved + that size with fraction x total, also in expandable mode). 0 otherwise.
  Bytes limit_need = 0;
  std::string summary() const;  // one line: "B 12.50 MiB (stage 1 op 42): rounding ..., packing ..."
};

// The bound and where it comes from. Pure function of the scenario's allocator config and the
// program; throws InputError only for allocator options the allocator factory would refuse.
OverheadBreakdown overhead_breakdown(const Scenario& s, const Program& p);
Bytes overhead_bound(const Scenario& s, const Program& p);

// The limit an allocator option sets on the process (per_process_memory_fraction < 1): fraction x
// device total, compared with reserved + the segment a miss asks for (caching modes) or with the
// requested bytes (async). nullopt without a fraction.
struct AllocatorLimit {
  Bytes bytes = 0;
  bool on_requested = false;  // async: PyTorch checks the sum of requested bytes
};
std::optional<AllocatorLimit> allocator_limit(const Scenario& s);

// Allocator option sets that reach every rule the bound has a term for (index 0: the defaults):
// max_split (oversize blocks never split nor reused below it), max_non_split_rounding, roundup
// divisions, large segment sizes (odd sizes charge whole pages; one at or above max_split), GC
// under a memory fraction; the async pool's granularity, trimming and reuse policies. The P4
// property and fuzz target 5 draw one per case (the generator draws none).
using AllocatorOptionSet = std::vector<std::pair<std::string, std::string>>;
std::span<const AllocatorOptionSet> bound_option_sets(AllocatorMode mode);

}  // namespace vf

// `aimdo`: comfy-aimdo, the layer dynamic VRAM puts between PyTorch's allocator and the device
// (reference/comfyui-dynamic-vram.md §2.5; read against the aimdo sources of each preset).
//
// What it is, as a model you can read in one sitting:
//   - a ledger of the device memory aimdo believes the process holds (`usage`): VBAR pages,
//     cast-buffer chunks, and every torch allocation its hooks saw;
//   - per model a VBAR: a virtual range of 32 MiB pages, mapped on demand by `fault`, each page
//     with a pin count and a serial (a new mapping gets a new serial, so a module can tell
//     whether its copy survived); a watermark (pages at or above it may not be faulted) and a
//     watermark limit (pages below it are never evicted);
//   - a priority list of VBARs: eviction walks it from the lowest priority up, stepping each
//     VBAR's watermark down from its top and freeing every unpinned resident page it passes;
//   - `budget_deficit(size)`: how much must be evicted before `size` more fits, the larger of a
//     simple term (ledger + size + headroom against the card's total) and a delta term (the
//     last cuMemGetInfo poll, at most one per 2 s, plus the ledger's growth since): other
//     processes and the CUDA context are visible to the delta term only, and only as of the
//     last poll;
//   - hooks on the driver's allocation calls: before PyTorch's cudaMalloc (native allocator
//     segments, or every tensor with caching off) it evicts the deficit of request + 128 MiB,
//     and after a failure request + 128 MiB, then retries once; before cudaMallocAsync (every
//     tensor of the async backend) the same without the 128 MiB; a torch OOM is the retry
//     failing;
//   - cast buffers: per offload stream a growable VMM buffer (16 MiB chunks, 16 GiB of address
//     space) that modules whose fault failed are copied through; it only grows until the node
//     ends.
// The physical pages come from a DeviceLayer (device_layer.h): the simulated device, or real
// cuMemCreate / cuMemMap on a GPU. Time comes from the caller's clock (microseconds).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/core/callable_ref.h"
#include "harness/core/bytes.h"
#include "harness/scenario.h"
#include "harness/sim/device_layer.h"

namespace vf::sim {

class Allocator;
class SimDevice;

// ---- Constants (aimdo's and ComfyUI's names) ----------------------------------------------------

// VBAR_PAGE_SIZE: a VBAR is mapped and evicted in 32 MiB pages.
inline constexpr Bytes kVbarPage = 32 * MiB;
// VRAM_HEADROOM: the delta term keeps this much of cuMemGetInfo's free memory, whatever
// --reserve-vram says (only the simple term takes the setting).
inline constexpr Bytes kAimdoPollHeadroom = 256 * MiB;
// VRAM_CHUNK_SIZE: a cast buffer (VRAMBuffer) grows in 16 MiB chunks (2 MiB on ROCm).
inline constexpr Bytes kCastChunk = 16 * MiB;
// DEFAULT_AIMDO_CAST_BUFFER_RESERVATION_SIZE: the address space of each cast buffer; a module
// larger than this cannot be cast through it (ComfyUI raises "VRAM grow failed").
inline constexpr Bytes kCastReservation = 16 * GiB;
// The ledger's rounding of a hooked torch allocation: at least 1 KiB, exact up to half a 2 MiB
// page, whole 2 MiB pages above (accounted_alloc_size).
inline constexpr Bytes kAccountFloor = 1 * KiB;
inline constexpr Bytes kAccountPage = 2 * MiB;
// ModelPatcherDynamic asks for a VBAR of 10 x the model's size (room for any cast of the
// weights); aimdo caps it at floor(total VRAM / 32 MiB) pages.
inline constexpr std::uint64_t kVbarRequestFactor = 10;
// ModelVBAR.alloc places each module's slice at a 512 B-aligned offset.
inline constexpr Bytes kSliceAlign = 512;
// comfy.memory_management.vram_aligned_size: each tensor of a slice takes a 1 KiB multiple.
inline constexpr Bytes kTensorAlign = 1024;

// The bytes the ledger books for a hooked allocation of `size` (`pages`: the 2 MiB rounding of
// aimdo before 2026-04-23).
Bytes aimdo_accounted(Bytes size, bool pages);

// The pages a VBAR asked to cover `request` bytes gets on a card of `capacity` bytes.
std::uint64_t vbar_pages_for(Bytes request, Bytes capacity);

enum class FaultResult : std::uint8_t {
  resident,  // every page was mapped already (the caller compares serials to know if its copy survived)
  mapped,    // some pages were newly mapped (their serials changed)
  refused,   // VBAR_FAULT_OOM: above the watermark or no budget; the caller casts through a buffer
  error,     // VBAR_FAULT_ERROR: a page could not be mapped even after an eviction (ComfyUI raises)
};
std::string_view fault_result_name(FaultResult r);

struct AimdoStats {
  std::uint64_t faults = 0;
  std::uint64_t faults_refused = 0;
  std::uint64_t faults_above_watermark = 0;  // refused at once: the slice lies above the watermark
  std::uint64_t pages_mapped = 0;
  std::uint64_t pages_evicted = 0;
  std::uint64_t polls = 0;
  std::uint64_t hook_calls = 0;
  std::uint64_t hook_retries = 0;  // a driver call failed and was retried after an eviction
  std::uint64_t cast_grows = 0;
  Bytes vbar_peak = 0;   // resident VBAR bytes, high-water
  Bytes cast_peak = 0;   // cast-buffer bytes, high-water
  Bytes ledger_peak = 0;
};

class Aimdo {
 public:
  // `capacity` is cuDeviceTotalMem (the card's total, not what is free). `now_us` is read at
  // every poll decision. `on_sync` runs at each cuCtxSynchronize aimdo issues (the backend
  // completes pending stream work there).
  Aimdo(Bytes capacity, const DynamicConstants& k, DeviceLayer& device, const std::uint64_t& now_us,
        std::function<void()> on_sync = {});

  // ---- VBARs (model_vbar.py / model-vbar.c) ----
  // A new VBAR at the top of the priority list; returns its id.
  std::uint32_t vbar_allocate(Bytes request);
  void prioritize(std::uint32_t v);    // to the top, watermark reset to every page
  void deprioritize(std::uint32_t v);  // to the bottom
  // Maps the pages of [offset, offset + size) and pins them (not on `refused` / `error`).
  // `new_pages` counts the pages this call mapped.
  FaultResult fault(std::uint32_t v, Bytes offset, Bytes size, std::uint32_t* new_pages = nullptr);
  void unpin(std::uint32_t v, Bytes offset, Bytes size);
  // vbar_free_memory: pages of this VBAR from its top down to its watermark limit; bytes freed.
  Bytes free_memory(std::uint32_t v, Bytes bytes);
  // The serial of page `page` of VBAR `v` (0: never mapped). A module's copy is intact while
  // the serials of its pages are what they were when it was copied.
  std::uint32_t serial(std::uint32_t v, std::uint64_t page) const { return vbars_[v].pages[page].serial; }
  bool mapped(std::uint32_t v, std::uint64_t page) const { return vbars_[v].pages[page].mapped; }
  std::uint32_t pins(std::uint32_t v, std::uint64_t page) const { return vbars_[v].pages[page].pins; }
  // The VBARs from the lowest priority to the highest.
  const std::vector<std::uint32_t>& priority() const { return priority_; }
  // Device addresses (the layer's): a VBAR's base, a cast buffer's base (0 when it has none).
  DeviceAddr vbar_base(std::uint32_t v) const { return vbars_[v].base; }
  DeviceAddr cast_base(std::uint32_t stream) const { return stream < cast_.size() && cast_[stream].live ? cast_[stream].base : 0; }
  // vbar_free of every VBAR and every cast buffer destroyed: all pages unmapped, ranges released.
  void release_all();
  std::uint64_t nr_pages(std::uint32_t v) const { return vbars_[v].pages.size(); }
  std::uint64_t watermark(std::uint32_t v) const { return vbars_[v].watermark; }
  Bytes loaded_size(std::uint32_t v) const { return vbars_[v].resident * kVbarPage; }
  // Resident bytes of every VBAR (vbars_analyze): what ModelPatcherDynamic counts as free.
  Bytes vbar_resident() const { return resident_pages_ * kVbarPage; }
  // Resident pages with a pin / without, over every VBAR.
  Bytes pinned_bytes() const;

  // ---- the eviction primitives ----
  // vbars_free: evicts ceil(bytes / 32 MiB) pages, lowest priority first; returns the pages it
  // could not find (bytes <= 0: nothing).
  std::uint64_t vbars_free(std::int64_t bytes);
  std::int64_t budget_deficit(Bytes size);

  // ---- hooks ----
  // The cuMemAlloc_v2 hook around `real` (one driver allocation of `size` bytes): evict, try,
  // evict more, retry once. True when `real` succeeded; the ledger books it.
  bool hook_cuda_malloc(Bytes size, CallableRef<bool()> real);
  // The cudaMallocAsync hook: the same without the 128 MiB, and (aimdo 0.2.x) the deficit
  // checked at most once per async_check_ms. Inline, `real` called directly: it wraps every
  // async malloc of a dynamic run.
  template <class Real>
  bool hook_malloc_async(Bytes size, Real&& real) {
    ++stats_.hook_calls;
    const std::uint64_t every = std::uint64_t{k_.async_check_ms} * 1000;
    if (every == 0 || !async_checked_ || now_us_ - last_async_check_us_ >= every) async_check(size);
    if (!real() && !evict_and_retry(size, CallableRef<bool()>(real))) return false;
    book(aimdo_accounted(size, k_.ledger_pages));
    return true;
  }
  // A hooked allocation of `size` was freed.
  void hook_free(Bytes size);

  // ---- cast buffers (vram_buffer.py / vrambuf.c) ----
  // Makes the cast buffer of `stream` at least `required` bytes; false when the grow failed
  // (ComfyUI raises "VRAM grow failed": an OOM of the forward).
  bool cast_grow(std::uint32_t stream, Bytes required);
  Bytes cast_size(std::uint32_t stream) const;
  Bytes cast_bytes() const { return cast_total_; }
  // reset_cast_buffers at the end of a node: every buffer destroyed, its chunks unmapped.
  void cast_reset();
  // vbars_reset_watermark_limits.
  void reset_watermark_limits();

  Bytes ledger() const { return usage_; }
  Bytes capacity() const { return capacity_; }
  const AimdoStats& stats() const { return stats_; }
  const DynamicConstants& constants() const { return k_; }
  // Whether the last budget_deficit read a fresh poll, and the free memory that poll saw.
  std::uint64_t last_poll_us() const { return last_poll_us_; }
  Bytes last_poll_free() const { return last_poll_free_; }
  // What the last poll and the ledger's growth since make of free memory now (the delta term's view).
  Bytes believed_free() const { return sat_sub(last_poll_free_ + usage_at_poll_, usage_); }

 private:
  struct Page {
    bool mapped = false;
    std::uint32_t pins = 0;
    std::uint32_t serial = 0;
  };
  struct Vbar {
    DeviceAddr base = 0;
    std::uint64_t watermark = 0;
    std::uint64_t watermark_limit = 0;
    std::uint64_t resident = 0;
    std::vector<Page> pages;
    // Bit p % 64 of word p / 64: pages[p].mapped. The miss check's cursor finds the next absent
    // page a word of 64 pages at a time (a page at a time was a fifth of a dynamic fault).
    std::vector<std::uint64_t> mapped_bits;
    // Every page below it is mapped (a lower bound on the first absent page): the miss check's
    // first cursor starts there instead of rescanning the resident prefix on every fault.
    mutable std::uint64_t mapped_below = 0;
  };
  struct CastBuffer {
    DeviceAddr base = 0;
    Bytes allocated = 0;
    bool live = false;
  };

  void poll_if_due();
  void sync();
  bool map_page(Vbar& mv, std::uint64_t page);
  // mod1: frees page `p` of `mv` when mapped and (`unpin` or) unpinned; true when freed.
  bool release_page(Vbar& mv, std::uint64_t p);
  void free_for_vbar(std::uint32_t v, std::uint64_t target, std::int64_t surplus);
  void free_for_vbar_v022(std::uint32_t v, std::uint64_t target);
  std::uint64_t absent_from(const Vbar& mv, std::uint64_t cursor) const;
  std::uint64_t spend_surplus(const Vbar& mv, std::uint64_t target, std::uint64_t cursor, std::int64_t& surplus) const;
  void book(Bytes b);
  void unbook(Bytes b);
  // hook_malloc_async's two rare paths: the deficit check when one is due, and the eviction and
  // retry after a failed try (true when the retry succeeded).
  void async_check(Bytes size);
  bool evict_and_retry(Bytes size, CallableRef<bool()> real);
  void note_peaks();

  Bytes capacity_;
  DynamicConstants k_;
  DeviceLayer& device_;
  const std::uint64_t& now_us_;
  std::function<void()> on_sync_;
  Bytes usage_ = 0;
  Bytes usage_at_poll_ = 0;
  std::int64_t deficit_sync_ = 0;
  bool polled_ = false;
  std::uint64_t last_poll_us_ = 0;
  Bytes last_poll_free_ = 0;
  bool async_checked_ = false;
  std::uint64_t last_async_check_us_ = 0;
  std::vector<Vbar> vbars_;
  std::vector<std::uint32_t> priority_;  // lowest priority first
  std::uint64_t resident_pages_ = 0;
  std::vector<CastBuffer> cast_;         // by offload stream
  Bytes cast_total_ = 0;
  AimdoStats stats_;
};

// The torch allocator of a dynamic-VRAM run, with aimdo's hooks where the driver meets it:
//   raw    - every tensor is a cudaMalloc: the cuMemAlloc_v2 hook around each;
//   caching - PyTorch's native allocator: the same hook around each segment it cudaMallocs
//             (its cached blocks are invisible to aimdo and cannot be evicted by it);
//   async  - cudaMallocAsync: the cudaMallocAsync hook around every tensor (the pool's own
//             growth happens inside the driver, unhooked; what it keeps cached aimdo has
//             already subtracted from its ledger).
// caching-expandable is refused before this is built (ComfyUI strips expandable_segments).
// aimdo's device synchronizes complete the async pool's pending frees (PyTorch's own events
// of the native allocator are processed only by PyTorch: conservative). `device` is the layer
// below (the simulated device; or the cuda backend's real one).
std::unique_ptr<Allocator> make_hooked_allocator(const AllocatorConfig& config, SimDevice& device, Aimdo& aimdo, std::uint64_t seed);
// The native allocator's device layer with each segment's cudaMalloc through the cuMemAlloc hook
// (the cuda backend builds its caching model over it).
std::unique_ptr<DeviceLayer> make_hooked_segments(DeviceLayer& inner, Aimdo& aimdo);

}  // namespace vf::sim

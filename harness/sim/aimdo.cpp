#include "harness/sim/aimdo.h"

#include <algorithm>
#include <bit>
#include <cassert>

#include <unordered_map>

#include "harness/core/error.h"
#include "harness/core/recycle.h"
#include "harness/sim/alloc_options.h"
#include "harness/sim/allocator.h"
#include "harness/sim/async_pool.h"
#include "harness/sim/caching.h"
#include "harness/sim/device.h"
#include "harness/sim/raw.h"

namespace vf::sim {

Bytes aimdo_accounted(Bytes size, bool pages) {
  if (pages) return round_up(size, kAccountPage);
  if (size <= kAccountFloor) return kAccountFloor;
  if (size > kAccountPage / 2) return round_up(size, kAccountPage);
  return size;
}

std::uint64_t vbar_pages_for(Bytes request, Bytes capacity) {
  const std::uint64_t wanted = request / kVbarPage + (request % kVbarPage != 0 ? 1 : 0);
  return std::min<std::uint64_t>(wanted, capacity / kVbarPage);
}

std::string_view fault_result_name(FaultResult r) {
  switch (r) {
    case FaultResult::resident: return "resident";
    case FaultResult::mapped: return "mapped";
    case FaultResult::refused: return "refused";
    case FaultResult::error: return "error";
  }
  return "?";
}

Aimdo::Aimdo(Bytes capacity, const DynamicConstants& k, DeviceLayer& device, const std::uint64_t& now_us,
             std::function<void()> on_sync)
    : capacity_(capacity), k_(k), device_(device), now_us_(now_us), on_sync_(std::move(on_sync)) {}

// ---- bookkeeping ---------------------------------------------------------------------------------

void Aimdo::book(Bytes b) {
  usage_ += b;
  note_peaks();
}

void Aimdo::unbook(Bytes b) {
  if (b > usage_) throw InfraError("aimdo: the ledger would go below zero (a free it never booked)");
  usage_ -= b;
}

void Aimdo::note_peaks() {
  stats_.ledger_peak = std::max(stats_.ledger_peak, usage_);
  stats_.vbar_peak = std::max(stats_.vbar_peak, resident_pages_ * kVbarPage);
  stats_.cast_peak = std::max(stats_.cast_peak, cast_total_);
}

void Aimdo::sync() {
  if (on_sync_) on_sync_();
}

Bytes Aimdo::pinned_bytes() const {
  std::uint64_t n = 0;
  for (const Vbar& mv : vbars_) {
    for (const Page& p : mv.pages) n += p.mapped && p.pins > 0 ? 1 : 0;
  }
  return n * kVbarPage;
}

// ---- budget --------------------------------------------------------------------------------------

void Aimdo::poll_if_due() {
  const std::uint64_t interval = std::uint64_t{k_.poll_ms} * 1000;
  if (polled_ && interval != 0 && now_us_ - last_poll_us_ < interval) return;
  polled_ = true;
  last_poll_us_ = now_us_;
  usage_at_poll_ = usage_;
  last_poll_free_ = device_.free_bytes();
  deficit_sync_ = static_cast<std::int64_t>(kAimdoPollHeadroom) - static_cast<std::int64_t>(last_poll_free_);
  ++stats_.polls;
}

std::int64_t Aimdo::budget_deficit(Bytes size) {
  poll_if_due();
  const auto s = [](Bytes b) { return static_cast<std::int64_t>(b); };
  const std::int64_t simple = s(usage_) + s(size) + s(k_.simple_headroom) - s(capacity_);
  const std::int64_t delta = deficit_sync_ + s(usage_) - s(usage_at_poll_) + s(size);
  return std::max(simple, delta) + s(k_.vram_headroom);
}

// ---- pages ---------------------------------------------------------------------------------------

bool Aimdo::map_page(Vbar& mv, std::uint64_t page) {
  if (!device_.map_pages(mv.base + page * kVbarPage, kVbarPage, kVbarPage)) return false;
  Page& p = mv.pages[page];
  p.mapped = true;
  mv.mapped_bits[page / 64] |= std::uint64_t{1} << (page % 64);
  ++p.serial;
  ++mv.resident;
  ++resident_pages_;
  ++stats_.pages_mapped;
  book(kVbarPage);
  return true;
}

bool Aimdo::release_page(Vbar& mv, std::uint64_t page) {
  Page& p = mv.pages[page];
  if (!p.mapped || p.pins != 0) return false;
  device_.unmap_pages(mv.base + page * kVbarPage, kVbarPage, kVbarPage);
  p.mapped = false;
  mv.mapped_bits[page / 64] &= ~(std::uint64_t{1} << (page % 64));
  mv.mapped_below = std::min(mv.mapped_below, page);
  --mv.resident;
  --resident_pages_;
  ++stats_.pages_evicted;
  unbook(kVbarPage);
  return true;
}

std::uint64_t Aimdo::vbars_free(std::int64_t bytes) {
  if (bytes <= 0) return 0;
  std::uint64_t needed = static_cast<std::uint64_t>(bytes) / kVbarPage + (static_cast<std::uint64_t>(bytes) % kVbarPage ? 1 : 0);
  bool synced = false;
  // Lowest priority first; inside a VBAR from its top down to its watermark limit. Stepping
  // over a pinned or absent page still lowers the watermark: that page is freed when unpinned.
  for (std::size_t i = 0; needed != 0 && i < priority_.size(); ++i) {
    Vbar& mv = vbars_[priority_[i]];
    for (; needed != 0 && mv.watermark > mv.watermark_limit; --mv.watermark) {
      if (!synced) {
        sync();
        synced = true;
      }
      if (release_page(mv, mv.watermark - 1)) --needed;
    }
  }
  if (synced) sync();
  return needed;
}

std::uint64_t Aimdo::absent_from(const Vbar& mv, std::uint64_t cursor) const {
  // The first page at or after `cursor` that is not mapped, or the watermark (`cursor` itself
  // when it is at or above the watermark).
  if (cursor >= mv.watermark) return cursor;
  const bool from_prefix = cursor <= mv.mapped_below;
  if (from_prefix) cursor = std::min(mv.mapped_below, mv.watermark);
  std::uint64_t found = mv.watermark;
  for (std::uint64_t w = cursor / 64; w * 64 < mv.watermark; ++w) {
    std::uint64_t absent = ~mv.mapped_bits[w];
    if (w == cursor / 64) absent &= ~std::uint64_t{0} << (cursor % 64);
    if (absent != 0) {
      found = std::min(w * 64 + static_cast<std::uint64_t>(std::countr_zero(absent)), mv.watermark);
      break;
    }
  }
  if (from_prefix) mv.mapped_below = std::max(mv.mapped_below, found);
  return found;
}

// Each 32 MiB of surplus moves the cursor to the next absent page (absent_from(cursor + 1)) while
// it is below `target` and the watermark. Taken a word of 64 pages at a time: the absent pages
// between the cursor and that limit each take a page of surplus, counted with popcount, and the
// step that leaves the range is taken alone.
std::uint64_t Aimdo::spend_surplus(const Vbar& mv, std::uint64_t target, std::uint64_t cursor, std::int64_t& surplus) const {
  constexpr auto kPage = static_cast<std::int64_t>(kVbarPage);
#ifndef NDEBUG
  // The page-at-a-time walk this replaces, checked against it in builds with assertions.
  std::int64_t naive_surplus = surplus;
  std::uint64_t naive = cursor;
  while (naive_surplus >= kPage && naive < target && naive < mv.watermark) {
    naive_surplus -= kPage;
    naive = absent_from(mv, naive + 1);
  }
  const auto checked = [&](std::uint64_t c) {
    assert(c == naive && surplus == naive_surplus);
    return c;
  };
#else
  const auto checked = [](std::uint64_t c) { return c; };
#endif
  const std::uint64_t limit = std::min(target, mv.watermark);
  while (surplus >= kPage && cursor < limit) {
    const std::uint64_t from = cursor + 1;
    const std::uint64_t word_end = (from / 64 + 1) * 64;
    std::uint64_t absent = 0;  // the absent pages in [from, min(limit, word_end))
    if (from < limit) {
      absent = ~mv.mapped_bits[from / 64] & (~std::uint64_t{0} << (from % 64));
      if (limit < word_end) absent &= (std::uint64_t{1} << (limit % 64)) - 1;  // limit % 64 > 0 here
    }
    if (absent == 0) {
      if (from >= limit || limit <= word_end) {  // the next absent page is at or past the limit
        surplus -= kPage;
        return checked(absent_from(mv, from));
      }
      cursor = word_end - 1;  // every page up to the word's end is mapped: scan on
      continue;
    }
    const auto steps = static_cast<std::uint64_t>(surplus / kPage);
    const auto k = static_cast<std::uint64_t>(std::popcount(absent));
    const std::uint64_t take = std::min(steps, k);
    for (std::uint64_t j = 1; j < take; ++j) absent &= absent - 1;  // drop the take - 1 lowest
    cursor = (from / 64) * 64 + static_cast<std::uint64_t>(std::countr_zero(absent));
    surplus -= static_cast<std::int64_t>(take) * kPage;
  }
  return checked(cursor);
}

// The miss-allocation check of vbar_fault (aimdo 2026-06-05): a cursor walks this VBAR's absent
// pages from its start; each 32 MiB of surplus lets it skip one. When the surplus runs out,
// pages are evicted from the lowest-priority VBARs down (this VBAR's own top pages included),
// each adding 32 MiB, until the cursor passes `target` or the watermark stops it.
void Aimdo::free_for_vbar(std::uint32_t v, std::uint64_t target, std::int64_t surplus) {
  const Vbar& mv = vbars_[v];
  std::uint64_t cursor = spend_surplus(mv, target, absent_from(mv, 0), surplus);
  bool synced = false;
  auto wanted = [&] { return (cursor < target && cursor < mv.watermark) || surplus < 0; };
  for (std::size_t i = 0; wanted() && i < priority_.size(); ++i) {
    Vbar& other = vbars_[priority_[i]];
    for (; wanted() && other.watermark > other.watermark_limit; --other.watermark) {
      const Page& p = other.pages[other.watermark - 1];
      if (!synced && p.mapped && p.pins == 0) {
        sync();
        synced = true;
      }
      if (release_page(other, other.watermark - 1)) {
        surplus += static_cast<std::int64_t>(kVbarPage);
        cursor = spend_surplus(mv, target, cursor, surplus);
      }
    }
  }
  if (synced) sync();
}

// aimdo 0.2.2's version: no surplus, one eviction per absent page until the cursor reaches
// `target`.
void Aimdo::free_for_vbar_v022(std::uint32_t v, std::uint64_t target) {
  const Vbar& mv = vbars_[v];
  std::uint64_t cursor = absent_from(mv, 0);
  sync();
  for (std::size_t i = 0; cursor < target && cursor < mv.watermark && i < priority_.size(); ++i) {
    Vbar& other = vbars_[priority_[i]];
    for (; cursor < target && cursor < mv.watermark && other.watermark > other.watermark_limit; --other.watermark) {
      if (release_page(other, other.watermark - 1)) cursor = absent_from(mv, cursor + 1);
    }
  }
}

// ---- VBARs ---------------------------------------------------------------------------------------

std::uint32_t Aimdo::vbar_allocate(Bytes request) {
  Vbar mv;
  const std::uint64_t pages = vbar_pages_for(request, capacity_);
  mv.pages.resize(pages);
  mv.mapped_bits.assign((pages + 63) / 64, 0);
  mv.watermark = pages;
  mv.base = device_.reserve_va(std::max<Bytes>(pages, 1) * kVbarPage, kVbarPage);
  vbars_.push_back(std::move(mv));
  const auto id = static_cast<std::uint32_t>(vbars_.size() - 1);
  priority_.push_back(id);  // insert_vbar: the top
  return id;
}

void Aimdo::prioritize(std::uint32_t v) {
  priority_.erase(std::find(priority_.begin(), priority_.end(), v));
  priority_.push_back(v);
  vbars_[v].watermark = vbars_[v].pages.size();
}

void Aimdo::deprioritize(std::uint32_t v) {
  priority_.erase(std::find(priority_.begin(), priority_.end(), v));
  priority_.insert(priority_.begin(), v);
}

void Aimdo::reset_watermark_limits() {
  for (Vbar& mv : vbars_) mv.watermark_limit = 0;
}

FaultResult Aimdo::fault(std::uint32_t v, Bytes offset, Bytes size, std::uint32_t* new_pages) {
  ++stats_.faults;
  std::uint32_t mapped_now = 0;
  if (new_pages) *new_pages = 0;
  Vbar& mv = vbars_[v];
  const std::uint64_t first = offset / kVbarPage;
  const std::uint64_t end = (offset + size) / kVbarPage + ((offset + size) % kVbarPage ? 1 : 0);
  auto refuse = [&] {
    ++stats_.faults_refused;
    return FaultResult::refused;
  };
  // A spike since the last call (an allocation the hooks did not see) is collected first.
  if (k_.fault_surplus) vbars_free(budget_deficit(0));
  if (end > mv.watermark) {
    ++stats_.faults_above_watermark;
    return refuse();
  }
  bool miss_checked = false;
  for (std::uint64_t p = first; p < end; ++p) {
    if (mv.pages[p].mapped) continue;
    if (k_.fault_surplus && !miss_checked) {
      const std::int64_t surplus = static_cast<std::int64_t>(capacity_) -
                                   (static_cast<std::int64_t>(usage_ + (end - p) * kVbarPage) + static_cast<std::int64_t>(k_.simple_headroom));
      free_for_vbar(v, end, surplus);
      miss_checked = true;
      if (end > mv.watermark) return refuse();
    }
    bool ok = budget_deficit(kVbarPage) <= 0 && map_page(mv, p);
    if (!ok) {
      if (k_.fault_surplus) {
        vbars_free(static_cast<std::int64_t>(kVbarPage));
        if (end > mv.watermark) return refuse();
      } else {
        free_for_vbar_v022(v, end);
        if (p >= mv.watermark) return refuse();
      }
      ok = map_page(mv, p);
      if (!ok) return FaultResult::error;
    }
    ++mapped_now;
  }
  for (std::uint64_t p = first; p < end; ++p) {
    Page& pg = mv.pages[p];
    pg.pins = k_.pin_counts ? pg.pins + 1 : 1;
  }
  if (new_pages) *new_pages = mapped_now;
  return mapped_now ? FaultResult::mapped : FaultResult::resident;
}

void Aimdo::unpin(std::uint32_t v, Bytes offset, Bytes size) {
  Vbar& mv = vbars_[v];
  const std::uint64_t first = offset / kVbarPage;
  const std::uint64_t end = (offset + size) / kVbarPage + ((offset + size) % kVbarPage ? 1 : 0);
  const bool above = end > mv.watermark;
  if (above) sync();
  for (std::uint64_t p = first; p < end && p < mv.pages.size(); ++p) {
    Page& pg = mv.pages[p];
    if (pg.pins) pg.pins = k_.pin_counts ? pg.pins - 1 : 0;
    // Pages the watermark passed while they were pinned are freed as soon as they are not.
    if (p >= mv.watermark) release_page(mv, p);
  }
  if (above) sync();
}

Bytes Aimdo::free_memory(std::uint32_t v, Bytes bytes) {
  Vbar& mv = vbars_[v];
  std::uint64_t to_free = bytes / kVbarPage + (bytes % kVbarPage ? 1 : 0);
  std::uint64_t freed = 0;
  sync();
  for (; to_free != 0 && mv.watermark > mv.watermark_limit; --mv.watermark) {
    if (release_page(mv, mv.watermark - 1)) {
      --to_free;
      ++freed;
    }
  }
  sync();
  return freed * kVbarPage;
}

// ---- hooks ---------------------------------------------------------------------------------------

bool Aimdo::hook_cuda_malloc(Bytes size, CallableRef<bool()> real) {
  ++stats_.hook_calls;
  const Bytes with_headroom = size + k_.malloc_headroom;
  vbars_free(budget_deficit(with_headroom));
  if (!real()) {
    ++stats_.hook_retries;
    vbars_free(static_cast<std::int64_t>(with_headroom));
    if (!real()) return false;
  }
  book(aimdo_accounted(size, k_.ledger_pages));
  return true;
}

void Aimdo::async_check(Bytes size) {
  async_checked_ = true;
  last_async_check_us_ = now_us_;
  vbars_free(budget_deficit(size));
}

bool Aimdo::evict_and_retry(Bytes size, CallableRef<bool()> real) {
  ++stats_.hook_retries;
  vbars_free(static_cast<std::int64_t>(size));
  return real();
}

void Aimdo::hook_free(Bytes size) { unbook(aimdo_accounted(size, k_.ledger_pages)); }

// ---- cast buffers --------------------------------------------------------------------------------

Bytes Aimdo::cast_size(std::uint32_t stream) const { return stream < cast_.size() ? cast_[stream].allocated : 0; }

bool Aimdo::cast_grow(std::uint32_t stream, Bytes required) {
  if (stream >= cast_.size()) cast_.resize(stream + 1);
  CastBuffer& b = cast_[stream];
  if (!b.live) {
    b.base = device_.reserve_va(kCastReservation, kAccountPage);
    b.live = true;
  }
  if (required > kCastReservation) return false;
  if (required <= b.allocated) return true;
  ++stats_.cast_grows;
  const Bytes grow_to = std::min(round_up(required, kCastChunk), kCastReservation);
  vbars_free(budget_deficit(grow_to - b.allocated));
  while (b.allocated < grow_to) {
    const Bytes chunk = std::min(kCastChunk, grow_to - b.allocated);
    if (!device_.map_pages(b.base + b.allocated, chunk, chunk)) {
      vbars_free(static_cast<std::int64_t>(kCastChunk));
      if (!device_.map_pages(b.base + b.allocated, chunk, chunk)) return false;  // what it mapped stays
    }
    b.allocated += chunk;
    cast_total_ += chunk;
    book(chunk);
  }
  return true;
}

void Aimdo::release_all() {
  cast_reset();
  for (std::uint32_t v = 0; v < vbars_.size(); ++v) {
    Vbar& mv = vbars_[v];
    for (std::uint64_t p = 0; p < mv.pages.size(); ++p) {
      mv.pages[p].pins = 0;
      release_page(mv, p);
    }
    if (!mv.pages.empty() || mv.base != 0) device_.release_va(mv.base, std::max<std::uint64_t>(mv.pages.size(), 1) * kVbarPage);
    mv = Vbar{};
  }
  priority_.clear();
}

void Aimdo::cast_reset() {
  for (CastBuffer& b : cast_) {
    if (!b.live) continue;
    if (b.allocated != 0) {
      device_.unmap_pages(b.base, b.allocated, kCastChunk);
      unbook(b.allocated);
      cast_total_ -= b.allocated;
    }
    device_.release_va(b.base, kCastReservation);
    b = CastBuffer{};
  }
}

// ---- the hooked torch allocator ------------------------------------------------------------------

namespace {

// The native allocator's device below it: each segment's cudaMalloc goes through the hook.
class HookedSegments final : public DeviceLayer {
 public:
  HookedSegments(DeviceLayer& inner, Aimdo& aimdo) : inner_(inner), aimdo_(aimdo) {}
  std::optional<DeviceAlloc> segment_malloc(Bytes size) override {
    std::optional<DeviceAlloc> got;
    if (!aimdo_.hook_cuda_malloc(size, [&] { return (got = inner_.segment_malloc(size)).has_value(); })) return std::nullopt;
    sizes_[got->addr] = size;
    return got;
  }
  void segment_free(const DeviceAlloc& a) override {
    inner_.segment_free(a);
    const auto it = sizes_.find(a.addr);
    if (it == sizes_.end()) throw InfraError("aimdo: free of a segment the hook never saw");
    aimdo_.hook_free(it->second);
    sizes_.erase(it);
  }
  DeviceAddr reserve_va(Bytes size, Bytes align) override { return inner_.reserve_va(size, align); }
  void release_va(DeviceAddr base, Bytes size) override { inner_.release_va(base, size); }
  bool map_pages(DeviceAddr addr, Bytes bytes, Bytes page) override { return inner_.map_pages(addr, bytes, page); }
  void unmap_pages(DeviceAddr addr, Bytes bytes, Bytes page) override { inner_.unmap_pages(addr, bytes, page); }
  Bytes free_bytes() const override { return inner_.free_bytes(); }
  const DeviceSpec& spec() const override { return inner_.spec(); }

 private:
  DeviceLayer& inner_;
  Aimdo& aimdo_;
  std::unordered_map<DeviceAddr, Bytes> sizes_;
};

// An allocator whose every malloc is one hooked driver call (raw: cudaMalloc; async:
// cudaMallocAsync), or the native allocator over hooked segments.
class Hooked final : public Allocator {
 public:
  enum class Hook : std::uint8_t { cuda_malloc, malloc_async, segments };
  Hooked(Hook hook, Aimdo& aimdo) : hook_(hook), aimdo_(aimdo) {}
  void set(std::unique_ptr<Allocator> inner, std::unique_ptr<DeviceLayer> layer = {}) {
    layer_ = std::move(layer);
    inner_ = std::move(inner);
  }
  Allocator& inner() { return *inner_; }

  AllocatorMode mode() const override { return inner_->mode(); }
  bool malloc(BlockKey key, Bytes size, StreamId stream) override {
    if (hook_ == Hook::segments) return inner_->malloc(key, size, stream);
    auto real = [&] { return inner_->malloc(key, size, stream); };
    const bool ok = hook_ == Hook::cuda_malloc ? aimdo_.hook_cuda_malloc(size, real) : aimdo_.hook_malloc_async(size, real);
    if (ok) {
      cover_key(sizes_, key, Bytes{0});
      sizes_[key] = size;
    }
    return ok;
  }
  void free(BlockKey key) override {
    inner_->free(key);
    if (hook_ != Hook::segments) aimdo_.hook_free(sizes_.at(key));
  }
  void record_stream(BlockKey key, StreamId stream) override { inner_->record_stream(key, stream); }
  void stream_wait(StreamId waiter, StreamId target) override { inner_->stream_wait(waiter, target); }
  void synchronize() override { inner_->synchronize(); }
  void empty_cache() override { inner_->empty_cache(); }
  const AllocStats& stats() const override { return inner_->stats(); }
  void reset_peak_stats() override { inner_->reset_peak_stats(); }
  void live_blocks(std::vector<BlockView>& out) const override { inner_->live_blocks(out); }
  const std::optional<OomInfo>& last_oom() const override { return inner_->last_oom(); }
  Bytes held_for_other_streams(StreamId stream, Bytes request) const override {
    return inner_->held_for_other_streams(stream, request);
  }
  Bytes held_at_oom(StreamId stream, Bytes request) const override { return inner_->held_at_oom(stream, request); }
  void reserve_keys(std::size_t keys) override {
    inner_->reserve_keys(keys);
    sizes_.reserve(keys);
  }

 private:
  Hook hook_;
  Aimdo& aimdo_;
  std::unique_ptr<DeviceLayer> layer_;  // before inner_: the native allocator uses it to the end
  std::unique_ptr<Allocator> inner_;
  std::vector<Bytes> sizes_;  // by key: the size each hooked malloc booked
};

}  // namespace

std::unique_ptr<DeviceLayer> make_hooked_segments(DeviceLayer& inner, Aimdo& aimdo) {
  return std::make_unique<HookedSegments>(inner, aimdo);
}

std::unique_ptr<Allocator> make_hooked_allocator(const AllocatorConfig& config, SimDevice& device, Aimdo& aimdo, std::uint64_t seed) {
  const AllocOptions options = parse_alloc_options(config, "allocator");
  switch (options.mode) {
    case AllocatorMode::raw: {
      auto a = std::make_unique<Hooked>(Hooked::Hook::cuda_malloc, aimdo);
      a->set(std::make_unique<RawAllocator>(device));
      return a;
    }
    case AllocatorMode::caching: {
      auto a = std::make_unique<Hooked>(Hooked::Hook::segments, aimdo);
      auto layer = std::make_unique<HookedSegments>(device, aimdo);
      auto inner = std::make_unique<CachingAllocator>(*layer, options.caching);
      a->set(std::move(inner), std::move(layer));
      return a;
    }
    case AllocatorMode::async: {
      auto a = std::make_unique<Hooked>(Hooked::Hook::malloc_async, aimdo);
      a->set(std::make_unique<AsyncPoolAllocator>(device, options.async, seed));
      return a;
    }
    case AllocatorMode::caching_expandable: break;
  }
  throw InputError("allocator.mode", "expandable segments are not available under dynamic VRAM (ComfyUI strips them)");
}

}  // namespace vf::sim

// P4: the overhead bound of each allocator mode. The rules each term stands on are in
// docs/allocators.md ("Overhead bounds (P4)"); the numbers used are the allocator models' own
// constants (harness/sim/*.h), so the bound moves with the model it bounds.
#include "harness/overhead.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "harness/sim/alloc_options.h"
#include "harness/sim/async_pool.h"
#include "harness/sim/caching.h"
#include "harness/sim/device.h"

namespace vf {
namespace {

constexpr std::uint64_t kNever = ~std::uint64_t{0};
constexpr std::uint32_t kNoArena = 0xffffffffu;

// Running terms: an estimator keeps them up to date after every event.
class Estimator {
 public:
  virtual ~Estimator() = default;
  virtual void alloc(std::uint32_t buffer, Bytes bytes, std::uint32_t stream, std::uint64_t seq) = 0;
  virtual void free(std::uint32_t buffer, std::uint64_t seq) = 0;
  virtual void empty_cache() = 0;
  // A device-wide synchronize: every pending free becomes everyone's (async).
  virtual void synchronize() {}
  const OverheadTerms& terms() const { return t_; }

 protected:
  OverheadTerms t_;
};

// ---- raw: every buffer its own cudaMalloc -------------------------------------------------------
//
// A buffer of n bytes, rounded to 512 B, is charged in whole 2 MiB pages of its own when the
// rounded size is at least 2 MiB: waste roundup(n', 2 MiB) - n < 2 MiB. Smaller buffers are
// sub-allocated from shared pages by best fit (sim/device.h); a page is given back when its last
// buffer is freed, and a new one is taken only when no hole in any page holds the request r. At
// that moment every hole is at most r - 512 B, and a page's holes are separated by its live
// buffers, so there are at most n + P holes (n live small buffers, P pages):
//   P * 2 MiB - L <= (n + P) * (r - 512)   =>   P <= (L + n * (r - 512)) / (2 MiB - r + 512),
// L the live small buffers' rounded bytes before the request. Pages are only ever added by such a
// request, so the pages now are at most that figure + 1 at the latest one: the estimator keeps
// the largest value the formula took at any small allocation since the last moment no small
// buffer lived (all pages given back), and every page holds a live buffer:
//   pages <= min(live small buffers, max over those allocations of the formula + 1).
class RawEstimator final : public Estimator {
 public:
  void alloc(std::uint32_t buffer, Bytes bytes, std::uint32_t, std::uint64_t) override {
    if (buffer >= blocks_.size()) blocks_.resize(buffer + 1);
    const Bytes rounded = round_up(std::max<Bytes>(bytes, 1), sim::kCudaMallocAlign);
    Block& b = blocks_[buffer];
    b.bytes = bytes;
    b.small = rounded < sim::kDevicePage;
    if (!b.small) {
      t_.rounding += round_up(rounded, sim::kDevicePage) - bytes;
      return;
    }
    const Bytes hole = rounded - sim::kCudaMallocAlign;  // the largest hole that cannot take it
    const Bytes at_opening = (live_rounded_ + live_small_ * hole) / (sim::kDevicePage - hole) + 1;
    pages_cap_ = std::max(pages_cap_, at_opening);
    ++live_small_;
    live_rounded_ += rounded;
    small_bytes_ += bytes;
    update_pages();
  }
  void free(std::uint32_t buffer, std::uint64_t) override {
    const Block& b = blocks_[buffer];
    const Bytes rounded = round_up(std::max<Bytes>(b.bytes, 1), sim::kCudaMallocAlign);
    if (!b.small) {
      t_.rounding -= round_up(rounded, sim::kDevicePage) - b.bytes;
      return;
    }
    --live_small_;
    live_rounded_ -= rounded;
    small_bytes_ -= b.bytes;
    if (live_small_ == 0) pages_cap_ = 0;  // every page was given back
    update_pages();
  }
  void empty_cache() override {}  // nothing is cached: cudaFree gives memory back at once

 private:
  struct Block {
    Bytes bytes = 0;
    bool small = false;
  };
  void update_pages() { t_.packing = sat_sub(std::min(live_small_, pages_cap_) * sim::kDevicePage, small_bytes_); }

  std::vector<Block> blocks_;
  Bytes live_small_ = 0;    // live small buffers
  Bytes live_rounded_ = 0;  // their 512 B-rounded bytes
  Bytes small_bytes_ = 0;   // their requested bytes
  Bytes pages_cap_ = 0;     // the formula's largest value since no small buffer lived
};

// ---- the pieces the other modes share -----------------------------------------------------------

// A size class: (slot size, stream). The stream part is 0 where the arena is per stream already
// (caching, expandable) and the freeing stream where one pool serves every stream (async).
using ClassKey = std::pair<Bytes, std::uint32_t>;

// One block as the class-based estimators see it.
struct Block {
  bool live = false;
  Bytes bytes = 0;                 // requested
  Bytes rounded = 0;               // the allocator's rounded size
  Bytes slot = 0;                  // its class's slot size; 0 when a packing accounts for it
  std::uint32_t arena = kNoArena;
  std::uint32_t stream = 0;
  std::uint64_t seq = 0;           // allocation order
  bool packed = false;             // may sit in its arena's shared segments
  bool makes_segment = false;      // a miss for it makes a shared segment
  Bytes end = 0;                   // arenas with a top: upper estimate of its end address
  // The classes whose slots it may have taken, with how many slots each had then.
  std::vector<std::pair<ClassKey, std::uint64_t>> steals;
};

// Shared segments filled by several blocks: the caching small pool's 2 MiB segments and the
// large pool's large-buffer segments (20 MiB, made for 1-10 MiB requests). A new segment is made
// only when no free block holds the request, and a segment is filled in address order, so every
// segment but the newest holds more than cap - r_max (r_max: the largest segment-making request),
// and at least one block (r_min). Segments <= H / D + 1 with D = max(cap - r_max, r_min) and H the
// most packable bytes live at once since the last empty_cache; that empty_cache left at most one
// segment per live packable block (`pinned`).
struct Packing {
  Bytes charge = 0;           // device bytes per segment
  Bytes cap = 0;              // segment size
  bool never_reused = false;  // max_split_size_mb <= the segment size: no request reuses one
  Bytes live_r = 0;           // live rounded bytes of the blocks that may sit in the segments
  Bytes primary_r = 0;        // ... of those accounted here (not in a size class)
  std::uint64_t live_n = 0;
  Bytes high = 0;             // most live_r since the last empty_cache
  Bytes r_max = 0;            // largest segment-making request
  Bytes r_min = ~Bytes{0};    // smallest packable block
  std::uint64_t makers = 0;   // segment-making requests since the last empty_cache
  std::uint64_t pinned = 0;

  std::uint64_t segments() const {
    if (makers == 0) return pinned;
    if (never_reused) return pinned + makers;
    const Bytes d = std::max(cap > r_max ? cap - r_max : 0, r_min);
    return pinned + high / d + 1;
  }
  Bytes bytes() const { return segments() * charge; }
  void reset() {
    pinned = std::min(segments(), live_n);
    high = live_r;
    makers = 0;
  }
};

// Blocks of one size class behave like a segregated free list: a new slot of the class is made
// only when no free block holds the request, so every slot of the class made before is held by a
// live block: one of the class, or a block of another class placed into it after a block of the
// class was freed there (or into the remainder a request of the class left free in its segment):
// a steal. A block can only take a slot that existed when it was allocated, so the steals that can
// pin slots at once are a matching of the live candidates to the slots each could see. A new slot
// is counted at an allocation of the class only when live blocks of the class + that matching
// reach the slots counted so far; they stay cached once the class's blocks are freed.
struct SizeClass {
  Bytes charge = 0;                  // device bytes per slot
  std::uint64_t live = 0;
  std::uint64_t slots = 0;           // upper bound on the slots (live or cached)
  std::uint64_t stolen = 0;          // the steals matched when `slots` was last raised
  // async: slots a block of another stream may have been placed in and then freed on its own
  // stream. Free memory of different owners does not merge, so such a slot may hold a piece this
  // class's stream cannot take until an event edge or a synchronize: it may not serve the class.
  std::uint64_t tainted = 0;
  std::uint64_t first_alloc = kNever;
  std::uint64_t first_free = kNever;
  Bytes r_min = ~Bytes{0};           // smallest request of the class
  bool never_reused = false;         // caching: a request < max_split whose segment is >= max_split
  std::vector<std::uint64_t> seen;   // seen[k]: live candidates that saw k slots when allocated

  // The most slots the live candidates can hold at once: they are matched greedily, those that
  // saw fewest slots first (the sets of slots they may take are nested).
  std::uint64_t matched() const {
    std::uint64_t n = 0;
    for (std::uint64_t k = 1; k < seen.size(); ++k) n = std::min(std::min(k, slots), n + seen[k]);
    return n;
  }
};

// What one free list serves: caching and expandable: a (stream, pool); async: the whole pool.
struct Arena {
  std::map<ClassKey, SizeClass> classes;
  std::map<std::uint64_t, std::uint32_t> by_seq;  // live blocks in allocation order -> buffer
  bool has_packing = false;
  Packing packing;
  Bytes growth_unit = 0;  // expandable page / async chunk (0: none)
  Bytes kept = 0;         // units left partly used around live blocks by the last empty_cache
  bool grew = false;      // allocated since the last empty_cache
  // Expandable: a second bound, the arena's top. A block is carved from the start of a free block
  // (or of the free and unmapped run PyTorch maps on a miss), and such a block starts at offset 0,
  // at the end of a live block, or at the end of a hole: the unmapped pages empty_cache left
  // between live blocks (a mapped free block never merges with an unmapped one). A hole ends at
  // or below the highest live end of the empty_cache that made it, so a block ends at most at
  // max(highest live end, floor) + its size, floor being the highest live end of every
  // empty_cache since one that found the arena empty (that one unmapped everything). The pages
  // mapped reach at most the highest end since the last empty_cache, which unmaps every whole
  // free page above the highest live block. The smaller bound is used.
  bool tops = false;
  std::multiset<Bytes> live_ends;  // the live blocks' end estimates
  Bytes top = 0;                   // highest end estimate since the last empty_cache
  Bytes floor = 0;                 // highest end a hole may have (see above)
  Bytes live_r = 0;                // live rounded bytes
};

// The estimator of the caching, expandable and async modes: size classes and packings per arena.
// Subclasses say where a block goes and which blocks may take another class's slot.
class ClassEstimator : public Estimator {
 public:
  void alloc(std::uint32_t buffer, Bytes bytes, std::uint32_t stream, std::uint64_t seq) override {
    if (buffer >= blocks_.size()) blocks_.resize(buffer + 1);
    Block& b = blocks_[buffer];
    b = Block{};
    b.bytes = bytes;
    b.stream = stream;
    b.seq = seq;
    if (bytes == 0) return;  // no allocator is called for an empty tensor
    place(b);
    b.live = true;
    Arena& a = arenas_[b.arena];
    share(a, false);
    a.by_seq.emplace(seq, buffer);
    a.grew = true;
    if (a.tops) {
      b.end = std::max(a.live_ends.empty() ? 0 : *a.live_ends.rbegin(), a.floor) + b.rounded;
      a.live_ends.insert(b.end);
      a.top = std::max(a.top, b.end);
      a.live_r += b.rounded;
    }
    if (b.packed) {
      Packing& p = a.packing;
      p.live_r += b.rounded;
      ++p.live_n;
      p.high = std::max(p.high, p.live_r);
      p.r_min = std::min(p.r_min, b.rounded);
      if (b.slot == 0) p.primary_r += b.rounded;
      if (b.makes_segment) {
        ++p.makers;
        p.r_max = std::max(p.r_max, b.rounded);
      }
    }
    // Every class whose slots it may take: it fits, and a slot of the class has had room since.
    for (auto& [key, c] : a.classes) {
      if (c.slots == 0 || (b.slot != 0 && key == key_of(b)) || b.rounded > key.first || !may_steal(b, key, c)) continue;
      if (c.seen.size() <= c.slots) c.seen.resize(c.slots + 1, 0);
      ++c.seen[c.slots];
      b.steals.emplace_back(key, c.slots);
    }
    if (b.slot != 0) {
      SizeClass& c = a.classes[key_of(b)];
      c.charge = b.slot;
      if (c.first_alloc == kNever) c.first_alloc = seq;
      c.r_min = std::min(c.r_min, b.rounded);
      if (never_reused(b)) {
        c.never_reused = true;
        c.slots = std::max(c.slots + 1, c.live + 1);
      } else {
        const std::uint64_t steals = c.matched();
        if (c.live + steals + c.tainted >= c.slots) {  // every slot may be held: this may make a new one
          c.slots += 1;
          c.stolen = steals;
        }
      }
      ++c.live;
    }
    t_.rounding += (b.slot != 0 ? b.slot : b.rounded) - b.bytes;
    share(a, true);
  }

  void free(std::uint32_t buffer, std::uint64_t seq) override {
    Block& b = blocks_[buffer];
    if (!b.live) return;
    b.live = false;
    Arena& a = arenas_[b.arena];
    share(a, false);
    a.by_seq.erase(b.seq);
    if (a.tops) {
      a.live_ends.erase(a.live_ends.find(b.end));
      a.live_r -= b.rounded;
    }
    if (b.packed) {
      a.packing.live_r -= b.rounded;
      --a.packing.live_n;
      if (b.slot == 0) a.packing.primary_r -= b.rounded;
    }
    for (const auto& [key, k] : b.steals) {
      SizeClass& c = a.classes[key];
      --c.seen[k];
      // Freed on its own stream inside a slot of another stream's class: that slot (or the two it
      // straddles) may now hold a piece the class's stream cannot take.
      if (frees_are_owned() && key.second != b.stream) c.tainted = std::min(c.slots, c.tainted + 2);
    }
    b.steals.clear();
    if (b.slot != 0) {
      SizeClass& c = a.classes[key_of(b)];
      --c.live;
      if (c.first_free == kNever) c.first_free = seq;
    }
    t_.rounding -= (b.slot != 0 ? b.slot : b.rounded) - b.bytes;
    share(a, true);
  }

  // Only free memory goes back: every slot a live block holds stays (its own or stolen), the
  // shared segments holding live blocks stay, and so do the partly used growth units at the ends
  // of the free pieces between live blocks (at most two per live block, and never more than was
  // free).
  void empty_cache() override {
    for (Arena& a : arenas_) {
      share(a, false);
      Bytes was_free = 0;
      for (auto& [key, c] : a.classes) {
        was_free += (c.slots - c.live) * c.charge;
        const std::uint64_t steals = c.matched();
        c.slots = std::min(c.slots, c.live + steals);
        c.stolen = steals;
        c.tainted = 0;  // synchronized first: every free is everyone's
      }
      if (a.has_packing) {
        was_free += sat_sub(a.packing.bytes(), a.packing.live_r);
        a.packing.reset();
      }
      if (a.growth_unit > 0) {
        was_free += a.kept + (a.grew ? a.growth_unit : 0);
        a.kept = std::min<Bytes>(was_free, 2 * a.growth_unit * a.by_seq.size());
      }
      a.grew = false;
      if (a.tops) {
        a.top = a.live_ends.empty() ? 0 : *a.live_ends.rbegin();
        a.floor = a.live_ends.empty() ? 0 : std::max(a.floor, a.top);
      }
      share(a, true);
    }
  }

 protected:
  // Sets the block's arena, rounded size, slot (0: accounted by the arena's packing), packed and
  // makes_segment.
  virtual void place(Block& b) = 0;
  virtual ClassKey key_of(const Block& b) const { return {b.slot, 0}; }
  // May `b` (being allocated, of another class, no larger than the slots) take a slot of the
  // class? Only if a slot has had room since: a block of the class was freed, or (caching) its
  // split remainder holds b.
  virtual bool may_steal(const Block& b, const ClassKey&, const SizeClass& c) const { return c.first_free != kNever && b.seq > c.first_free; }
  virtual bool never_reused(const Block&) const { return false; }
  // async: a free belongs to the stream that made it (SizeClass::tainted).
  virtual bool frees_are_owned() const { return false; }

 public:
  void synchronize() override {
    if (!frees_are_owned()) return;
    for (Arena& a : arenas_) {
      for (auto& [key, c] : a.classes) c.tainted = 0;
    }
  }

 protected:

  std::uint32_t arena_for(std::uint32_t stream, bool small) {
    const auto [it, fresh] = arena_index_.try_emplace(std::make_pair(stream, small), 0);
    if (fresh) {
      it->second = static_cast<std::uint32_t>(arenas_.size());
      arenas_.emplace_back();
      init_arena(arenas_.back(), small);
    }
    return it->second;
  }
  virtual void init_arena(Arena&, bool small) = 0;

 private:
  // Takes an arena's share out of the running terms before a change (add = false) and puts it
  // back after (add = true).
  void share(const Arena& a, bool add) {
    OverheadTerms s;
    for (const auto& [key, c] : a.classes) {
      const Bytes extra = (c.slots - c.live) * c.charge;
      const Bytes stolen = std::min(c.stolen, c.slots - c.live) * c.charge;
      s.stolen += stolen;
      s.cached += extra - stolen;
    }
    if (a.has_packing) s.packing = sat_sub(a.packing.bytes(), a.packing.primary_r);
    if (a.growth_unit > 0) s.growth = a.kept + (a.grew ? a.growth_unit : 0);
    if (a.tops) {
      const Bytes by_top = round_up(a.top, a.growth_unit);
      if (by_top < a.live_r + s.total()) s = OverheadTerms{0, 0, sat_sub(by_top, a.live_r), 0, 0};
    }
    auto apply = [add](Bytes& total, Bytes v) { total = add ? total + v : total - v; };
    apply(t_.packing, s.packing);
    apply(t_.cached, s.cached);
    apply(t_.stolen, s.stolen);
    apply(t_.growth, s.growth);
  }

 protected:
  std::vector<Arena> arenas_;
  std::vector<Block> blocks_;

 private:
  std::map<std::pair<std::uint32_t, bool>, std::uint32_t> arena_index_;
};

// ---- caching: PyTorch's native allocator ----------------------------------------------------------
//
// Per (stream, pool): small requests (rounded <= 1 MiB) share 2 MiB segments (a packing); 1-10
// MiB requests share large-buffer segments (a packing); a request of 10 MiB or more gets a
// segment of its own size class, roundup(r, 2 MiB), which counts its unsplit slack, and may
// also be carved from a large-buffer segment (so it is counted in that packing as well). A
// class's segment may be taken by a later, smaller block after a block of the class was freed,
// or into its split remainder (more than 1 MiB left): the steals. With max_split_size_mb, a
// request below it never reuses a cached segment at or above it: every such request may make one.
class CachingEstimator final : public ClassEstimator {
 public:
  explicit CachingEstimator(const sim::CachingOptions& o) : o_(o) {}

 private:
  void init_arena(Arena& a, bool small) override {
    a.has_packing = true;
    a.packing.cap = small ? sim::kSmallBuffer : o_.large_segment_size;
    a.packing.charge = round_up(a.packing.cap, sim::kDevicePage);  // cudaMalloc charges whole pages
    a.packing.never_reused = !small && o_.large_segment_size >= o_.max_split_size;
  }
  void place(Block& b) override {
    b.rounded = sim::round_size(b.bytes, o_.roundup_divisions);
    const bool small = b.rounded <= sim::kSmallSize;
    b.arena = arena_for(b.stream, small);
    if (small || b.rounded < sim::kMinLargeAlloc) {
      b.slot = 0;
      b.packed = true;
      b.makes_segment = true;
    } else {
      b.slot = sim::allocation_size(b.rounded, o_.large_segment_size);
      b.packed = b.rounded < o_.large_segment_size;
    }
  }
  bool may_steal(const Block& b, const ClassKey& key, const SizeClass& c) const override {
    if (o_.max_split_size != sim::kUnlimited && b.rounded < o_.max_split_size && key.first >= o_.max_split_size) {
      return false;  // a request below max_split never takes an oversize block
    }
    return c.first_free != kNever || (split_remainder(c) && b.rounded <= key.first - c.r_min);
  }
  // A request of the class left more than 1 MiB of its new segment free (split, §1.5).
  bool split_remainder(const SizeClass& c) const { return c.charge - c.r_min > sim::kSmallSize; }
  bool never_reused(const Block& b) const override {
    return o_.max_split_size != sim::kUnlimited && b.rounded < o_.max_split_size && b.slot >= o_.max_split_size;
  }

  sim::CachingOptions o_;
};

// ---- caching-expandable ---------------------------------------------------------------------------
//
// Per (stream, pool) one growable segment, split at 512 B: a request's class is its rounded size.
// The segment grows only when no free block holds the request, by whole pages (2 MiB small,
// large_segment_size large) at its end: one partly used page per arena.
class ExpandableEstimator final : public ClassEstimator {
 public:
  explicit ExpandableEstimator(const sim::CachingOptions& o) : o_(o) {}

 private:
  void init_arena(Arena& a, bool small) override {
    a.growth_unit = small ? sim::kSmallBuffer : o_.large_segment_size;
    a.tops = true;
  }
  void place(Block& b) override {
    b.rounded = sim::round_size(b.bytes, o_.roundup_divisions);
    b.arena = arena_for(b.stream, b.rounded <= sim::kSmallSize);
    b.slot = b.rounded;
  }
  // With max_split_size_mb, freed neighbours merge into blocks a request may not take (>=
  // max_split for a request below it; >= request + max_non_split_rounding above it), and the
  // ladder never releases expandable blocks early: any request may map new pages.
  bool never_reused(const Block&) const override { return o_.max_split_size != sim::kUnlimited; }
  sim::CachingOptions o_;
};

// ---- async: the cudaMallocAsync pool --------------------------------------------------------------
//
// One pool for every stream; a request's class is (its 512 B-rounded size, its stream), because
// what a stream frees only it may reuse until an event edge or a synchronize. The pool grows in
// chunks of pool_granularity: one partly used chunk at its end.
class AsyncEstimator final : public ClassEstimator {
 public:
  explicit AsyncEstimator(const sim::AsyncOptions& o) : o_(o) {}

 private:
  void init_arena(Arena& a, bool) override { a.growth_unit = o_.pool_granularity; }
  void place(Block& b) override {
    b.rounded = round_up(b.bytes, sim::kAsyncAlign);
    b.arena = arena_for(0, false);
    b.slot = b.rounded;
  }
  ClassKey key_of(const Block& b) const override { return {b.slot, b.stream}; }
  bool frees_are_owned() const override { return true; }

  sim::AsyncOptions o_;
};

std::unique_ptr<Estimator> make_estimator(const sim::AllocOptions& o) {
  switch (o.mode) {
    case AllocatorMode::raw: return std::make_unique<RawEstimator>();
    case AllocatorMode::caching: return std::make_unique<CachingEstimator>(o.caching);
    case AllocatorMode::caching_expandable: return std::make_unique<ExpandableEstimator>(o.caching);
    case AllocatorMode::async: return std::make_unique<AsyncEstimator>(o.async);
  }
  return std::make_unique<RawEstimator>();
}

}  // namespace

std::string OverheadBreakdown::summary() const {
  return fmt::format("{} overhead bound {} (stage {}, op {}: estimate {} over live peak {}): rounding {}, packing {}, "
                     "cached {}, stolen {}, growth {}",
                     allocator_mode_name(mode), format_mib(bound), stage, op, format_mib(estimate),
                     format_mib(stage_live_peak), format_mib(terms.rounding), format_mib(terms.packing),
                     format_mib(terms.cached), format_mib(terms.stolen), format_mib(terms.growth));
}

OverheadBreakdown overhead_breakdown(const Scenario& s, const Program& p) {
  OverheadBreakdown out;
  out.mode = s.allocator.mode;
  const sim::AllocOptions options = sim::parse_alloc_options(s.allocator, "allocator");
  const std::unique_ptr<Estimator> est = make_estimator(options);
  const bool caching = options.mode == AllocatorMode::caching || options.mode == AllocatorMode::caching_expandable;
  const LivePeaks lp = live_peaks(p);
  struct StageMax {
    bool seen = false;
    Bytes estimate = 0;
    std::uint32_t op = 0;
    Bytes live = 0;
    OverheadTerms terms;
  };
  std::vector<StageMax> stages(p.stage_begin.size());
  Bytes live = 0;
  for (std::uint32_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    switch (op.kind) {
      case OpKind::alloc:
        if (caching && p.buffers[op.buffer].bytes > 0) {
          const Bytes rounded = sim::round_size(p.buffers[op.buffer].bytes, options.caching.roundup_divisions);
          out.limit_need = std::max(out.limit_need, live + est->terms().total() +
                                                        sim::allocation_size(rounded, options.caching.large_segment_size));
        }
        est->alloc(op.buffer, p.buffers[op.buffer].bytes, op.stream, i);
        live += p.buffers[op.buffer].bytes;
        break;
      case OpKind::free:
        est->free(op.buffer, i);
        live -= p.buffers[op.buffer].bytes;
        break;
      case OpKind::empty_cache: est->empty_cache(); break;
      case OpKind::sync: est->synchronize(); break;
      // A conditional flush may not happen: the bound assumes it does not. Waits only let an
      // allocator reuse more.
      default: break;
    }
    if (is_transition(op) || op.stage >= stages.size()) continue;
    StageMax& m = stages[op.stage];
    const Bytes e = live + est->terms().total();
    if (!m.seen || e > m.estimate) m = StageMax{true, e, i, live, est->terms()};
  }
  bool found = false;
  for (std::uint32_t k = 0; k < stages.size(); ++k) {
    const StageMax& m = stages[k];
    if (!m.seen || (k < s.stages.size() && s.stages[k].op == StageOp::unload)) continue;  // unchecked
    const Bytes b = sat_sub(m.estimate, lp.stage_peak[k]);
    if (!found || b > out.bound) {
      found = true;
      out.bound = b;
      out.stage = k;
      out.op = m.op;
      out.live = m.live;
      out.stage_live_peak = lp.stage_peak[k];
      out.estimate = m.estimate;
      out.terms = m.terms;
    }
  }
  return out;
}

Bytes overhead_bound(const Scenario& s, const Program& p) { return overhead_breakdown(s, p).bound; }

std::optional<AllocatorLimit> allocator_limit(const Scenario& s) {
  const sim::AllocOptions o = sim::parse_alloc_options(s.allocator, "allocator");
  const bool async = o.mode == AllocatorMode::async;
  const double f = async ? o.async.memory_fraction : o.caching.memory_fraction;
  if (o.mode == AllocatorMode::raw || f >= 1.0) return std::nullopt;
  // The allocators compute it the same way: the caching modes round to the nearest byte
  // (caching.cpp, PyTorch 2026), the async pool truncates (async_pool.cpp, as PyTorch's
  // cudaMallocAsync backend does).
  const double limit = f * static_cast<double>(s.device.total);
  return AllocatorLimit{static_cast<Bytes>(async ? limit : std::round(limit)), async};
}

std::span<const AllocatorOptionSet> bound_option_sets(AllocatorMode mode) {
  static const std::vector<AllocatorOptionSet> caching = {
      {},
      {{"max_split_size_mb", "40"}},
      {{"max_split_size_mb", "20"}, {"max_non_split_rounding_mb", "64"}},
      {{"roundup_power2_divisions", "4"}},
      {{"roundup_power2_divisions", "[1:2,8:4,>:8]"}, {"large_segment_size_mb", "12"}},
      // A segment at max_split (PyTorch 2026 refuses max_split below the large segment size).
      {{"large_segment_size_mb", "33"}, {"max_split_size_mb", "33"}},
      {{"max_split_size_mb", "200"}, {"roundup_power2_divisions", "2"}},
      {{"per_process_memory_fraction", "0.6"}, {"garbage_collection_threshold", "0.5"}},
  };
  static const std::vector<AllocatorOptionSet> async = {
      {},
      {{"pool_granularity", "32MiB"}},
      {{"pool_granularity", "32MiB"}, {"release_threshold", "0"}},
      {{"reuse_follow_event_dependencies", "False"}, {"reuse_allow_opportunistic", "False"},
       {"reuse_allow_internal_dependencies", "False"}},
      {{"pool_granularity", "6MiB"}, {"release_threshold", "20MiB"}, {"opportunistic_probability", "0.9"}},
      {{"opportunistic_probability", "0"}},
      // CUDA's own default threshold (trim at every synchronize) at the default growth step.
      {{"release_threshold", "0"}},
      {{"release_threshold", "0"}, {"reuse_follow_event_dependencies", "False"},
       {"reuse_allow_opportunistic", "False"}, {"reuse_allow_internal_dependencies", "False"}},
  };
  static const std::vector<AllocatorOptionSet> none = {{}};
  switch (mode) {
    case AllocatorMode::caching:
    case AllocatorMode::caching_expandable: return caching;
    case AllocatorMode::async: return async;
    case AllocatorMode::raw: break;
  }
  return none;
}

}  // namespace vf

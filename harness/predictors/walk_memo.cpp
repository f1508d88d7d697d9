#include "harness/predictors/walk_memo.h"

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <utility>

namespace vf {

namespace {

struct MemoKey {
  const ModelSpec* spec = nullptr;
  std::size_t modules = 0;
  Bytes bytes = 0;
  WalkFlavor flavor = WalkFlavor::classic;
  Dtype compute = Dtype::bf16;
  bool lora = false;
  bool dequant_term = true;
  double lora_math_factor = 0;
  bool operator==(const MemoKey&) const = default;
};

struct MemoKeyHash {
  std::size_t operator()(const MemoKey& k) const {
    std::size_t h = std::hash<const void*>{}(k.spec);
    auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    mix(k.modules);
    mix(k.bytes);
    mix(static_cast<std::size_t>(k.flavor) << 16 | static_cast<std::size_t>(k.compute) << 8 |
        static_cast<std::size_t>(k.lora) << 1 | static_cast<std::size_t>(k.dequant_term));
    mix(std::hash<double>{}(k.lora_math_factor));
    return h;
  }
};

struct MemoEntry {
  // The key's address names this model only while it lives: the memo does not keep models alive
  // (a campaign makes a synthetic model per case and a shrinker a copy per candidate), and an
  // entry whose model has died is dropped when its address comes up again.
  std::weak_ptr<const ModelSpec> owner;
  std::uint64_t used = 0;  // last use, for eviction
  WalkOrder walk;
};

// At most this many orders, and this many modules over all of them, per thread (12 bytes each,
// 37 for a classic order, which also keeps its listed modules' bytes, costs and flags in walk
// order and each module's conversion copies: at most 74 MiB): a default campaign's catalog draws make
// about 1,500 keys (model x storage x compute dtype x LoRA x flavor) of a few hundred modules
// each; a 1,000,000-module model is cached alone.
constexpr std::size_t kMaxEntries = 4096;
constexpr std::size_t kMaxModules = std::size_t{1} << 21;

struct Memo {
  std::unordered_map<MemoKey, MemoEntry, MemoKeyHash> entries;
  std::size_t modules = 0;
  std::uint64_t clock = 0;
};

}  // namespace

const WalkOrder& memo_walk(const std::shared_ptr<const ModelSpec>& spec, WalkFlavor flavor, Dtype compute, bool lora,
                           const ComfyConstants& c, CallableRef<void(WalkOrder&)> build) {
  thread_local Memo memo;
  const std::size_t n = spec->modules.size();
  const MemoKey key{spec.get(), n, spec->bytes, flavor, compute, lora, c.dequant_term, c.lora_math_factor};
  ++memo.clock;
  if (const auto it = memo.entries.find(key); it != memo.entries.end()) {
    if (!it->second.owner.expired()) {
      it->second.used = memo.clock;
      return it->second.walk;
    }
    memo.modules -= n;  // another model at a dead one's address
    memo.entries.erase(it);
  }
  MemoEntry fresh;
  build(fresh.walk);  // may throw (a constant out of range): nothing is cached then
  fresh.owner = spec;
  fresh.used = memo.clock;
  // Make room: least recently used first (a scan, on a miss with the memo full; the orders of
  // dead models are never used again, so they go first).
  while (!memo.entries.empty() && (memo.entries.size() >= kMaxEntries || memo.modules + n > kMaxModules)) {
    const auto lru = std::min_element(memo.entries.begin(), memo.entries.end(),
                                      [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
    memo.modules -= lru->first.modules;
    memo.entries.erase(lru);
  }
  memo.modules += n;
  return memo.entries.emplace(key, std::move(fresh)).first->second.walk;
}

}  // namespace vf

// A memo of load-walk orders. Each load of a classic or dynamic model sorts its modules by
// offload cost, bytes and name (sort_walk), and the costs depend only on the model, its compute
// dtype, LoRA and two constants: a campaign draws its models from a catalog of a few hundred
// (model, storage) pairs, so the same order was sorted again for thousands of cases (a tenth of
// a campaign's time). The memo is per thread and bounded; a model is known by its address while
// it lives (a spec is immutable once finalized: scenario.h FingerprintMemo), and the memo does not
// keep it alive.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "harness/core/callable_ref.h"
#include "harness/scenario.h"

namespace vf {

struct WalkOrder {
  std::vector<std::uint32_t> order;  // the modules the walk lists, in its order
  std::vector<Bytes> cost;           // per module: the sort key's cost (0 where not listed, by flavor)
  // Classic: per walk position k, module order[k]'s cost and bytes. The walk's order is scattered
  // over the model (equal sizes recur a block apart), so reading cost[order[k]] and the module's
  // bytes was two cache misses per module in a large model; in walk order they stream.
  std::vector<Bytes> walk_cost;
  std::vector<Bytes> walk_bytes;
  std::vector<std::uint8_t> walk_flags;  // module order[k]'s module_flags (the cast hook), read there too
  // Classic: per module, the compute-dtype copies its offloaded forward allocates (the realistic
  // transient's conversion term), so a load need not read every offloaded module's tensors: at
  // 1,000,000 modules they were 52 MB of the planner's reads per case.
  std::vector<Bytes> convert;
};

enum class WalkFlavor : std::uint8_t { classic, dynamic };

// The order of `spec`'s walk under `flavor`, computed by `build` unless an equal key was
// computed before on this thread. The key is everything the order can depend on: the model
// (its pointer, module count and bytes: a model edited in place after its order was taken would
// not match), the compute dtype, LoRA, and the constants offload_cost reads. The reference is
// valid until the next call on this thread: copy what it holds.
const WalkOrder& memo_walk(const std::shared_ptr<const ModelSpec>& spec, WalkFlavor flavor, Dtype compute, bool lora,
                           const ComfyConstants& c, CallableRef<void(WalkOrder&)> build);

}  // namespace vf

// What the allocator-model tests share: a device of a given size with no context cost, and the
// model address of a live block.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "harness/sim/allocator.h"

namespace vf::sim::test {

inline DeviceSpec spec_of(Bytes total) {
  DeviceSpec s;
  s.total = total;
  s.context_overhead = 0;
  return s;
}

inline DeviceAddr addr_of(const Allocator& a, BlockKey key) {
  std::vector<BlockView> live;
  a.live_blocks(live);
  for (const BlockView& b : live) {
    if (b.key == key) return b.addr;
  }
  ADD_FAILURE() << "key " << key << " is not live";
  return 0;
}

}  // namespace vf::sim::test

// splitmix64: a fixed-seed stream of 64-bit values, identical on every machine. For tests and
// benches that generate their inputs (the models' own seeded choices live with them).
#pragma once

#include <cstdint>

namespace vf {

struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    state += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::uint64_t below(std::uint64_t n) { return next() % n; }
};

}  // namespace vf

#include "harness/cuda/ballast.h"

#include <algorithm>

#include <fmt/format.h>

namespace vf::cuda {

Status Ballast::fit(Bytes target, Bytes& free_at_start, Bytes& free_now) {
  Bytes total = 0;
  if (Status s = rt_.mem_get_info(free_now, total); !s) return s;
  free_at_start = free_now;
  // Free memory is measured after every change, never assumed from the sizes asked for: a driver
  // may charge a chunk more (or less) than its page-rounded size.
  // Too little free: give chunks back, newest first, until enough is free again.
  while (free_now < target && !chunks_.empty()) {
    const auto [p, size] = chunks_.back();
    chunks_.pop_back();
    bytes_ -= size;
    if (Status s = rt_.free(p); !s) return s;
    if (Status s = rt_.mem_get_info(free_now, total); !s) return s;
  }
  if (free_now < target) {
    return Status{Err::out_of_memory, 0, "ballast",
                  fmt::format("the device has {} free with no ballast left; emulating the scenario's card needs {} free",
                              format_mib(free_now), format_mib(target))};
  }
  // Too much free: add chunks sized from what is left, until less than a step is.
  Bytes cap = kBallastChunk;
  while (free_now - target >= kBallastStep) {
    const Bytes chunk = std::min(cap, (free_now - target) / kBallastStep * kBallastStep);
    if (chunk < kBallastStep) break;
    DevPtr p = 0;
    const Status s = rt_.malloc(p, chunk);
    if (s.err == Err::out_of_memory) {
      (void)rt_.last_error();
      cap = chunk / 2 / kBallastStep * kBallastStep;  // the largest allocation can be below free
      continue;
    }
    if (!s) return s;
    Bytes after = 0;
    if (Status st = rt_.mem_get_info(after, total); !st) return st;
    if (after >= free_now) {
      (void)rt_.free(p);
      return Status{Err::other, 0, "ballast",
                    fmt::format("cudaMalloc({}) did not lower the free memory ({} before, {} after): cannot emulate a card",
                                format_mib(chunk), format_mib(free_now), format_mib(after))};
    }
    if (after < target) {
      // It cost more than asked and went below the target: give it back, and ask for that
      // much less (in whole steps) next time.
      if (Status st = rt_.free(p); !st) return st;
      if (Status st = rt_.mem_get_info(free_now, total); !st) return st;
      const Bytes short_by = round_up(target - after, kBallastStep);
      if (chunk <= short_by) break;  // closer is not possible: free is within a step and a charge of the target
      cap = chunk - short_by;
      continue;
    }
    chunks_.emplace_back(p, chunk);
    bytes_ += chunk;
    free_now = after;
  }
  return ok_status();
}

void Ballast::release() {
  for (const auto& [p, size] : chunks_) (void)rt_.free(p);
  chunks_.clear();
  bytes_ = 0;
}

}  // namespace vf::cuda

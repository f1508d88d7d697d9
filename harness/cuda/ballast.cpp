#include "harness/cuda/ballast.h"

#include <algorithm>

#include <fmt/format.h>

namespace vf::cuda {

Status Ballast::fit(Bytes target, Bytes& free_at_start, Bytes& free_now) {
  Bytes total = 0;
  if (Status s = rt_.mem_get_info(free_now, total); !s) return s;
  free_at_start = free_now;
  // Too little free: give chunks back, newest first, until enough is free again.
  auto shrink = [&]() -> Status {
    while (free_now < target && !chunks_.empty()) {
      const auto [p, size] = chunks_.back();
      chunks_.pop_back();
      bytes_ -= size;
      if (Status s = rt_.free(p); !s) return s;
      free_now += size;
    }
    if (Status s = rt_.mem_get_info(free_now, total); !s) return s;
    if (free_now < target) {
      return Status{Err::out_of_memory, 0, "ballast",
                    fmt::format("the device has {} free with no ballast left; emulating the scenario's card "
                                "needs {} free",
                                format_mib(free_now), format_mib(target))};
    }
    return ok_status();
  };
  // Three rounds at most: the driver may charge a chunk a little differently than asked.
  for (int round = 0; round < 3; ++round) {
    if (free_now < target) {
      if (Status s = shrink(); !s) return s;
    }
    Bytes excess = (free_now - target) / kBallastStep * kBallastStep;
    if (excess == 0) return ok_status();
    Bytes chunk = std::min(excess, kBallastChunk);
    while (excess >= kBallastStep && chunk >= kBallastStep) {
      chunk = std::min(chunk, excess);
      DevPtr p = 0;
      const Status s = rt_.malloc(p, chunk);
      if (s.err == Err::out_of_memory) {
        (void)rt_.last_error();
        chunk = chunk / 2 / kBallastStep * kBallastStep;  // the largest allocation can be below free
        continue;
      }
      if (!s) return s;
      chunks_.emplace_back(p, chunk);
      bytes_ += chunk;
      excess -= chunk;
    }
    if (Status s = rt_.mem_get_info(free_now, total); !s) return s;
    if (free_now >= target && free_now - target < kBallastStep) return ok_status();
  }
  // As close as the driver allows; the caller records the free memory it got. Never less than
  // the target, though: a card smaller than the scenario's would turn into false OOMs.
  if (free_now < target) return shrink();
  return ok_status();
}

void Ballast::release() {
  for (const auto& [p, size] : chunks_) (void)rt_.free(p);
  chunks_.clear();
  bytes_ = 0;
}

}  // namespace vf::cuda

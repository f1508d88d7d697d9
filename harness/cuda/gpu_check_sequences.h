// Recorded allocation sequences for gpu-check's calibration (gpu_check_sequences.cpp): seeded
// programs of allocations and frees, what the simulator's raw device and async pool answer for
// them, and the calibration step that runs them on the device. The programs and the models are
// plain functions so the tests can replay a committed GPU recording (reports/gpu/) through the
// simulator without a GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/core/bytes.h"
#include "harness/cuda/gpu_check_detail.h"

namespace vf::cuda::detail {

// A band of request sizes, drawn log-uniformly in [lo, hi] and rounded down to `align`.
struct SizeBand {
  Bytes lo = 1;
  Bytes hi = 1;
  unsigned weight = 1;
  Bytes align = 1;
};

struct SeqSpec {
  std::string name;
  std::uint64_t seed = 0;
  std::uint32_t ops = 0;
  double alloc_probability = 0.6;  // while the live bytes stay under live_cap
  Bytes live_cap = 0;
  std::vector<SizeBand> bands;
};

// One step of a program: an allocation of `size`, or the free of the allocation made at op `of`.
struct SeqOp {
  bool alloc = true;
  Bytes size = 0;
  std::uint32_t of = 0;
};

std::vector<SeqOp> make_sequence(const SeqSpec& spec);
std::vector<SeqSpec> raw_sequence_specs(bool quick);
std::vector<SeqSpec> async_sequence_specs(bool quick);

// The simulator's answer after every op: the raw device's charged bytes (sim/device.cpp), and the
// async pool's reserved bytes at a growth step (one stream, release threshold UINT64_MAX).
std::vector<Bytes> model_raw_charges(const std::vector<SeqOp>& ops);
std::vector<Bytes> model_async_reserved(const std::vector<SeqOp>& ops, Bytes granularity);
// {ops, exact, max_abs_diff, first_mismatch {op, measured, model} | null}
Json compare_series(const std::vector<std::int64_t>& measured, const std::vector<Bytes>& model);

// The calibration step: sequences_raw, sequences_async, oom_probe, vmm_probe, each run through
// `step` (a failure of one is recorded and the others run).
using StepFn = std::function<void(const char*, const std::function<void()>&)>;
void calibration_sequences(CheckContext& c, const Deadline& dl, Stream s, Json& out, const StepFn& step);

}  // namespace vf::cuda::detail

// Inside the lowering: the classic lowerer (lower.cpp) owns the program being built and lowers
// the classic path; the dynamic lowering (lower_dynamic.cpp) lowers dynamic VRAM's stages into
// the same program through this interface. Not a public header.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "harness/lower.h"

namespace vf::lowering {

// Tensors the forward converts to the compute dtype (both lowerers: a resident or staged weight's
// upcast or dequantize, a LoRA's private copy where none is needed). Embedding tables are gathered,
// not converted whole (only the looked-up rows are cast: negligible); fp8 scales and buffers are
// read as they are.
inline bool converted(TensorRole role, Dtype dtype, Dtype compute) {
  return (role == TensorRole::weight || role == TensorRole::bias || role == TensorRole::norm) && needs_conversion(dtype, compute);
}

// An op on module `i` of model `m` (a compute op, a forced weight's h2d): both lowerers name the
// module, for the modelled time and the dynamic runtime. Filled in place in the program (see
// ProgramSink::push_op).
inline void module_op(Op& op, OpKind kind, Phase phase, std::uint32_t buffer, std::uint32_t m, std::uint32_t i) {
  op.kind = kind;
  op.phase = phase;
  op.buffer = buffer;
  op.model = static_cast<std::uint16_t>(m);
  op.module = i;
}

// What the dynamic lowering asks of the program being built.
class ProgramSink {
 public:
  virtual ~ProgramSink() = default;
  virtual Program& program() = 0;
  virtual std::uint16_t stage() const = 0;
  // A new op at the end of the program, default but for its stage (the sink's), to be filled in
  // place before the next is pushed. Not an Op built on the stack and passed by value: its fields'
  // narrow stores, read back as whole words by the copy, stalled store forwarding on every op (a
  // third of the dynamic forward's time).
  virtual Op& push_op() = 0;
  virtual std::uint32_t alloc(Phase ph, Bytes bytes, std::uint8_t stream, BufferKind kind, std::uint32_t model,
                              std::uint32_t module, std::uint32_t tensor, When when = When::always) = 0;
  virtual void free(Phase ph, std::uint32_t buffer, When when = When::always) = 0;
  // The forward conversions of module `i` of model `m` to its compute dtype (upcast / dequant,
  // scaled fp8's second copy), reading tensor t from src[t] (kNone: a VBAR slice or cast
  // buffer); appends the buffers to free after the compute to `temps`.
  virtual void convert_module(std::uint32_t m, std::uint32_t i, std::span<const std::uint32_t> src,
                              std::vector<std::uint32_t>& temps) = 0;
  // Whether a forward lowers its first pass only and repeats it (LowerOptions::repeat_passes).
  virtual bool repeat_passes() const = 0;
  // Appends `times` copies of the ops from `op_begin` and of the buffers from `buffer_begin` to
  // the end, copy c's references to those buffers moved c x (their count) on: the ops from
  // `op_begin` must reference no buffer made after them other than their own.
  virtual void repeat(std::uint32_t op_begin, std::uint32_t buffer_begin, std::uint32_t times) = 0;
};

// One buffer id per tensor of a model, flat: the tensors of module i are the model's
// [tensor_first[i], tensor_first[i + 1]) (the spec outlives the lowering that holds this).
// (A vector per module made lowering allocate once per module and case.)
class TensorSlots {
 public:
  void init(const ModelSpec& model) {
    (void)module_sizes(model);  // checks tensor_first against the modules
    first_ = &model.tensor_first;
    slot_.assign(first_->back(), kNone);
  }
  std::span<std::uint32_t> of(std::uint32_t module) {
    return {slot_.data() + (*first_)[module], slot_.data() + (*first_)[module + 1]};
  }
  std::span<const std::uint32_t> of(std::uint32_t module) const {
    return {slot_.data() + (*first_)[module], slot_.data() + (*first_)[module + 1]};
  }
  std::span<std::uint32_t> all() { return slot_; }

 private:
  const std::vector<std::uint32_t>* first_ = nullptr;
  std::vector<std::uint32_t> slot_;
};

// ModelPatcherDynamic's stages (lower_dynamic.cpp; docs/dynamic.md "Lowering").
class DynamicLowering {
 public:
  DynamicLowering(const Scenario& s, ProgramSink& out);
  // Staging: the VBAR prioritized, force-loaded tensors moved (after the classic lowerer has
  // done the load's evictions of legacy models).
  void load(const LoadPlan& lp);
  void forward(const StagePlan& sp);
  void unload(std::uint32_t m);
  // The end of a node (execution.py): cast buffers reset, watermark limits, soft_empty_cache.
  void node_end();

 private:
  struct Block {
    std::uint32_t first = 0;  // module range [first, last) in forward order, staged ones faulted together
    std::uint32_t last = 0;
    bool keyed = false;  // a block of the prefetch queue (its modules' names share a block key)
  };
  void fault(std::uint32_t m, std::uint32_t i, std::uint8_t flags);
  void unpin(std::uint32_t m, std::uint32_t i);
  void free_forced(std::uint32_t m);
  std::vector<Block> blocks(std::uint32_t m) const;

  const Scenario& s_;
  ProgramSink& out_;
  std::uint32_t ns_;
  std::vector<TensorSlots> forced_;  // [model]: per tensor, its torch buffer
  std::vector<const StagingPlan*> staging_;                      // per model: its current staging
  std::uint32_t torch_cast_k_ = 0;  // rotation of torch cast buffers over the offload streams
};

}  // namespace vf::lowering

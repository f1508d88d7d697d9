// Lowering of dynamic VRAM's stages (ModelPatcherDynamic + comfy/ops.py's cast_bias_weight under
// comfy-aimdo; reference/comfyui-dynamic-vram.md §2.1, §2.3; docs/dynamic.md "Lowering").
//
// Load: the model's VBAR goes to the top of aimdo's priority list (vbar_prioritize), and the
// force-loaded tensors (modules of 16 KiB or less, modules without the cast hook, fp8 scales,
// buffers) are moved to the device as torch tensors (LoRA merged into them as it is at a classic
// load). Nothing else is moved: staged weights are placed at run time.
// Forward, per pass (steps x CFG passes for a diffusion model), module by module in forward
// order:
//   - a staged module's slice is faulted (vbar_fault): pages still mapped with the serials of the
//     last copy are reused as they are; new pages get the copy; a refused fault sends the weight
//     through the offload stream's cast buffer instead (aimdo's VRAMBuffer), or, before aimdo's
//     cast buffers (feb2026) and with no offload stream, through a torch buffer of the slice's
//     size (an alloc whose op runs only `When::refused`);
//   - the conversion to the compute dtype (upcast, dequant, scaled fp8's second copy) is a plain
//     torch allocation, resident or not (post_cast converts every time);
//   - a LoRA runs on it while the module's copy is not resident (then the patched result is
//     rounded back into the VBAR copy, so a resident copy is pre-patched): its delta, and a
//     private compute copy when nothing was converted (`When::not_resident`);
//   - compute, the temporaries freed, and the slice unpinned (vbar_unpin).
// Models that prefetch (ModelRef::prefetch, with offload streams) fault every staged module of a
// block together before the block runs, at consecutive offsets of one cast buffer, and unpin them
// when the next block is popped.
#include <fmt/format.h>

#include "harness/lower_detail.h"

namespace vf::lowering {
namespace {

// The block a module belongs to, for prefetch: its name up to and including the first
// component that is a number ("double_blocks.3.img_mlp.0" -> "double_blocks.3"); a module with
// no such component is a block of its own (empty key).
std::string_view block_key(std::string_view name) {
  std::size_t start = 0;
  while (start < name.size()) {
    std::size_t end = name.find('.', start);
    if (end == std::string_view::npos) end = name.size();
    const std::string_view part = name.substr(start, end - start);
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string_view::npos) return name.substr(0, end);
    start = end + 1;
  }
  return {};
}

}  // namespace

DynamicLowering::DynamicLowering(const Scenario& s, ProgramSink& out)
    : s_(s), out_(out), ns_(s.streams()), forced_(s.models.size()), staging_(s.models.size(), nullptr) {}

void DynamicLowering::free_forced(std::uint32_t m) {
  for (std::uint32_t& b : forced_[m].all()) {
    if (b != kNone) out_.free(Phase::unload, b);
    b = kNone;
  }
}

void DynamicLowering::load(const LoadPlan& lp) {
  const std::uint32_t m = lp.model;
  const ModelRef& ref = s_.models[m];
  const ModelSpec& model = *ref.spec;
  const StagingPlan& st = lp.staging;
  const ComfyConstants& c = s_.policy.constants;
  // restore_loaded_backups: the force-loaded copies of an earlier load go first.
  free_forced(m);
  forced_[m].init(model);
  staging_[m] = &st;
  VbarLayout& layout = out_.program().vbars[m];
  layout.dynamic = true;
  layout.request = st.vbar_request;
  layout.offset = st.slice_offset;
  layout.size = st.slice_size;
  Op& prio = out_.push_op();
  prio.kind = OpKind::vbar_prioritize;
  prio.phase = Phase::load;
  prio.model = static_cast<std::uint16_t>(m);
  // The walk's modules in its order, then those outside it (containers' own parameters, modules of
  // buffers only), all moved now.
  std::vector<std::uint32_t> moved = st.order;
  std::vector<std::uint8_t> in_walk(model.modules.size(), 0);
  for (const std::uint32_t i : st.order) in_walk[i] = 1;
  for (std::uint32_t i = 0; i < model.modules.size(); ++i) {
    if (!in_walk[i]) moved.push_back(i);
  }
  // From the model's flat arrays (checked by forced_[m].init): in walk order the modules are
  // scattered, and a Module and each of its Tensors were a cache miss apiece.
  const std::uint32_t* const tensor_first = model.tensor_first.data();
  const FlatTensor* const tensors = model.tensors_flat.data();
  for (const std::uint32_t i : moved) {
    bool patched = false;
    const std::uint32_t first = tensor_first[i], count = tensor_first[i + 1] - first;
    for (std::uint32_t t = 0; t < count; ++t) {
      const FlatTensor& tensor = tensors[first + t];
      if (!st.forced_module[i] && staged_role(tensor.role)) continue;  // lives in the VBAR slice
      const std::uint32_t b = out_.alloc(Phase::load, tensor.bytes, 0, BufferKind::weight, m, i, t);
      module_op(out_.push_op(), OpKind::h2d, Phase::load, b, m, i);
      forced_[m].of(i)[t] = b;
      // patch_weight_to_device: a force-loaded weight with a LoRA is patched now, through a copy
      // and a result in the LoRA dtype, rounded back into the stored weight.
      if (ref.lora && tensor.role == TensorRole::weight) {
        const Bytes bytes = tensor.numel * compute_elem_bytes(c.lora_patch_dtype);
        const std::uint32_t copy = out_.alloc(Phase::patch, bytes, 0, BufferKind::lora, m, i, t);
        const std::uint32_t result = out_.alloc(Phase::patch, bytes, 0, BufferKind::lora, m, i, t);
        out_.free(Phase::patch, copy);
        out_.free(Phase::patch, result);
        patched = true;
      }
    }
    if (patched && c.patch_sync) {
      Op& sync = out_.push_op();
      sync.kind = OpKind::sync;
      sync.phase = Phase::patch;
    }
  }
}

void DynamicLowering::fault(std::uint32_t m, std::uint32_t i, std::uint8_t flags) {
  Op& op = out_.push_op();
  op.kind = OpKind::vbar_fault;
  op.phase = Phase::forward;
  op.flags = flags;
  op.model = static_cast<std::uint16_t>(m);
  op.module = i;
}

void DynamicLowering::unpin(std::uint32_t m, std::uint32_t i) {
  Op& op = out_.push_op();
  op.kind = OpKind::vbar_unpin;
  op.phase = Phase::forward;
  op.model = static_cast<std::uint16_t>(m);
  op.module = i;
}

std::vector<DynamicLowering::Block> DynamicLowering::blocks(std::uint32_t m) const {
  const ModelSpec& model = *s_.models[m].spec;
  std::vector<Block> out;
  const std::uint32_t n = static_cast<std::uint32_t>(model.modules.size());
  for (std::uint32_t i = 0; i < n;) {
    const std::string_view key = block_key(model.modules[i].name);
    std::uint32_t j = i + 1;
    if (!key.empty()) {
      while (j < n && block_key(model.modules[j].name) == key) ++j;
    }
    out.push_back(Block{i, j, !key.empty()});
    i = j;
  }
  return out;
}

void DynamicLowering::forward(const StagePlan& sp) {
  const std::uint32_t m = sp.model;
  const ModelRef& ref = s_.models[m];
  const ModelSpec& model = *ref.spec;
  const StagingPlan& st = *staging_[m];
  const DynamicConstants& d = s_.policy.constants.dynamic;
  // Without aimdo's cast buffers (feb2026) or without an offload stream, a refused weight comes
  // through a torch buffer of the slice's size.
  const bool torch_cast = !d.aimdo_cast_buffers || ns_ == 0;
  const bool prefetch = ref.prefetch && ns_ > 0;  // make_prefetch_queue needs offload streams
  const std::uint32_t passes = sp.passes * (model.kind == ModelKind::diffusion ? s_.workload.steps : 1);
  const std::vector<Block> groups = prefetch ? blocks(m) : std::vector<Block>{};
  auto staged = [&](std::uint32_t i) { return st.slice_size[i] != 0; };

  // Reused module after module and pass after pass (their capacity stays).
  std::vector<std::uint32_t> temps, lora_temps, src;
  std::vector<std::uint32_t> pinned;  // the prefetched block's staged modules, unpinned at the next pop
  // What a pass leaves behind for the next is the torch cast buffers' rotation over the offload
  // streams: where the first pass turned it by a whole number of rounds, the others emit what it
  // did on buffers of their own, and are its copies (LowerOptions::repeat_passes).
  const auto op_begin = static_cast<std::uint32_t>(out_.program().ops.size());
  const auto buffer_begin = static_cast<std::uint32_t>(out_.program().buffers.size());
  const std::uint32_t cast_k_before = torch_cast_k_;
  for (std::uint32_t pass = 0; pass < passes; ++pass) {
    if (pass == 1 && out_.repeat_passes()) {
      const std::uint32_t turned = torch_cast_k_ - cast_k_before;
      if (!torch_cast || ns_ <= 1 || turned % ns_ == 0) {
        out_.repeat(op_begin, buffer_begin, passes - 1);
        torch_cast_k_ += turned * (passes - 1);
        break;
      }
    }
    const std::uint32_t act = out_.alloc(Phase::forward, sp.activation_bytes, 0, BufferKind::activation, m, kNone, kNone);
    std::size_t g = 0;                  // the prefetch block of the module being run
    std::size_t faulted = ~std::size_t{0};  // the block last faulted
    pinned.clear();
    for (std::uint32_t i = 0; i < model.modules.size(); ++i) {
      temps.clear();
      if (!staged(i)) {
        // Force-loaded: an ordinary resident torch tensor, converted like a classic resident
        // module (modules without the cast hook use their raw parameters as they are).
        if ((model.module_flags[i] & kModuleCastHook) != 0) out_.convert_module(m, i, forced_[m].of(i), temps);
        module_op(out_.push_op(), OpKind::compute, Phase::forward, act, m, i);
        for (std::uint32_t b : temps) out_.free(Phase::forward, b);
        continue;
      }
      if (prefetch) {
        while (groups[g].last <= i) ++g;
      }
      if (prefetch && groups[g].keyed) {
        // prefetch_queue_pop: the consumed block is unpinned, then this block's staged modules
        // are faulted together.
        if (faulted != g) {
          for (const std::uint32_t p : pinned) unpin(m, p);
          pinned.clear();
          for (std::uint32_t k = groups[g].first; k < groups[g].last; ++k) {
            if (staged(k)) pinned.push_back(k);
          }
          for (std::size_t k = 0; k < pinned.size(); ++k) {
            fault(m, pinned[k], static_cast<std::uint8_t>((k == 0 ? kFaultGroupStart : 0) | (pinned.size() == 1 ? kFaultSingle : 0)));
          }
          faulted = g;
        }
      } else {
        // Outside the queue (or no prefetch): the module alone, unpinned after its compute; a
        // block still pinned is popped first.
        for (const std::uint32_t p : pinned) unpin(m, p);
        pinned.clear();
        fault(m, i, kFaultGroupStart | kFaultSingle);
      }
      // The weight's source: the VBAR slice or aimdo's cast buffer (no torch buffer), or a torch
      // buffer when the fault is refused and there is no aimdo cast buffer.
      std::uint32_t cast_buf = kNone;
      std::uint8_t cast_stream = 0;
      if (torch_cast) {
        cast_stream = ns_ == 0 ? 0 : static_cast<std::uint8_t>(1 + torch_cast_k_++ % ns_);
        cast_buf = out_.alloc(Phase::forward, st.slice_size[i], cast_stream, BufferKind::transfer, m, i, kNone, When::refused);
        Op& h2d = out_.push_op();
        h2d.kind = OpKind::h2d;
        h2d.phase = Phase::forward;
        h2d.stream = cast_stream;
        h2d.buffer = cast_buf;
        h2d.when = When::refused;
        h2d.model = static_cast<std::uint16_t>(m);
        h2d.module = i;
        if (cast_stream != 0) {
          Op& wait = out_.push_op();
          wait.kind = OpKind::wait;
          wait.phase = Phase::forward;
          wait.target = cast_stream;
        }
      }
      src.assign(model.tensor_first[i + 1] - model.tensor_first[i], kNone);
      out_.convert_module(m, i, src, temps);
      lora_temps.clear();
      if (ref.lora) {
        // LowVramPatch on a copy that is not resident: the delta, added to the converted weight
        // (or to a private compute copy when the weight needed no conversion).
        const std::uint32_t first = model.tensor_first[i], count = model.tensor_first[i + 1] - first;
        for (std::uint32_t t = 0; t < count; ++t) {
          const FlatTensor& tensor = model.tensors_flat[first + t];
          if (tensor.role != TensorRole::weight) continue;
          const Bytes bytes = tensor.numel * compute_elem_bytes(ref.compute);
          if (!converted(tensor.role, tensor.dtype, ref.compute)) {
            lora_temps.push_back(out_.alloc(Phase::forward, bytes, 0, BufferKind::lora, m, i, t, When::not_resident));
          }
          lora_temps.push_back(out_.alloc(Phase::forward, bytes, 0, BufferKind::lora, m, i, t, When::not_resident));
        }
      }
      module_op(out_.push_op(), OpKind::compute, Phase::forward, act, m, i);
      for (std::uint32_t b : temps) out_.free(Phase::forward, b);
      for (std::uint32_t b : lora_temps) out_.free(Phase::forward, b, When::not_resident);
      if (cast_buf != kNone) {
        if (cast_stream != 0) {
          Op& wait = out_.push_op();
          wait.kind = OpKind::wait;
          wait.phase = Phase::forward;
          wait.stream = cast_stream;
          wait.target = 0;
        }
        out_.free(Phase::forward, cast_buf, When::refused);
      }
      if (pinned.empty()) unpin(m, i);
    }
    for (const std::uint32_t p : pinned) unpin(m, p);  // the queue's last pop
    out_.free(Phase::forward, act);
  }
}

void DynamicLowering::unload(std::uint32_t m) {
  // partially_unload(everything): the VBAR's pages from its top, then the force-loaded copies.
  Op& op = out_.push_op();
  op.kind = OpKind::vbar_free;
  op.phase = Phase::unload;
  op.model = static_cast<std::uint16_t>(m);
  op.src = static_cast<std::uint32_t>(out_.program().amounts.size());
  out_.program().amounts.push_back(~Bytes{0} >> 1);
  free_forced(m);
  Op& flush = out_.push_op();
  flush.kind = OpKind::empty_cache;
  flush.phase = Phase::unload;
}

void DynamicLowering::node_end() {
  Op& op = out_.push_op();
  op.kind = OpKind::node_end;
  op.phase = Phase::forward;
}

}  // namespace vf::lowering

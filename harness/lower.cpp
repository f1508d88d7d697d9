#include "harness/lower.h"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/core/recycle.h"
#include "harness/lower_detail.h"
#include "models/activation.h"

namespace vf {

std::string_view op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::alloc: return "alloc";
    case OpKind::free: return "free";
    case OpKind::h2d: return "h2d";
    case OpKind::upcast: return "upcast";
    case OpKind::dequant: return "dequant";
    case OpKind::compute: return "compute";
    case OpKind::wait: return "wait";
    case OpKind::sync: return "sync";
    case OpKind::empty_cache: return "empty_cache";
    case OpKind::flush_if_cached: return "flush_if_cached";
    case OpKind::vbar_prioritize: return "vbar_prioritize";
    case OpKind::vbar_fault: return "vbar_fault";
    case OpKind::vbar_unpin: return "vbar_unpin";
    case OpKind::vbar_free: return "vbar_free";
    case OpKind::node_end: return "node_end";
  }
  return "?";
}

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::load: return "load";
    case Phase::patch: return "patch";
    case Phase::forward: return "forward";
    case Phase::evict: return "evict";
    case Phase::unload: return "unload";
  }
  return "?";
}

std::string_view buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::weight: return "weight";
    case BufferKind::transfer: return "transfer";
    case BufferKind::convert: return "convert";
    case BufferKind::scaled: return "scaled";
    case BufferKind::lora: return "lora";
    case BufferKind::activation: return "activation";
  }
  return "?";
}

namespace {

// How far ahead a loop over a scattered order (the load walk's) starts its reads.
constexpr std::size_t kPrefetch = 8;

// The tensors of the modules a classic load walk lists, in walk order: where the walk lists
// 1,000,000 modules, reading each one's tensor_first and tensors_flat entries in its order was
// two or three cache misses per module, half the load's time (bench/scale_case.cpp). Gathered once
// per model and walk (from the walk's second lowering on a thread), they are read in sequence.
struct WalkTensors {
  struct Place {
    std::uint32_t first;  // the module's first tensor in the model's flat tables (and its slots)
    std::uint32_t count;
  };
  // What the gather was made from: the model (its address names it only while it lives, as in
  // the walk memo; its module count and bytes, as there) and the walk.
  std::weak_ptr<const ModelSpec> owner;
  const ModelSpec* spec = nullptr;
  std::size_t modules = 0;
  Bytes model_bytes = 0;
  std::vector<std::uint32_t> order;
  bool filled = false;       // the two below hold the gather (else the walk was met once)
  std::vector<Place> place;  // per walk position
  std::vector<Bytes> bytes;  // the listed modules' tensors' bytes, module after module in walk order
};

// The gather for `spec`'s walk `order`, or none. A lowering that meets a model and walk for the
// first time on this thread only notes them and reads the model's tables (nullptr): made then,
// the gather would read the model in walk order once more, and a model lowered once (a shrinker's
// candidate) would pay for it, 9 ns a module at 1,000,000 modules. The same model and walk met
// again (compared whole: an external predictor may order the same model differently) are
// gathered then and from then on. A thread keeps one, the last: 12 bytes per listed module and 8
// per tensor of theirs (28 MB for the scale bench's 1,000,000 modules of two tensors each), held
// until the thread ends.
const WalkTensors* walk_tensors(const std::shared_ptr<const ModelSpec>& spec, const std::vector<std::uint32_t>& order) {
  thread_local WalkTensors g;
  const ModelSpec& model = *spec;
  if (!(g.spec == &model && !g.owner.expired() && g.modules == model.modules.size() && g.model_bytes == model.bytes && g.order == order)) {
    g.spec = nullptr;  // keyed only once whole: a copy that throws leaves no match behind
    g.filled = false;
    g.order = order;
    g.owner = spec;
    g.modules = model.modules.size();
    g.model_bytes = model.bytes;
    g.spec = &model;
    return nullptr;
  }
  if (g.filled) return &g;
  g.spec = nullptr;  // as above, for the fill
  g.place.resize(order.size());
  g.bytes.clear();
  const std::size_t n = order.size();
  for (std::size_t k = 0; k < n; ++k) {
    if (k + 2 * kPrefetch < n) __builtin_prefetch(&model.tensor_first[order[k + 2 * kPrefetch]]);
    if (k + kPrefetch < n) __builtin_prefetch(model.tensors_flat.data() + model.tensor_first[order[k + kPrefetch]]);
    const std::uint32_t i = order[k], first = model.tensor_first[i], count = model.tensor_first[i + 1] - first;
    g.place[k] = WalkTensors::Place{first, count};
    for (std::uint32_t t = 0; t < count; ++t) g.bytes.push_back(model.tensors_flat[first + t].bytes);
  }
  g.filled = true;
  g.spec = &model;
  return &g;
}

OpKind conversion_kind(Dtype storage) {
  const DtypeInfo& i = dtype_info(storage);
  return i.gguf_quantized || storage == Dtype::int8 ? OpKind::dequant : OpKind::upcast;
}

class Lowerer final : public lowering::ProgramSink {
 public:
  Lowerer(const Scenario& s, const Plan& plan, const LowerOptions& options)
      : s_(s), plan_(plan), options_(options), ns_(s.streams()), dynamic_(s, *this) {
    weights_.resize(s.models.size());
    resident_.resize(s.models.size());
    lowvram_.resize(s.models.size());
    for (std::size_t m = 0; m < s.models.size(); ++m) {
      const auto& mods = s.models[m].spec->modules;
      weights_[m].init(*s.models[m].spec);
      resident_[m].assign(mods.size(), 0);
      lowvram_[m].assign(mods.size(), 0);
    }
    prog_.streams = 1 + ns_;
    prog_.dynamic = plan.dynamic;
    if (prog_.dynamic) prog_.vbars.resize(s.models.size());
  }

  Program run() {
    reserve();
    for (std::uint32_t i = 0; i < s_.stages.size(); ++i) {
      stage_ = static_cast<std::uint16_t>(i);
      prog_.stage_begin.push_back(static_cast<std::uint32_t>(prog_.ops.size()));
      const Stage& st = s_.stages[i];
      const StagePlan& sp = plan_.stages[i];
      const bool dynamic = s_.dynamic_model(st.model);
      switch (st.op) {
        case StageOp::load: {
          const LoadPlan& lp = plan_.loads[static_cast<std::size_t>(sp.load_plan)];
          if (!dynamic) {
            load(lp);
            break;
          }
          evict(lp);
          dynamic_.load(lp);
          break;
        }
        case StageOp::forward:
          if (dynamic) dynamic_.forward(sp);
          else forward(sp);
          // Under dynamic VRAM every node ends by resetting aimdo's cast buffers (legacy nodes too).
          if (prog_.dynamic) dynamic_.node_end();
          break;
        case StageOp::unload:
          if (dynamic) dynamic_.unload(st.model);
          else unload(st.model);
          break;
      }
    }
    // The rows each module's matmuls run over in one pass, for the modelled compute time.
    prog_.stage_rows.resize(s_.stages.size());
    for (std::size_t i = 0; i < s_.stages.size(); ++i) {
      const StagePlan& sp = plan_.stages[i];
      const ModelSpec& m = *s_.models[sp.model].spec;
      prog_.stage_rows[i] = activation_positions(m, s_.workload) * (m.kind == ModelKind::text_encoder ? 1 : sp.run_batch);
    }
    return std::move(prog_);
  }

  // One allocation up front for the ops and buffers, from what each stage emits at most per
  // tensor and module: growing vectors of thousands of ops, page by fresh page, was an eighth of a
  // classic case's time (bench/bench_pipeline.cpp). A hint only: the vectors still grow past it.
  void reserve() {
    std::size_t ops = 64, buffers = 64;
    for (std::uint32_t i = 0; i < s_.stages.size(); ++i) {
      const ModelSpec& m = *s_.models[s_.stages[i].model].spec;
      const std::size_t tensors = m.tensor_first.empty() ? 0 : m.tensor_first.back();
      const std::size_t mods = m.modules.size();
      switch (s_.stages[i].op) {
        case StageOp::load:
          ops += 4 * tensors + 2 * mods;
          buffers += tensors;
          break;
        case StageOp::forward: {
          const std::size_t passes = std::size_t{plan_.stages[i].passes} * (m.kind == ModelKind::diffusion ? s_.workload.steps : 1);
          ops += passes * (4 * tensors + 4 * mods) + 16;
          buffers += passes * (tensors + mods) + 8;
          break;
        }
        default: ops += 2 * mods + 4; break;
      }
    }
    // At most 16 M ops (384 MiB of address space; only the pages the ops fill are touched): a
    // 1,000,000-module text encoder lowers to 10 M, and growing past a smaller cap copied them all.
    constexpr std::size_t kCap = std::size_t{1} << 24;
    recycle_reserve(prog_.ops, std::min(ops, kCap));
    recycle_reserve(prog_.buffers, std::min(buffers, kCap));
  }

  // ProgramSink (the dynamic lowering builds into this program).
  Program& program() override { return prog_; }
  std::uint16_t stage() const override { return stage_; }
  Op& push_op() override {
    Op& op = prog_.ops.emplace_back();
    op.stage = stage_;
    return op;
  }
  std::uint32_t alloc(Phase ph, Bytes bytes, std::uint8_t stream, BufferKind kind, std::uint32_t model, std::uint32_t module,
                      std::uint32_t tensor, When when) override {
    const std::uint32_t b = new_buffer(bytes, stream, kind, model, module, tensor);
    Op& op = push_op();
    op.kind = OpKind::alloc;
    op.phase = ph;
    op.stream = stream;
    op.buffer = b;
    op.when = when;
    op.model = static_cast<std::uint16_t>(model);
    op.module = module;
    return b;
  }
  void free(Phase ph, std::uint32_t b, When when) override {
    const Buffer& buf = prog_.buffers[b];
    Op& op = push_op();
    op.kind = OpKind::free;
    op.phase = ph;
    op.stream = buf.stream;
    op.buffer = b;
    op.when = when;
    op.model = buf.model;
    op.module = buf.module;
  }
  void convert_module(std::uint32_t m, std::uint32_t i, std::span<const std::uint32_t> src,
                      std::vector<std::uint32_t>& temps) override {
    convert(m, i, src, temps, false);
  }
  bool repeat_passes() const override { return options_.repeat_passes; }
  void repeat(std::uint32_t op_begin, std::uint32_t buffer_begin, std::uint32_t times) override {
    std::vector<Op>& ops = prog_.ops;
    std::vector<Buffer>& bufs = prog_.buffers;
    const std::size_t op_end = ops.size(), buffer_end = bufs.size();
    const std::size_t n_ops = op_end - op_begin, n_bufs = buffer_end - buffer_begin;
    // Buffer ids are 32 bits, kNone excluded: a program that would need more is refused whole.
    if (buffer_end + n_bufs * times >= kNone) throw InfraError("lowering: a program of more than 4 G buffers");
    // Grown geometrically, like the per-pass lowering's push_backs (reserve alone sizes exactly).
    const auto grow = [](auto& v, std::size_t need) {
      if (need > v.capacity()) v.reserve(std::max(need, 2 * v.capacity()));
    };
    grow(ops, op_end + n_ops * times);
    grow(bufs, buffer_end + n_bufs * times);
    for (std::uint32_t c = 1; c <= times; ++c) {
      const auto shift = static_cast<std::uint32_t>(c * n_bufs);
      for (std::size_t k = op_begin; k < op_end; ++k) {
        Op op = ops[k];
        if (op.buffer != kNone && op.buffer >= buffer_begin) op.buffer += shift;
        // A vbar_free's src is an index into the amounts, not a buffer (none is in a forward).
        if (op.kind != OpKind::vbar_free && op.src != kNone && op.src >= buffer_begin) op.src += shift;
        ops.push_back(op);
      }
      for (std::size_t k = buffer_begin; k < buffer_end; ++k) bufs.push_back(bufs[k]);  // within the reservation
    }
  }

 private:
  std::uint32_t new_buffer(Bytes bytes, std::uint8_t stream, BufferKind kind, std::uint32_t model, std::uint32_t module,
                           std::uint32_t tensor) {
    prog_.buffers.push_back(Buffer{bytes, stream, kind, static_cast<std::uint16_t>(model), module, tensor});
    return static_cast<std::uint32_t>(prog_.buffers.size() - 1);
  }
  void emit(OpKind k, Phase ph, std::uint8_t stream, std::uint32_t buffer = kNone, std::uint32_t src = kNone,
            std::uint8_t target = 0) {
    Op& op = push_op();
    op.kind = k;
    op.phase = ph;
    op.stream = stream;
    op.target = target;
    op.buffer = buffer;
    op.src = src;
    if (buffer != kNone) {
      op.model = prog_.buffers[buffer].model;
      op.module = prog_.buffers[buffer].module;
    }
  }
  std::uint32_t alloc(Phase ph, Bytes bytes, std::uint8_t stream, BufferKind kind, std::uint32_t model,
                      std::uint32_t module, std::uint32_t tensor) {
    return alloc(ph, bytes, stream, kind, model, module, tensor, When::always);
  }
  void free(Phase ph, std::uint32_t b) { free(ph, b, When::always); }

  // Back to host memory. From then on a cast-hook module is cast on the fly (ComfyUI's
  // partially_unload marks it so); a raw one is read where it is.
  void unload_module(Phase ph, std::uint32_t m, std::uint32_t mod) {
    for (std::uint32_t& b : weights_[m].of(mod)) {
      if (b != kNone) free(ph, b);
      b = kNone;
    }
    resident_[m][mod] = 0;
    lowvram_[m][mod] = (s_.models[m].spec->module_flags[mod] & kModuleCastHook) != 0 ? 1 : 0;
  }

  void move_to_device(std::uint32_t m, std::uint32_t i) {
    // The tensors' bytes from the model's flat array (the Tensor structs are cold in a large model).
    const ModelSpec& spec = *s_.models[m].spec;
    const std::uint32_t first = spec.tensor_first[i];
    move_to_device(m, i, first, spec.tensor_first[i + 1] - first, [&](std::uint32_t t) { return spec.tensors_flat[first + t].bytes; });
  }
  // Module i's `count` tensors, the model's [first, first + count), of bytes bytes_of(t).
  template <class BytesOf>
  void move_to_device(std::uint32_t m, std::uint32_t i, std::uint32_t first, std::uint32_t count, BytesOf bytes_of) {
    std::uint32_t* const slots = weights_[m].all().data() + first;
    for (std::uint32_t t = 0; t < count; ++t) {
      const std::uint32_t b = alloc(Phase::load, bytes_of(t), 0, BufferKind::weight, m, i, t);
      emit(OpKind::h2d, Phase::load, 0, b);
      slots[t] = b;
    }
    resident_[m][i] = 1;
  }

  // Evictions to make room (smart memory partial unloads), then ComfyUI's soft_empty_cache.
  void evict(const LoadPlan& lp) {
    for (const Eviction& ev : lp.evictions) {
      for (std::uint32_t mod : ev.modules) unload_module(Phase::evict, ev.model, mod);
    }
    if (!lp.evictions.empty()) emit(OpKind::empty_cache, Phase::evict, 0);
    else emit(OpKind::flush_if_cached, Phase::load, 0);
    // Next to dynamic models, free_memory also has them give up VBAR pages until the target is free.
    if (lp.free_target != 0) {
      Op& op = push_op();
      op.kind = OpKind::vbar_free;
      op.phase = Phase::evict;
      op.flags = kVbarFreeToTarget;
      op.src = static_cast<std::uint32_t>(prog_.amounts.size());
      prog_.amounts.push_back(lp.free_target);
    }
  }

  void load(const LoadPlan& lp) {
    evict(lp);

    const std::uint32_t m = lp.model;
    const ModelRef& ref = s_.models[m];
    const ModelSpec& model = *ref.spec;
    const ComfyConstants& c = s_.policy.constants;
    // A re-load that shrinks the resident set unloads first.
    for (std::uint32_t i = 0; i < model.modules.size(); ++i) {
      if (resident_[m][i] && !lp.resident[i]) unload_module(Phase::load, m, i);
    }
    lowvram_[m] = lp.lowvram;
    // Resident modules are moved in the walk's order; LoRA is merged right after each module
    // arrives: a compute copy of the weight and the patched result in the patch dtype, then the
    // result is rounded back into the stored weight (the backup lives on the host).
    const std::size_t n = lp.sorted.size();
    // In a large model, the listed modules' tensors gathered in walk order (walk_tensors).
    const WalkTensors* const gathered = n >= options_.gather_walk_min ? walk_tensors(ref.spec, lp.sorted) : nullptr;
    std::size_t at = 0;  // with `gathered`: the walk position's first tensor in gathered->bytes
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint32_t i = lp.sorted[k];
      // The walk's order is scattered over the model: in a large one every module's fields are a
      // cache miss, so the reads of the modules kPrefetch and 2 x kPrefetch places ahead are
      // started now (the nearer one's tensors through its tensor_first, read by then, where they
      // were not gathered).
      if (k + 2 * kPrefetch < n) {
        const std::uint32_t far = lp.sorted[k + 2 * kPrefetch];
        if (!gathered) __builtin_prefetch(&model.tensor_first[far]);
        __builtin_prefetch(&lp.resident[far]);
        __builtin_prefetch(&resident_[m][far]);
      }
      if (k + kPrefetch < n) {
        if (gathered) {
          const std::uint32_t first = gathered->place[k + kPrefetch].first;
          if (ref.lora) __builtin_prefetch(model.tensors_flat.data() + first);  // the patch reads the tensors
          __builtin_prefetch(weights_[m].all().data() + first, 1);
        } else {
          const std::uint32_t first = model.tensor_first[lp.sorted[k + kPrefetch]];
          __builtin_prefetch(model.tensors_flat.data() + first);  // may be one past the end: a prefetch never faults
          __builtin_prefetch(weights_[m].all().data() + first, 1);
        }
      }
      std::uint32_t first, count;  // module i's tensors in the model's flat tables
      if (gathered) {
        const WalkTensors::Place p = gathered->place[k];
        const Bytes* const bytes = gathered->bytes.data() + at;
        at += p.count;
        if (!lp.resident[i] || resident_[m][i]) continue;
        first = p.first;
        count = p.count;
        move_to_device(m, i, first, count, [bytes](std::uint32_t t) { return bytes[t]; });
      } else {
        if (!lp.resident[i] || resident_[m][i]) continue;
        first = model.tensor_first[i];
        count = model.tensor_first[i + 1] - first;
        move_to_device(m, i);
      }
      if (!ref.lora) continue;
      bool patched = false;
      const std::uint32_t* const slots = weights_[m].all().data() + first;
      for (std::uint32_t t = 0; t < count; ++t) {
        const FlatTensor& tensor = model.tensors_flat[first + t];
        if (tensor.role != TensorRole::weight) continue;
        const Bytes bytes = tensor.numel * compute_elem_bytes(c.lora_patch_dtype);
        const std::uint32_t copy = alloc(Phase::patch, bytes, 0, BufferKind::lora, m, i, t);
        emit(conversion_kind(tensor.dtype), Phase::patch, 0, copy, slots[t]);
        const std::uint32_t result = alloc(Phase::patch, bytes, 0, BufferKind::lora, m, i, t);
        emit(OpKind::compute, Phase::patch, 0, result, copy);
        free(Phase::patch, copy);
        free(Phase::patch, result);
        patched = true;
      }
      if (patched && c.patch_sync) emit(OpKind::sync, Phase::patch, 0);
    }
    // Then a full load's model.to(device) moves what the walk does not list (containers of raw
    // tensors, modules of buffers), in forward order and unpatched.
    for (std::uint32_t i = 0; i < model.modules.size(); ++i) {
      if (lp.resident[i] && !resident_[m][i]) move_to_device(m, i);
    }
  }

  // Allocates and converts the parameters of module `i` that differ from the compute dtype,
  // reading from `src[t]` (resident weight or transfer buffer); returns the buffers to free after
  // compute. With `patched` (a LoRA applied at forward time) every weight gets a private
  // compute-dtype copy even when no conversion is needed: the patch is added to it in place.
  // ComfyUI's scaled-fp8 layers upcast the stored weight to the compute dtype and then multiply by
  // the scale out of place, so for a moment the plain upcast copy and the scaled result are both
  // alive: two compute-size buffers per scaled weight, where an unscaled upcast or a GGUF
  // dequantize (which writes the compute dtype directly) needs one.
  void convert(std::uint32_t m, std::uint32_t i, std::span<const std::uint32_t> src, std::vector<std::uint32_t>& temps,
               bool patched = false) {
    const ModelRef& ref = s_.models[m];
    const ModelSpec& spec = *ref.spec;
    const bool scaled = (spec.module_flags[i] & kModuleScaled) != 0;
    const std::uint32_t first = spec.tensor_first[i], count = spec.tensor_first[i + 1] - first;
    for (std::uint32_t t = 0; t < count; ++t) {
      const FlatTensor& tensor = spec.tensors_flat[first + t];
      if (!lowering::converted(tensor.role, tensor.dtype, ref.compute) && !(patched && tensor.role == TensorRole::weight)) continue;
      const Bytes bytes = tensor.numel * compute_elem_bytes(ref.compute);
      const std::uint32_t copy = alloc(Phase::forward, bytes, 0, BufferKind::convert, m, i, t);
      emit(conversion_kind(tensor.dtype), Phase::forward, 0, copy, src[t]);
      const DtypeInfo& di = dtype_info(tensor.dtype);
      if (scaled && tensor.role == TensorRole::weight && (di.fp8 || tensor.dtype == Dtype::int8)) {
        const std::uint32_t result = alloc(Phase::forward, bytes, 0, BufferKind::scaled, m, i, t);
        emit(OpKind::upcast, Phase::forward, 0, result, copy);
        free(Phase::forward, copy);
        temps.push_back(result);
      } else {
        temps.push_back(copy);
      }
    }
  }

  // Issues the transfer of offloaded module `i` (k-th offloaded module in forward order) on its
  // offload stream (the compute stream when there are none).
  // Into `bufs` (its capacity kept from earlier passes).
  void issue_transfer(std::uint32_t m, std::uint32_t i, std::size_t k, std::vector<std::uint32_t>& bufs) {
    const ModelSpec& spec = *s_.models[m].spec;
    const std::uint32_t first = spec.tensor_first[i], count = spec.tensor_first[i + 1] - first;
    const std::uint8_t stream = ns_ == 0 ? 0 : static_cast<std::uint8_t>(1 + k % ns_);
    bufs.resize(count);
    for (std::uint32_t t = 0; t < count; ++t) {
      bufs[t] = alloc(Phase::forward, spec.tensors_flat[first + t].bytes, stream, BufferKind::transfer, m, i, t);
      emit(OpKind::h2d, Phase::forward, stream, bufs[t]);
    }
  }

  void forward(const StagePlan& sp) {
    const std::uint32_t m = sp.model;
    const ModelRef& ref = s_.models[m];
    const ModelSpec& model = *ref.spec;
    std::vector<std::uint32_t> offloaded;
    for (std::uint32_t i = 0; i < model.modules.size(); ++i) {
      if (!resident_[m][i] && lowvram_[m][i]) offloaded.push_back(i);
    }
    // Every sampling step repeats the passes (a diffusion model's node runs `steps` of them).
    const std::uint32_t passes = sp.passes * (model.kind == ModelKind::diffusion ? s_.workload.steps : 1);
    // The transfer buffers of the offloaded modules in flight (at most ns_ + 1: the one computed
    // and those issued ahead), in a ring by offloaded index; with `temps`, their storage is reused
    // pass after pass and module after module (a vector per offloaded module was a heap
    // allocation per module and pass, and 24 bytes of table per module).
    std::vector<std::vector<std::uint32_t>> transfers(std::size_t{ns_} + 2);
    const auto in_flight = [&transfers](std::size_t k) -> std::vector<std::uint32_t>& { return transfers[k % transfers.size()]; };
    std::vector<std::uint32_t> temps;
    // Nothing below outlives a pass (the ring is empty again at its end): with repeat_passes the
    // first is lowered and repeated (LowerOptions).
    const auto op_begin = static_cast<std::uint32_t>(prog_.ops.size());
    const auto buffer_begin = static_cast<std::uint32_t>(prog_.buffers.size());
    const std::uint32_t lowered = options_.repeat_passes ? std::min<std::uint32_t>(passes, 1) : passes;
    for (std::uint32_t pass = 0; pass < lowered; ++pass) {
      const std::uint32_t act = alloc(Phase::forward, sp.activation_bytes, 0, BufferKind::activation, m, kNone, kNone);
      std::size_t issued = 0;  // offloaded modules whose transfer has been issued
      std::size_t k = 0;       // index of the next offloaded module in forward order
      for (std::uint32_t i = 0; i < model.modules.size(); ++i) {
        temps.clear();
        if (resident_[m][i]) {
          convert(m, i, weights_[m].of(i), temps);
          emit_compute(m, i, act);
          for (std::uint32_t b : temps) free(Phase::forward, b);
          continue;
        }
        if (!lowvram_[m][i]) {
          // A raw module in host memory is not transferred: the model's own code reads what it
          // needs of it where it is (docs/lowering.md).
          emit(OpKind::compute, Phase::forward, 0, act);
          continue;
        }
        // The CPU runs up to NS transfers ahead of the module being computed.
        const std::size_t want = std::min(offloaded.size(), k + 1 + ns_);
        for (; issued < want; ++issued) issue_transfer(m, offloaded[issued], issued, in_flight(issued));
        const std::uint8_t stream = ns_ == 0 ? 0 : static_cast<std::uint8_t>(1 + k % ns_);
        if (stream != 0) emit(OpKind::wait, Phase::forward, 0, kNone, kNone, stream);
        std::vector<std::uint32_t>& bufs = in_flight(k);
        convert(m, i, bufs, temps, ref.lora);
        if (ref.lora) {
          // LowVramPatch: the LoRA delta (up x down) is computed in the compute dtype and added
          // in place to the weight's private cast copy.
          const std::uint32_t first = model.tensor_first[i], count = model.tensor_first[i + 1] - first;
          for (std::uint32_t t = 0; t < count; ++t) {
            const FlatTensor& tensor = model.tensors_flat[first + t];
            if (tensor.role != TensorRole::weight) continue;
            const Bytes bytes = tensor.numel * compute_elem_bytes(ref.compute);
            temps.push_back(alloc(Phase::forward, bytes, 0, BufferKind::lora, m, i, t));
          }
        }
        emit_compute(m, i, act);
        for (std::uint32_t b : temps) free(Phase::forward, b);
        // uncast: the offload stream waits for the compute before the transfer buffers are freed
        // on it (ComfyUI PR #10501).
        if (stream != 0) emit(OpKind::wait, Phase::forward, stream, kNone, kNone, 0);
        for (std::uint32_t b : bufs) free(Phase::forward, b);
        bufs.clear();
        ++k;
      }
      free(Phase::forward, act);
    }
    if (lowered < passes) repeat(op_begin, buffer_begin, passes - lowered);
  }

  void unload(std::uint32_t m) {
    for (std::uint32_t i = 0; i < resident_[m].size(); ++i) {
      if (resident_[m][i]) unload_module(Phase::unload, m, i);
    }
    emit(OpKind::empty_cache, Phase::unload, 0);
  }

  // The module's kernels (the compute op names its module for the modelled time).
  void emit_compute(std::uint32_t m, std::uint32_t i, std::uint32_t act) { lowering::module_op(push_op(), OpKind::compute, Phase::forward, act, m, i); }

  const Scenario& s_;
  const Plan& plan_;
  LowerOptions options_;
  std::uint32_t ns_;
  std::uint16_t stage_ = 0;
  Program prog_;
  lowering::DynamicLowering dynamic_;
  std::vector<lowering::TensorSlots> weights_;  // [model]: per tensor, its resident buffer
  std::vector<std::vector<std::uint8_t>> resident_;
  std::vector<std::vector<std::uint8_t>> lowvram_;  // [model][module]: cast on the fly, transferred per forward
};

}  // namespace

Program::~Program() {
  recycle_keep(ops);
  recycle_keep(buffers);
}

Program lower(const Scenario& s, const Plan& plan, const LowerOptions& options) { return Lowerer(s, plan, options).run(); }

LivePeaks live_peaks(const Program& p) {
  LivePeaks lp;
  lp.stage_peak.assign(p.stage_begin.size(), 0);
  lp.stage_peak_op.assign(p.stage_begin.size(), 0);
  Bytes live = 0;
  for (std::uint32_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    const std::uint16_t st = op.stage;
    if (op.kind == OpKind::alloc) live += p.buffers[op.buffer].bytes;
    else if (op.kind == OpKind::free) live -= p.buffers[op.buffer].bytes;
    // Measured the way the backend measures a stage: after each op, transitions aside.
    if (!is_transition(op) && (live > lp.stage_peak[st] || lp.stage_peak[st] == 0)) {
      lp.stage_peak[st] = live;
      lp.stage_peak_op[st] = i;
    }
    if (live > lp.peak) {
      lp.peak = live;
      lp.peak_op = i;
    }
  }
  return lp;
}

std::string describe_buffer(const Scenario& s, const Program& p, std::uint32_t buffer) {
  if (buffer == kNone) return "";
  const Buffer& b = p.buffers[buffer];
  const ModelRef& ref = s.models[b.model];
  if (b.module == kNone) return fmt::format("{}: {}", ref.id, buffer_kind_name(b.kind));
  const Module& mod = ref.spec->modules[b.module];
  if (b.tensor == kNone) return fmt::format("{}: {} ({})", ref.id, mod.name, buffer_kind_name(b.kind));
  return fmt::format("{}: {}.{} ({})", ref.id, mod.name, mod.tensors[b.tensor].name, buffer_kind_name(b.kind));
}

std::string describe_op(const Scenario& s, const Program& p, std::uint32_t op) {
  const Op& o = p.ops[op];
  switch (o.kind) {
    case OpKind::wait: return fmt::format("stream {} waits on stream {}", o.stream, o.target);
    case OpKind::sync: return "synchronize";
    case OpKind::empty_cache: return "empty_cache";
    case OpKind::flush_if_cached: return "empty_cache if cached > 25% of free";
    case OpKind::vbar_prioritize: return fmt::format("{}: VBAR to the top of the priority list", s.models[o.model].id);
    case OpKind::vbar_fault:
    case OpKind::vbar_unpin: {
      const ModelRef& ref = s.models[o.model];
      return fmt::format("{}: {} {} (slice of {})", ref.id, o.kind == OpKind::vbar_fault ? "fault" : "unpin",
                         ref.spec->modules[o.module].name, format_mib(p.vbars[o.model].size[o.module]));
    }
    case OpKind::vbar_free:
      if (o.flags & kVbarFreeToTarget) return fmt::format("free_memory: VBAR pages evicted until {} is free", format_mib(p.amounts[o.src]));
      return fmt::format("{}: VBAR pages freed from the top", s.models[o.model].id);
    case OpKind::node_end: return "end of node: cast buffers reset, soft_empty_cache";
    case OpKind::compute:
      if (o.src != kNone) return fmt::format("LoRA merge into {}", describe_buffer(s, p, o.buffer));
      return fmt::format("compute -> {}", describe_buffer(s, p, o.buffer));
    default: return describe_buffer(s, p, o.buffer);
  }
}

std::string check_program(const Program& p) {
  std::vector<std::uint8_t> live(p.buffers.size(), 0);
  std::vector<std::uint8_t> seen(p.buffers.size(), 0);
  // For each offload stream: was the compute stream told to wait for it since its last h2d?
  std::vector<std::uint8_t> pending_h2d(p.streams, 0);
  for (std::uint32_t i = 0; i < p.ops.size(); ++i) {
    const Op& o = p.ops[i];
    if (o.stream >= p.streams) return fmt::format("op {}: stream {} out of range", i, o.stream);
    switch (o.kind) {
      case OpKind::alloc:
        if (seen[o.buffer]) return fmt::format("op {}: buffer {} allocated twice", i, o.buffer);
        seen[o.buffer] = live[o.buffer] = 1;
        if (p.buffers[o.buffer].stream != o.stream) return fmt::format("op {}: alloc on the wrong stream", i);
        break;
      case OpKind::free:
        if (!live[o.buffer]) return fmt::format("op {}: free of buffer {} that is not live", i, o.buffer);
        if (p.buffers[o.buffer].stream != o.stream) return fmt::format("op {}: free not on the allocation stream", i);
        live[o.buffer] = 0;
        break;
      case OpKind::h2d:
        if (!live[o.buffer]) return fmt::format("op {}: copy into a dead buffer", i);
        if (o.stream != 0) pending_h2d[o.stream] = 1;
        break;
      case OpKind::upcast:
      case OpKind::dequant:
        if (!live[o.buffer] || (o.src != kNone && !live[o.src])) return fmt::format("op {}: conversion touches a dead buffer", i);
        if (o.src != kNone && p.buffers[o.src].stream != o.stream && pending_h2d[p.buffers[o.src].stream]) {
          return fmt::format("op {}: reads a transfer on stream {} without waiting for it", i, p.buffers[o.src].stream);
        }
        break;
      case OpKind::wait:
        if (o.target >= p.streams) return fmt::format("op {}: waits on stream {} out of range", i, o.target);
        if (o.stream == 0) pending_h2d[o.target] = 0;
        break;
      default: break;
    }
  }
  for (std::size_t b = 0; b < p.buffers.size(); ++b) {
    if (live[b] && p.buffers[b].kind != BufferKind::weight) {
      return fmt::format("buffer {} ({}) is never freed", b, buffer_kind_name(p.buffers[b].kind));
    }
  }
  return {};
}

}  // namespace vf

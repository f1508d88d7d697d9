#include "harness/dynamic_runtime.h"

#include <algorithm>

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf {

DynamicRuntime::DynamicRuntime(const Scenario& s, const Program& p, sim::Aimdo& aimdo, TorchView& torch)
    : s_(s), p_(p), aimdo_(aimdo), torch_(torch), ns_(s.streams()), vbar_(s.models.size(), kNone), modules_(s.models.size()) {
  for (std::size_t m = 0; m < s.models.size(); ++m) modules_[m].resize(s.models[m].spec->modules.size());
}

bool DynamicRuntime::runs(const Op& op) const {
  if (op.when == When::always) return true;
  const Last last = modules_[op.model][op.module].last;
  return op.when == When::refused ? last == Last::refused : last != Last::resident;
}

std::uint32_t DynamicRuntime::vbar_of(std::uint32_t m) {
  if (vbar_[m] == kNone) vbar_[m] = aimdo_.vbar_allocate(p_.vbars[m].request);
  return vbar_[m];
}

std::uint64_t DynamicRuntime::first_page(std::uint32_t m, std::uint32_t i) const { return p_.vbars[m].offset[i] / sim::kVbarPage; }

std::uint64_t DynamicRuntime::end_page(std::uint32_t m, std::uint32_t i) const {
  const Bytes end = p_.vbars[m].offset[i] + p_.vbars[m].size[i];
  return end / sim::kVbarPage + (end % sim::kVbarPage ? 1 : 0);
}

std::uint32_t DynamicRuntime::next_offload_stream() {
  // get_offload_stream: the first call makes the streams and hands out the first; each later
  // call moves to the next.
  if (!streams_made_) {
    streams_made_ = true;
  } else {
    stream_counter_ = (stream_counter_ + 1) % ns_;
  }
  return 1 + stream_counter_;
}

DynamicRuntime::Result DynamicRuntime::fault(const Op& op) {
  const std::uint32_t m = op.model, i = op.module;
  const Bytes offset = p_.vbars[m].offset[i], size = p_.vbars[m].size[i];
  const std::uint32_t v = vbar_of(m);
  if (op.flags & kFaultGroupStart) {
    call_stream_ = 0;
    call_offset_ = 0;
  }
  ModuleState& ms = modules_[m][i];
  const sim::FaultResult r = aimdo_.fault(v, offset, size);
  Result out;
  if (r == sim::FaultResult::error) {
    ms.last = Last::refused;
    out.ok = false;
    out.failure = "VBAR fault";
    out.request = sim::kVbarPage;
    out.detail = "a page could not be mapped even after an eviction (aimdo's VBAR_FAULT_ERROR; ComfyUI raises "
                 "\"Fault failed: 2\")";
    return out;
  }
  if (r != sim::FaultResult::refused) {
    // Compared in place, and rewritten in place when they differ. A module's slice, so its page
    // count, is fixed for the run: its place in serials_ is taken at its first copy.
    const std::uint64_t first = first_page(m, i), end = end_page(m, i);
    // Its serials are kept from its last copy while that copy stands (copied, or resident since);
    // a slice of no pages keeps none and is never resident by them.
    bool same = (ms.last == Last::copied || ms.last == Last::resident) && end > first;
    for (std::uint64_t pg = first; same && pg < end; ++pg) same = serials_[ms.serial_at + (pg - first)] == aimdo_.serial(v, pg);
    if (same) {
      ms.last = Last::resident;
      ++hits_;
      return out;
    }
    if (ms.serial_at == kNone) {
      ms.serial_at = static_cast<std::uint32_t>(serials_.size());
      serials_.resize(serials_.size() + (end - first));
    }
    for (std::uint64_t pg = first; pg < end; ++pg) serials_[ms.serial_at + (pg - first)] = aimdo_.serial(v, pg);
    ms.last = Last::copied;
    ++copies_;
    if (ns_ > 0 && call_stream_ == 0) call_stream_ = next_offload_stream();
    out.moved = size;
    out.dest = aimdo_.vbar_base(v) + offset;
    out.stream = call_stream_;
    return out;
  }
  ms.last = Last::refused;
  ++refused_;
  out.moved = size;
  if (!s_.policy.constants.dynamic.aimdo_cast_buffers || ns_ == 0) return out;  // a torch buffer (conditional ops)
  if (call_stream_ == 0) call_stream_ = next_offload_stream();
  std::uint32_t moved_from = 0;  // the stream the LARGEST rule moved the module off
  if (op.flags & kFaultSingle) {
    // ensure_offload_stream compares the call's own cast buffer (none yet: 0 bytes) with the
    // size needed, so the largest module always takes one more rotation, whatever the stream
    // it was given already holds.
    if (m == largest_model_ && i == largest_module_) {
      moved_from = call_stream_;
      call_stream_ = next_offload_stream();
    }
    if (size > largest_size_) {
      largest_model_ = m;
      largest_module_ = i;
      largest_size_ = size;
    }
  }
  ms.cast_stream = call_stream_;
  ms.cast_offset = call_offset_;
  const Bytes required = call_offset_ + size;
  const Bytes before = aimdo_.cast_size(call_stream_);
  call_offset_ = required;
  out.stream = call_stream_;
  if (aimdo_.cast_grow(call_stream_, required)) {
    out.dest = aimdo_.cast_base(call_stream_) + ms.cast_offset;
  } else {
    out.ok = false;
    out.failure = "cast buffer grow";
    out.request = round_up(required, sim::kCastChunk) - std::min(round_up(required, sim::kCastChunk), aimdo_.cast_size(call_stream_));
    out.detail = required > sim::kCastReservation
                     ? fmt::format("a cast of {} is larger than the {} cast buffer reservation (\"VRAM grow failed\")",
                                   format_mib(required), format_mib(sim::kCastReservation))
                     : fmt::format("VRAM grow failed: the cast buffer of offload stream {} could not grow from {} to {}",
                                   call_stream_, format_mib(before), format_mib(round_up(required, sim::kCastChunk)));
    if (moved_from != 0 && moved_from != call_stream_) {
      out.detail += fmt::format("; the LARGEST_AIMDO_CASTED_WEIGHT rule had moved this module off offload stream {}, whose cast "
                                "buffer already held {}, because it compares the call's own cast buffer (none yet) with the "
                                "size needed, not that stream's",
                                moved_from, format_mib(aimdo_.cast_size(moved_from)));
    }
  }
  return out;
}

DynamicRuntime::Result DynamicRuntime::execute(const Op& op) {
  // Faults and unpins, one pair per module a forward casts, are nearly all of these ops: two
  // tests ahead of the switch, whose indirect jump between the two mispredicted at every op.
  if (op.kind == OpKind::vbar_fault) return fault(op);
  if (op.kind == OpKind::vbar_unpin) {
    const ModuleState& ms = modules_[op.model][op.module];
    if (ms.last == Last::copied || ms.last == Last::resident) {
      aimdo_.unpin(vbar_[op.model], p_.vbars[op.model].offset[op.module], p_.vbars[op.model].size[op.module]);
    }
    return {};
  }
  switch (op.kind) {
    case OpKind::vbar_prioritize: aimdo_.prioritize(vbar_of(op.model)); return {};
    case OpKind::vbar_free: {
      const Bytes amount = p_.amounts[op.src];
      if (!(op.flags & kVbarFreeToTarget)) {
        if (vbar_[op.model] != kNone) aimdo_.free_memory(vbar_[op.model], amount);
        return {};
      }
      // free_memory for a legacy load: the most-offloaded dynamic model first, each asked for
      // what is still missing (model_unload -> partially_unload).
      std::vector<std::uint32_t> order;
      for (std::uint32_t m = 0; m < vbar_.size(); ++m) {
        if (vbar_[m] != kNone) order.push_back(m);
      }
      auto offloaded = [&](std::uint32_t m) { return sat_sub(s_.models[m].spec->bytes, aimdo_.loaded_size(vbar_[m])); };
      std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return offloaded(a) > offloaded(b); });
      for (const std::uint32_t m : order) {
        const Bytes free = torch_.free_memory();
        if (free >= amount) break;
        aimdo_.free_memory(vbar_[m], amount - free);
      }
      return {};
    }
    case OpKind::node_end:
      aimdo_.cast_reset();
      largest_model_ = largest_module_ = kNone;
      largest_size_ = 0;
      call_stream_ = 0;
      call_offset_ = 0;
      aimdo_.reset_watermark_limits();
      torch_.synchronize();
      torch_.empty_cache();
      return {};
    default: throw InfraError(fmt::format("dynamic runtime: op {} is not a dynamic VRAM op", op_kind_name(op.kind)));
  }
}

Bytes DynamicRuntime::module_pinned(std::uint32_t m, std::uint32_t i) const {
  if (m >= vbar_.size() || vbar_[m] == kNone || i == kNone || p_.vbars[m].size.empty() || p_.vbars[m].size[i] == 0) return 0;
  const std::uint32_t v = vbar_[m];
  Bytes b = 0;
  for (std::uint64_t pg = first_page(m, i); pg < end_page(m, i) && pg < aimdo_.nr_pages(v); ++pg) {
    if (aimdo_.mapped(v, pg) && aimdo_.pins(v, pg) > 0) b += sim::kVbarPage;
  }
  return b;
}

Bytes DynamicRuntime::module_cast(std::uint32_t m, std::uint32_t i) const {
  if (m >= modules_.size() || i == kNone || i >= modules_[m].size() || modules_[m][i].last != Last::refused) return 0;
  if (!s_.policy.constants.dynamic.aimdo_cast_buffers || ns_ == 0) return 0;  // a torch buffer, counted with the tensors
  const ModuleState& ms = modules_[m][i];
  const Bytes mapped = aimdo_.cast_size(ms.cast_stream);
  return std::min(p_.vbars[m].size[i], sat_sub(mapped, ms.cast_offset));
}

DynamicOom account_oom(const Scenario& s, const Op& op, const LiveTensors& live, const sim::AllocStats& torch, Bytes free, Bytes held,
                       const sim::Aimdo& aimdo, const DynamicRuntime& rt, std::string what, Bytes request) {
  DynamicOom o;
  o.what = std::move(what);
  o.request = request;
  o.total = s.device.total;
  o.free = free;
  o.context = s.device.context_overhead;
  // Other processes at that moment: what the card's total leaves beside the context, us and free.
  o.others = sat_sub(sat_sub(sat_sub(s.device.total, s.device.context_overhead), held), free);
  const DynamicConstants& k = s.policy.constants.dynamic;
  o.headroom = k.simple_headroom + k.vram_headroom;
  const std::uint32_t running = s.stages[op.stage].model;
  o.needed_tensors = live.others + live.weights[running];
  for (std::size_t m = 0; m < live.weights.size(); ++m) {
    if (m != running) o.other_weights += live.weights[m];
  }
  const bool raw = s.allocator.mode == AllocatorMode::raw;
  const Bytes reserved_slack = sat_sub(torch.reserved.current, torch.allocated.current);
  o.torch_cache = raw ? 0 : reserved_slack;
  o.rounding = sat_sub(torch.allocated.current, torch.requested.current) + (raw ? reserved_slack : 0);
  // What the driver charged beyond torch's reserved and aimdo's pages (small cudaMalloc pages).
  o.rounding += sat_sub(held, torch.reserved.current + aimdo.vbar_resident() + aimdo.cast_bytes());
  o.needed_pages = op.module != kNone && op.model == running ? rt.module_pinned(op.model, op.module) : 0;
  o.needed_cast = op.module != kNone ? rt.module_cast(op.model, op.module) : 0;
  const Bytes pinned = aimdo.pinned_bytes();
  o.prefetch_pins = sat_sub(pinned, o.needed_pages);
  o.resident_pages = sat_sub(aimdo.vbar_resident(), pinned);
  o.cast_slack = sat_sub(aimdo.cast_bytes(), o.needed_cast);
  return o;
}

void fill_dynamic_report(DynamicReport& d, const sim::Aimdo& aimdo, const DynamicRuntime& rt, std::uint64_t elapsed_us) {
  const sim::AimdoStats& a = aimdo.stats();
  d.elapsed_us = elapsed_us;
  d.faults = a.faults;
  d.resident_hits = rt.resident_hits();
  d.copies = rt.copies();
  d.refused = rt.refused();
  d.pages_mapped = a.pages_mapped;
  d.pages_evicted = a.pages_evicted;
  d.polls = a.polls;
  d.hook_retries = a.hook_retries;
  d.vbar_peak = a.vbar_peak;
  d.cast_peak = a.cast_peak;
  d.ledger_peak = a.ledger_peak;
}

OthersFailure others_failure(std::uint32_t op, std::uint64_t now_us, Bytes bytes, Bytes free, const sim::Aimdo& aimdo,
                             bool others_changed) {
  OthersFailure f;
  f.op = op;
  f.at_us = now_us;
  f.bytes = bytes;
  f.free = free;
  f.evictable = sat_sub(aimdo.vbar_resident(), aimdo.pinned_bytes());
  f.since_poll_us = now_us - aimdo.last_poll_us();
  f.believed_free = aimdo.believed_free();
  f.others_changed = others_changed;
  return f;
}

}  // namespace vf

#include "harness/attribution.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

namespace vf {

std::string_view peak_part_name(PeakPart p) {
  switch (p) {
    case PeakPart::weights: return "resident weights";
    case PeakPart::transfer: return "transfer copies";
    case PeakPart::convert: return "conversions";
    case PeakPart::scaled: return "scaled-fp8 products";
    case PeakPart::lora: return "LoRA patches";
    case PeakPart::activation: return "activations";
    case PeakPart::rounding: return "allocator rounding";
    case PeakPart::held: return "other streams' frees";
    case PeakPart::slack: return "allocator slack";
  }
  return "?";
}

std::string_view budget_name(Budget b) {
  switch (b) {
    case Budget::loaded_weights: return "loaded weights";
    case Budget::offload_buffer: return "offload buffer";
    case Budget::activation_allowance: return "activation allowance";
    case Budget::none: return "nothing";
  }
  return "?";
}

Budget budget_of(PeakPart p) {
  switch (p) {
    case PeakPart::weights: return Budget::loaded_weights;
    case PeakPart::transfer:
    case PeakPart::convert:
    case PeakPart::scaled:
    case PeakPart::lora: return Budget::offload_buffer;
    case PeakPart::activation: return Budget::activation_allowance;
    case PeakPart::rounding:
    case PeakPart::held:
    case PeakPart::slack: return Budget::none;
  }
  return Budget::none;
}

namespace {

PeakPart part_of(BufferKind k) {
  switch (k) {
    case BufferKind::weight: return PeakPart::weights;
    case BufferKind::transfer: return PeakPart::transfer;
    case BufferKind::convert: return PeakPart::convert;
    case BufferKind::scaled: return PeakPart::scaled;
    case BufferKind::lora: return PeakPart::lora;
    case BufferKind::activation: return PeakPart::activation;
  }
  return PeakPart::activation;
}

std::string plural(std::uint64_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

}  // namespace

Bytes Attribution::group(Budget b) const {
  Bytes sum = 0;
  for (std::size_t i = 0; i < kPeakParts; ++i) {
    if (budget_of(static_cast<PeakPart>(i)) == b) sum += parts[i].bytes;
  }
  return sum;
}

Bytes Attribution::budget(Budget b) const {
  switch (b) {
    case Budget::loaded_weights: return budget_weights;
    case Budget::offload_buffer: return budget_offload;
    case Budget::activation_allowance: return budget_activation;
    case Budget::none: return 0;
  }
  return 0;
}

bool Attribution::offload_overlap() const {
  if (transfer_modules < 2 || transfer_streams == 0 || transfer_extra == 0) return false;
  const std::int64_t over = static_cast<std::int64_t>(group(Budget::offload_buffer)) - static_cast<std::int64_t>(budget_offload);
  return over > static_cast<std::int64_t>(reserve) && over - static_cast<std::int64_t>(transfer_extra) <= static_cast<std::int64_t>(reserve);
}

std::vector<Attribution::Excess> Attribution::excesses() const {
  std::vector<Excess> out;
  for (const Budget b : {Budget::loaded_weights, Budget::offload_buffer, Budget::activation_allowance}) {
    const std::int64_t over = static_cast<std::int64_t>(group(b)) - static_cast<std::int64_t>(budget(b));
    if (over > 0) out.push_back({b, PeakPart::rounding, over});
  }
  // Rounding, other streams' frees and slack are budgeted nothing: each is its own excess.
  for (const PeakPart part : {PeakPart::rounding, PeakPart::held, PeakPart::slack}) {
    const Bytes bytes = parts[static_cast<std::size_t>(part)].bytes;
    if (bytes > 0) out.push_back({Budget::none, part, static_cast<std::int64_t>(bytes)});
  }
  std::stable_sort(out.begin(), out.end(), [](const Excess& x, const Excess& y) { return x.bytes > y.bytes; });
  return out;
}

Attribution attribute(const Scenario& s, const Plan& plan, const Program& p, std::uint32_t stage, std::uint32_t op, Bytes reserved,
                      Bytes allocated, std::optional<Bytes> failed, Bytes held) {
  Attribution a;
  a.op = op;
  if (op < p.ops.size()) a.stream = p.ops[op].stream;
  a.stage = stage;
  a.reserve = plan.reserve;
  for (const StagePlan& sp : plan.stages) {
    if (sp.stage != stage) continue;
    a.budget_weights = sp.resident_total;
    a.budget_offload = sp.offload_buffer;
    a.budget_activation = sp.activation_allowance;
  }
  // The buffers live after op `op` (an OOM's failing allocation is not: it is added as the request).
  std::vector<std::uint8_t> live(p.buffers.size(), 0);
  for (std::uint32_t i = 0; i <= op && i < p.ops.size(); ++i) {
    const Op& o = p.ops[i];
    if (o.buffer >= p.buffers.size() || o.when != When::always) continue;
    if (o.kind == OpKind::alloc && !(failed && i == op)) live[o.buffer] = 1;
    if (o.kind == OpKind::free) live[o.buffer] = 0;
  }
  if (failed && op < p.ops.size() && p.ops[op].buffer < p.buffers.size()) live[p.ops[op].buffer] = 1;
  // The transients' tensors, by bytes (a tensor can have a transfer copy and a conversion).
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, Bytes> transient;  // (model, module, tensor) -> bytes
  std::map<std::pair<std::uint32_t, std::uint32_t>, Bytes> transfer_modules;  // (model, module) -> its copies' bytes
  std::set<std::uint32_t> transfer_streams;                            // offload streams (not 0)
  Bytes largest_conversion = 0;
  for (std::size_t b = 0; b < p.buffers.size(); ++b) {
    if (!live[b]) continue;
    const Buffer& buf = p.buffers[b];
    const PeakPart part = part_of(buf.kind);
    a.parts[static_cast<std::size_t>(part)].bytes += buf.bytes;
    a.parts[static_cast<std::size_t>(part)].tensors += 1;
    a.requested += buf.bytes;
    if (budget_of(part) == Budget::offload_buffer && buf.module != kNone) {
      transient[{buf.model, buf.module, buf.tensor}] += buf.bytes;
    }
    if (buf.kind == BufferKind::transfer && buf.module != kNone) {
      transfer_modules[{buf.model, buf.module}] += buf.bytes;
      if (buf.stream != 0) transfer_streams.insert(buf.stream);
    }
    if ((buf.kind == BufferKind::convert || buf.kind == BufferKind::scaled) && buf.bytes > largest_conversion && buf.module != kNone &&
        buf.model < s.models.size()) {
      const ModelSpec& spec = *s.models[buf.model].spec;
      if (buf.module < spec.modules.size() && buf.tensor < spec.modules[buf.module].tensors.size()) {
        largest_conversion = buf.bytes;
        a.has_conversion = true;
        a.storage = spec.modules[buf.module].tensors[buf.tensor].dtype;
        a.compute = s.models[buf.model].compute;
      }
    }
  }
  a.transient_weights = static_cast<std::uint32_t>(transient.size());
  a.transfer_modules = static_cast<std::uint32_t>(transfer_modules.size());
  a.transfer_streams = static_cast<std::uint32_t>(transfer_streams.size());
  Bytes largest_transfer = 0, all_transfers = 0;
  for (const auto& [key, bytes] : transfer_modules) {
    largest_transfer = std::max(largest_transfer, bytes);
    all_transfers += bytes;
  }
  a.transfer_extra = all_transfers - largest_transfer;
  a.mode = s.allocator.mode;
  std::vector<std::pair<Bytes, std::string>> named;
  for (const auto& [key, bytes] : transient) {
    const auto [model, module, tensor] = key;
    if (model >= s.models.size()) continue;
    const ModelSpec& spec = *s.models[model].spec;
    if (module >= spec.modules.size()) continue;
    const Module& m = spec.modules[module];
    named.emplace_back(bytes, tensor < m.tensors.size() ? m.name + "." + m.tensors[tensor].name : m.name);
  }
  std::stable_sort(named.begin(), named.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  for (std::size_t i = 0; i < named.size() && i < 3; ++i) a.transient_modules.push_back(named[i].second);
  a.failed = failed ? *failed : 0;
  a.allocated = std::max(allocated + (failed ? *failed : 0), a.requested);
  a.reserved = std::max(reserved + (failed ? *failed : 0), a.allocated);
  std::uint32_t tensors = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(PeakPart::rounding); ++i) tensors += a.parts[i].tensors;
  if (s.allocator.mode == AllocatorMode::raw) {
    // Every tensor is its own cudaMalloc: reserved - allocated is the driver's page rounding (2 MiB
    // pages, small buffers packed), not cached memory.
    a.parts[static_cast<std::size_t>(PeakPart::rounding)] = {a.reserved - a.requested, tensors};
  } else {
    a.parts[static_cast<std::size_t>(PeakPart::rounding)] = {a.allocated - a.requested, tensors};
    const Bytes unallocated = a.reserved - a.allocated;
    const Bytes other = std::min(held, unallocated);
    a.parts[static_cast<std::size_t>(PeakPart::held)] = {other, 0};
    a.parts[static_cast<std::size_t>(PeakPart::slack)] = {unallocated - other, 0};
  }
  return a;
}

namespace {

// "weight transients 1120.0 MiB for 2 weights (2 offloaded, their transfer copies 160.0 MiB), fp8_e4m3fn -> fp32 conversions 960.0 MiB (largest: ...)"
std::string group_label(const Attribution& a, Budget b) {
  switch (b) {
    case Budget::loaded_weights:
      return fmt::format("resident weights {} in {}", format_mib(a.group(b)), plural(a.parts[0].tensors, "tensor", "tensors"));
    case Budget::offload_buffer: {
      const std::uint32_t offloaded = a.parts[static_cast<std::size_t>(PeakPart::transfer)].tensors;
      if (a.offload_overlap()) {
        // Class B: the copies of several offloaded modules are on the device at once, issued on
        // the offload streams ahead of the compute stream, with the other transients beside them.
        const Bytes transfer = a.parts[static_cast<std::size_t>(PeakPart::transfer)].bytes;
        const Bytes rest = a.group(b) - transfer;
        return fmt::format("async-offload overlap: weight transients {} with the transfer copies of {} offloaded modules in flight "
                           "at once on {} ({}, {}){}",
                           format_mib(a.group(b)), a.transfer_modules, plural(a.transfer_streams, "offload stream", "offload streams"),
                           plural(offloaded, "tensor", "tensors"), format_mib(transfer),
                           rest > 0 ? fmt::format(" and {} of conversions and patches", format_mib(rest)) : std::string());
      }
      std::string out = fmt::format("weight transients {} for {}{}", format_mib(a.group(b)), plural(a.transient_weights, "tensor", "tensors"),
                                    offloaded ? fmt::format(" ({} offloaded, their transfer copies {})", offloaded,
                                                            format_mib(a.parts[static_cast<std::size_t>(PeakPart::transfer)].bytes))
                                              : std::string(" (resident)"));
      const PeakShare& conv = a.parts[static_cast<std::size_t>(PeakPart::convert)];
      const PeakShare& scaled = a.parts[static_cast<std::size_t>(PeakPart::scaled)];
      if (a.has_conversion && conv.bytes + scaled.bytes > 0) {
        out += fmt::format(", {} -> {} conversions {}", dtype_name(a.storage), dtype_name(a.compute), format_mib(conv.bytes + scaled.bytes));
        if (!a.transient_modules.empty()) {
          out += " (largest: ";
          for (std::size_t i = 0; i < a.transient_modules.size(); ++i) out += (i ? ", " : "") + a.transient_modules[i];
          out += ")";
        }
      } else if (!a.transient_modules.empty()) {
        out += " (largest: " + a.transient_modules[0] + ")";
      }
      return out;
    }
    case Budget::activation_allowance:
      return fmt::format("activations {}", format_mib(a.group(b)));
    case Budget::none: break;
  }
  return "";
}

// Who held the memory, from the judged op's stream, in the allocator's terms: cudaMallocAsync
// frees wait for an event edge (the lag); the caching allocator keeps a free list per stream.
std::string held_label(const Attribution& a) {
  const std::string others = a.stream == 0 ? "the offload streams" : "the compute stream and the other offload streams";
  const std::string who = a.stream == 0 ? "the compute stream" : fmt::format("offload stream {}", a.stream);
  if (a.mode == AllocatorMode::async) {
    return fmt::format("frees on {} that {} is not yet ordered after, so its allocations could not reuse them: "
                       "async-offload lag",
                       others, who);
  }
  return fmt::format("blocks cached in {}' pools or waiting for their events; PyTorch's caching allocator keeps a free "
                     "list per stream, so {}'s allocations cannot reuse them until empty_cache",
                     others, who);
}

}  // namespace

std::string attribution_cause(const Attribution& a) {
  const auto over = a.excesses();
  if (over.empty()) return fmt::format("nothing over its budget at op {}", a.op);
  const Budget b = over.front().budget;
  const std::int64_t bytes = over.front().bytes;
  if (b == Budget::none) {
    const PeakShare& r = a.parts[static_cast<std::size_t>(PeakPart::rounding)];
    if (over.front().part == PeakPart::rounding) {
      return fmt::format("allocator rounding {} over {}, budgeted 0: +{}", format_mib(r.bytes), plural(r.tensors, "tensor", "tensors"), format_mib(r.bytes));
    }
    if (over.front().part == PeakPart::held) {
      return fmt::format("other streams' frees {} ({}), budgeted 0: +{}", format_mib(static_cast<Bytes>(bytes)), held_label(a),
                         format_mib(static_cast<Bytes>(bytes)));
    }
    return fmt::format("allocator slack {} (reserved but not allocated), budgeted 0: +{}", format_mib(static_cast<Bytes>(bytes)),
                       format_mib(static_cast<Bytes>(bytes)));
  }
  return fmt::format("{}, budgeted {} ({}): +{}", group_label(a, b), format_mib(a.budget(b)), budget_name(b), format_mib(static_cast<Bytes>(bytes)));
}

std::string attribution_paragraph(const Attribution& a) {
  const PeakShare& r = a.parts[static_cast<std::size_t>(PeakPart::rounding)];
  const PeakShare& sl = a.parts[static_cast<std::size_t>(PeakPart::slack)];
  const PeakShare& held = a.parts[static_cast<std::size_t>(PeakPart::held)];
  // At an OOM the parts include the failing request, so the total is what the allocator would
  // have held had it been served, not what it held (the verdict's figure).
  const std::string held_text =
      a.failed > 0 ? fmt::format("would have held {} reserved with the failing {} request ({} without it)", format_mib(a.reserved),
                                 format_mib(a.failed), format_mib(a.reserved - a.failed))
                   : fmt::format("held {} reserved", format_mib(a.reserved));
  std::string out = fmt::format(
      "At op {} the allocator {} against the plan's {} + reserve {}: {} (budgeted {} as loaded weights); {} "
      "(budgeted {} as the offload buffer); activations {} (budgeted {} as the activation allowance); allocator rounding {} over "
      "{}{} and slack {} (budgeted nothing: the reserve is meant to cover them).",
      a.op, held_text, format_mib(a.budget_weights + a.budget_offload + a.budget_activation), format_mib(a.reserve),
      group_label(a, Budget::loaded_weights), format_mib(a.budget_weights), group_label(a, Budget::offload_buffer), format_mib(a.budget_offload),
      format_mib(a.group(Budget::activation_allowance)), format_mib(a.budget_activation), format_mib(r.bytes), plural(r.tensors, "tensor", "tensors"),
      held.bytes > 0 ? fmt::format(", other streams' frees {}", format_mib(held.bytes)) : std::string(), format_mib(sl.bytes));
  const auto over = a.excesses();
  if (over.empty()) return out;
  std::int64_t total = 0;
  std::string list;
  for (const Attribution::Excess& e : over) {
    const Budget b = e.budget;
    const std::int64_t bytes = e.bytes;
    total += bytes;
    std::string_view what = "activations";
    if (b == Budget::none) {
      what = e.part == PeakPart::rounding ? "rounding" : e.part == PeakPart::held ? "other streams' frees" : "slack";
    } else if (b == Budget::loaded_weights) {
      what = "resident weights";
    } else if (b == Budget::offload_buffer) {
      what = "weight transients";
    }
    list += fmt::format("{}{} +{}", list.empty() ? "" : ", ", what, format_mib(static_cast<Bytes>(bytes)));
  }
  out += fmt::format(" Over budget: {}; together +{} against the {} reserve.", list, format_mib(static_cast<Bytes>(total)), format_mib(a.reserve));
  return out;
}

}  // namespace vf

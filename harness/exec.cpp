#include "harness/exec.h"

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf {

// ComfyUI empties the torch cache when nothing was unloaded and cached-but-unused memory is more
// than 25% of free memory (free = driver free + reserved - active).
inline constexpr double kCacheFlushShare = 0.25;

ExecResult SimBackend::execute(const Scenario& s, const Program& p, const ExecOptions& opt) {
  ExecResult r;
  r.backend = "sim";
  r.environment = "sim";
  r.stage_reserved_peak.assign(p.stage_begin.size(), 0);
  r.stage_reserved_peak_op.assign(p.stage_begin.size(), 0);
  r.stage_entry_reserved.assign(p.stage_begin.size(), 0);
  std::vector<std::uint8_t> entered(p.stage_begin.size(), 0);
  sim::SimDevice device(s.device);
  std::unique_ptr<sim::Allocator> alloc;
  try {
    alloc = sim::make_allocator(s.allocator, device, s.seed);
  } catch (const InputError& e) {
    r.error = e.what();
    return r;
  }
  if (opt.record_trace) r.trace.reserve(p.ops.size());
  Bytes live = 0;
  for (std::uint32_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    if (!is_transition(op) && !entered[op.stage]) {
      entered[op.stage] = 1;
      r.stage_entry_reserved[op.stage] = alloc->stats().reserved.current;
    }
    try {
      switch (op.kind) {
        case OpKind::alloc: {
          const Bytes bytes = p.buffers[op.buffer].bytes;
          if (!alloc->malloc(op.buffer, bytes, op.stream)) {
            const sim::OomInfo info = alloc->last_oom().value_or(sim::OomInfo{});
            r.oom = OomEvent{i, bytes, device.free(), alloc->stats().reserved.current, alloc->stats().allocated.current,
                             info.detail};
          } else {
            live += bytes;
          }
          break;
        }
        case OpKind::free:
          alloc->free(op.buffer);
          live -= p.buffers[op.buffer].bytes;
          break;
        case OpKind::wait: alloc->stream_wait(op.stream, op.target); break;
        case OpKind::sync: alloc->synchronize(); break;
        case OpKind::empty_cache: alloc->empty_cache(); break;
        case OpKind::flush_if_cached: {
          const auto& st = alloc->stats();
          const Bytes cached = sat_sub(st.reserved.current, st.active.current);
          if (static_cast<double>(cached) > kCacheFlushShare * static_cast<double>(device.free() + cached)) {
            alloc->empty_cache();
          }
          break;
        }
        case OpKind::h2d:
        case OpKind::upcast:
        case OpKind::dequant:
        case OpKind::compute: break;  // no memory effect on the model of the device
      }
    } catch (const std::exception& e) {
      r.error = fmt::format("op {}: {}", i, e.what());
      r.ops_executed = i;
      r.final_stats = alloc->stats();
      return r;
    }
    const sim::AllocStats& st = alloc->stats();
    if (!is_transition(op) && (st.reserved.current > r.stage_reserved_peak[op.stage] || r.stage_reserved_peak[op.stage] == 0)) {
      r.stage_reserved_peak[op.stage] = st.reserved.current;
      r.stage_reserved_peak_op[op.stage] = i;
    }
    if (st.reserved.current > r.reserved_peak) {
      r.reserved_peak = st.reserved.current;
      r.reserved_peak_op = i;
    }
    if (live > r.live_peak) r.live_peak = live;
    if (device.device_used() > r.device_peak) r.device_peak = device.device_used();
    if (opt.record_trace) r.trace.push_back(TraceRow{i, live, st.allocated.current, st.reserved.current, device.device_used()});
    if (r.oom) {
      r.ops_executed = i + 1;
      break;
    }
    r.ops_executed = i + 1;
  }
  r.allocated_peak = alloc->stats().allocated.peak;
  r.final_stats = alloc->stats();
  return r;
}

std::string format_trace(const Scenario& s, const Program& p, const ExecResult& r, std::uint32_t first, std::uint32_t last) {
  std::string out;
  Bytes prev_reserved = 0;
  for (const TraceRow& row : r.trace) {
    const Op& op = p.ops[row.op];
    const bool shown = row.op >= first && row.op <= last;
    if (shown && (op.kind == OpKind::alloc || op.kind == OpKind::free || row.reserved != prev_reserved)) {
      const std::int64_t delta = static_cast<std::int64_t>(row.reserved) - static_cast<std::int64_t>(prev_reserved);
      const Bytes module = op.buffer != kNone && op.kind != OpKind::compute ? p.buffers[op.buffer].bytes : 0;
      out += fmt::format("[{} {}] reserved: {:.2f} MB ({}{:.2f} MB), allocated: {:.2f} MB, live: {:.2f} MB, {} {:.2f} MB  {}{}\n",
                         phase_name(op.phase), row.op, to_mib(row.reserved), delta < 0 ? "- " : "+ ",
                         std::abs(static_cast<double>(delta)) / MiB, to_mib(row.allocated), to_mib(row.live),
                         op_kind_name(op.kind), to_mib(module), describe_op(s, p, row.op),
                         r.oom && r.oom->op == row.op ? "   <-- OOM" : "");
    }
    prev_reserved = row.reserved;
  }
  return out;
}

}  // namespace vf

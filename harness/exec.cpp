#include "harness/exec.h"

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/dynamic_runtime.h"
#include "harness/sim/aimdo.h"
#include "harness/sim/device.h"

namespace vf {

// ComfyUI empties the torch cache when nothing was unloaded and cached-but-unused memory is more
// than 25% of free memory (free = driver free + reserved - active).
inline constexpr double kCacheFlushShare = 0.25;

namespace {

// What the dynamic runtime asks of the simulated torch allocator.
class SimTorch final : public TorchView {
 public:
  SimTorch(sim::Allocator*& alloc, const sim::SimDevice& device) : alloc_(alloc), device_(device) {}
  void synchronize() override { alloc_->synchronize(); }
  void empty_cache() override { alloc_->empty_cache(); }
  Bytes free_memory() const override {
    const auto& st = alloc_->stats();
    return device_.free() + sat_sub(st.reserved.current, st.active.current);
  }

 private:
  sim::Allocator*& alloc_;
  const sim::SimDevice& device_;
};

}  // namespace

std::string_view DynamicOom::mechanism() const {
  const std::pair<Bytes, std::string_view> slack[] = {
      {torch_cache, "torch-cache"},     {cast_slack, "cast-buffer"},       {prefetch_pins, "prefetch-pins"},
      {other_weights, "other-weights"}, {resident_pages, "resident-pages"}, {rounding, "rounding"}};
  Bytes most = 0;
  std::string_view name = "none";
  for (const auto& [bytes, n] : slack) {
    if (bytes > most) {
      most = bytes;
      name = n;
    }
  }
  return name;
}

ExecResult SimBackend::execute(const Scenario& s, const Program& p, const ExecOptions& opt) {
  ExecResult r;
  r.backend = "sim";
  r.environment = "sim";
  r.stage_reserved_peak.assign(p.stage_begin.size(), 0);
  r.stage_reserved_peak_op.assign(p.stage_begin.size(), 0);
  r.stage_allocated_at_peak.assign(p.stage_begin.size(), 0);
  r.stage_held_at_peak.assign(p.stage_begin.size(), 0);
  r.stage_entry_reserved.assign(p.stage_begin.size(), 0);
  std::vector<std::uint8_t> entered(p.stage_begin.size(), 0);
  sim::SimDevice device(s.device);
  // Modelled time (dynamic VRAM's poll, other processes' events): advanced by every op.
  std::uint64_t now_us = 0;
  const bool timed = p.dynamic || opt.record_trace || !s.device.events.empty();
  // The op durations' clock, for timed runs only (its per-model table is an allocation).
  std::optional<OpClock> op_clock;
  if (timed) op_clock.emplace(s);
  std::unique_ptr<sim::Aimdo> aimdo;
  std::unique_ptr<sim::Allocator> alloc_owner;
  sim::Allocator* alloc = nullptr;
  try {
    if (p.dynamic) {
      // aimdo's device syncs complete the async pool's pending frees (see make_hooked_allocator).
      const bool sync_pool = s.allocator.mode == AllocatorMode::async;
      aimdo = std::make_unique<sim::Aimdo>(s.device.total, s.policy.constants.dynamic, device, now_us, [&alloc, sync_pool] {
        if (sync_pool && alloc) alloc->synchronize();
      });
      alloc_owner = sim::make_hooked_allocator(s.allocator, device, *aimdo, s.seed);
    } else {
      alloc_owner = sim::make_allocator(s.allocator, device, s.seed);
    }
  } catch (const InputError& e) {
    r.error = e.what();
    return r;
  }
  alloc = alloc_owner.get();
  alloc->reserve_keys(p.buffers.size());
  // The allocator's statistics, read after every op: every model keeps them in a member (a hooked
  // allocator its inner one's), so the reference holds for the run (one virtual call, not one per op).
  const sim::AllocStats& st = alloc->stats();
  SimTorch torch(alloc, device);
  std::optional<DynamicRuntime> dyn;
  LiveTensors live_tensors(s.models.size());
  std::vector<std::uint8_t> live_buffer;
  if (p.dynamic) {
    dyn.emplace(s, p, *aimdo, torch);
    r.dynamic.emplace();
    live_buffer.assign(p.buffers.size(), 0);
  }
  if (opt.record_trace) r.trace.reserve(p.ops.size());

  // The account of a dynamic OOM (docs/dynamic.md "The property").
  auto account = [&](const Op& op, std::string what, Bytes request) {
    r.dynamic->oom = account_oom(s, op, live_tensors, alloc->stats(), device.free(), device.charged(), *aimdo, *dyn, std::move(what), request);
  };

  // The loop, compiled once per kind of run: a classic case without events or trace has no use for
  // modelled time, and only a dynamic one has aimdo and its runtime. Constant flags take their tests
  // out of the loop. Returns true when an op threw (r says which).
  auto run_ops = [&]<bool kDynamic, bool kTimed>() -> bool {
    // Everything the loop reads or keeps on every op is a local of this body: a captured variable
    // is a load through the closure, and `r` is reachable from the allocator calls (the OOM
    // account), so the compiler reloaded each of its fields after every call.
    sim::Allocator* const allocator = alloc;
    const Op* const ops = p.ops.data();
    const auto n_ops = static_cast<std::uint32_t>(p.ops.size());
    const Buffer* const buffers = p.buffers.data();
    const std::vector<OthersEvent>& events = s.device.events;
    const std::size_t n_events = events.size();
    std::size_t next_event = 0;
    Bytes others_at_poll = s.device.used_by_others;  // what other processes held at aimdo's last poll
    std::uint64_t poll_seen = 0;
    std::uint8_t* const stage_entered = entered.data();
    Bytes* const stage_peak = r.stage_reserved_peak.data();
    Bytes reserved_peak = r.reserved_peak, live_peak = r.live_peak, device_peak = r.device_peak;
    std::uint32_t reserved_peak_op = r.reserved_peak_op;
    DynamicRuntime* const dynamic = kDynamic ? &*dyn : nullptr;
    const sim::Aimdo* const am = aimdo.get();
    const bool record_trace = opt.record_trace;
    const OpClock* const clock = kTimed ? &*op_clock : nullptr;
    bool oomed = false;
    // Stages are contiguous runs of ops, so a stage is entered at most once: at the first judged
    // op of a stage other than the last one entered.
    std::uint32_t entered_stage = ~std::uint32_t{0};
    // The trace's held column: at an allocation, what it could have taken of other streams' free
    // memory (attribution's "other streams' frees" at a judged op); between allocations, the last
    // allocation's figure, so the timeline's band is the view that decides each growth.
    Bytes trace_held = 0;
    Bytes live = 0;
    // After a judged op: its stage's peak, when `reserved` is above the peak so far (a stage's
    // first op sets it).
    auto note_stage_peak = [&](const Op& op, std::uint32_t i, Bytes reserved, Bytes request) {
      if (reserved <= stage_peak[op.stage] && stage_peak[op.stage] != 0) return;
      stage_peak[op.stage] = reserved;
      r.stage_reserved_peak_op[op.stage] = i;
      r.stage_allocated_at_peak[op.stage] = st.allocated.current;
      r.stage_held_at_peak[op.stage] = allocator->held_for_other_streams(op.stream, request);
    };
    auto store_peaks = [&] {
      r.reserved_peak = reserved_peak;
      r.reserved_peak_op = reserved_peak_op;
      r.live_peak = live_peak;
      r.device_peak = device_peak;
    };

    for (std::uint32_t i = 0; i < n_ops; ++i) {
      const Op& op = ops[i];
      const bool judged = !is_transition(op);
      // Other processes take and give back memory at their time (a run with events is timed).
      if constexpr (kTimed) {
        for (; next_event < n_events && events[next_event].at_us <= now_us; ++next_event) {
          const OthersEvent& ev = events[next_event];
          if (!ev.take) {
            device.others_release(ev.bytes);
            continue;
          }
          const Bytes free_then = device.free();
          if (!device.others_take(ev.bytes) && kDynamic) {
            r.dynamic->others_failures.push_back(
                others_failure(i, now_us, ev.bytes, free_then, *aimdo, device.spec().used_by_others != others_at_poll));
          }
        }
      }
      if (judged && op.stage != entered_stage && !stage_entered[op.stage]) {
        entered_stage = op.stage;
        stage_entered[op.stage] = 1;
        r.stage_entry_reserved[op.stage] = st.reserved.current;
      }
      const bool runs = !kDynamic || op.when == When::always || dynamic->runs(op);
      // An op with no memory effect (a copy, conversion or compute on the modelled device, or a
      // conditional op that does not run: 35 to 40 % of a campaign's ops) leaves the allocator,
      // the live bytes and aimdo as they were, so of the figures below only its stage's peak (set
      // at a stage's first op) and the device's use (after other processes' events at its start,
      // or the baseline when it is a program's first op) can move: it skips the switch and the rest.
      if (!record_trace && (!runs || memory_neutral(op.kind))) {
        if (kTimed && runs && op_takes_time(op.kind)) now_us += clock->duration_us(p, op, 0);
        const Bytes reserved = st.reserved.current;
        if (judged) note_stage_peak(op, i, reserved, 0);
        if (device.device_used() > device_peak) device_peak = device.device_used();
        continue;
      }
      Bytes moved = 0;
      try {
        // Allocations and frees (about 80 % of the ops that get here) by two tests ahead of the
        // switch: its indirect jump among them mispredicted often.
        const OpKind kind = runs ? op.kind : OpKind::sync;
        if (kind == OpKind::alloc) {
          const Bytes bytes = buffers[op.buffer].bytes;
          if (!allocator->malloc(op.buffer, bytes, op.stream)) {
            const sim::OomInfo info = allocator->last_oom().value_or(sim::OomInfo{});
            // What the request met: the device and the pool before a failed growth's kept chunks.
            r.oom = OomEvent{i, bytes, device.free() + info.retained, allocator->stats().reserved.current - info.retained,
                             allocator->stats().allocated.current, info.detail, allocator->held_at_oom(op.stream, bytes)};
            oomed = true;
            if constexpr (kDynamic) account(op, "torch allocation", bytes);
          } else {
            live += bytes;
            if constexpr (kDynamic) {
              live_tensors.add(buffers[op.buffer]);
              live_buffer[op.buffer] = 1;
            }
          }
        } else if (kind == OpKind::free) {
          if (!kDynamic || live_buffer[op.buffer]) {  // else a conditional buffer that was never made
            allocator->free(op.buffer);
            live -= buffers[op.buffer].bytes;
            if constexpr (kDynamic) {
              live_tensors.remove(buffers[op.buffer]);
              live_buffer[op.buffer] = 0;
            }
          }
        } else {
          switch (kind) {
            case OpKind::alloc:
            case OpKind::free: break;  // above
            case OpKind::wait: allocator->stream_wait(op.stream, op.target); break;
            case OpKind::sync:
              if (runs) allocator->synchronize();
              break;
            case OpKind::empty_cache: allocator->empty_cache(); break;
            case OpKind::flush_if_cached: {
              const Bytes cached = sat_sub(st.reserved.current, st.active.current);
              if (static_cast<double>(cached) > kCacheFlushShare * static_cast<double>(device.free() + cached)) {
                allocator->empty_cache();
              }
              break;
            }
            case OpKind::vbar_prioritize:
            case OpKind::vbar_fault:
            case OpKind::vbar_unpin:
            case OpKind::vbar_free:
            case OpKind::node_end: {
              if constexpr (kDynamic) {
                const DynamicRuntime::Result res = dynamic->execute(op);
                moved = res.moved;
                if (!res.ok) {
                  r.oom = OomEvent{i, res.request, device.free(), allocator->stats().reserved.current, allocator->stats().allocated.current,
                                   res.detail, allocator->held_at_oom(op.stream, res.request)};
                  oomed = true;
                  account(op, res.failure, res.request);
                }
              } else {
                throw InfraError("a dynamic VRAM op in a classic program");
              }
              break;
            }
            case OpKind::h2d:
            case OpKind::upcast:
            case OpKind::dequant:
            case OpKind::compute: break;  // no memory effect on the model of the device
          }
        }
      } catch (const std::exception& e) {
        r.error = fmt::format("op {}: {}", i, e.what());
        r.ops_executed = i;
        r.final_stats = allocator->stats();
        store_peaks();
        return true;
      }
      // Modelled time: what dynamic VRAM's polls and other processes' events run by, and the trace's
      // t column; a classic case without events that keeps no trace has no use for it.
      if (kTimed && runs && op_takes_time(op.kind)) now_us += clock->duration_us(p, op, moved);
      if (kDynamic && am->stats().polls != poll_seen) {
        poll_seen = am->stats().polls;
        others_at_poll = device.spec().used_by_others;
      }
      const Bytes reserved = st.reserved.current;
      if (judged) note_stage_peak(op, i, reserved, runs ? op_request(p, op) : 0);
      if (reserved > reserved_peak) {
        reserved_peak = reserved;
        reserved_peak_op = i;
      }
      if (live > live_peak) live_peak = live;
      if (device.device_used() > device_peak) device_peak = device.device_used();
      if (record_trace) {
        TraceRow row{i, live, st.allocated.current, st.reserved.current, device.device_used()};
        if constexpr (kDynamic) {
          row.vbar = am->vbar_resident();
          row.cast = am->cast_bytes();
        }
        row.time_us = now_us;
        if (runs && op.kind == OpKind::alloc) trace_held = allocator->held_for_other_streams(op.stream, op_request(p, op));
        // A release since (empty_cache, a flush, a trim at sync) can leave less unallocated.
        row.held = std::min(trace_held, sat_sub(st.reserved.current, st.allocated.current));
        r.trace.push_back(row);
      }
      if (oomed) {
        r.ops_executed = i + 1;
        break;
      }
    }
    store_peaks();
    return false;
  };
  const bool failed = p.dynamic ? run_ops.template operator()<true, true>()
                      : timed             ? run_ops.template operator()<false, true>()
                                          : run_ops.template operator()<false, false>();
  if (failed) return r;
  if (!r.oom) r.ops_executed = static_cast<std::uint32_t>(p.ops.size());
  r.allocated_peak = alloc->stats().allocated.peak;
  r.final_stats = alloc->stats();
  if (r.dynamic) fill_dynamic_report(*r.dynamic, *aimdo, *dyn, now_us);
  return r;
}

std::string format_trace(const Scenario& s, const Program& p, const ExecResult& r, std::uint32_t first, std::uint32_t last) {
  std::string out;
  Bytes prev_reserved = 0, prev_vbar = 0, prev_cast = 0;
  const bool dynamic = r.dynamic.has_value();
  for (const TraceRow& row : r.trace) {
    const Op& op = p.ops[row.op];
    const bool shown = row.op >= first && row.op <= last;
    const bool aimdo_moved = dynamic && (row.vbar != prev_vbar || row.cast != prev_cast || op.kind == OpKind::vbar_fault);
    const bool oom_here = r.oom && r.oom->op == row.op;
    if (shown && (op.kind == OpKind::alloc || op.kind == OpKind::free || row.reserved != prev_reserved || aimdo_moved || oom_here)) {
      const std::int64_t delta = static_cast<std::int64_t>(row.reserved) - static_cast<std::int64_t>(prev_reserved);
      const Bytes module = op.buffer != kNone && op.kind != OpKind::compute ? p.buffers[op.buffer].bytes : 0;
      out += fmt::format("[{} {}] reserved: {:.2f} MB ({}{:.2f} MB), allocated: {:.2f} MB, live: {:.2f} MB, {} {:.2f} MB  {}{}{}\n",
                         phase_name(op.phase), row.op, to_mib(row.reserved), delta < 0 ? "- " : "+ ",
                         std::abs(static_cast<double>(delta)) / MiB, to_mib(row.allocated), to_mib(row.live),
                         op_kind_name(op.kind), to_mib(module), describe_op(s, p, row.op),
                         dynamic ? fmt::format("  [vbar {:.0f} MB, cast {:.0f} MB, t {:.1f} ms]", to_mib(row.vbar), to_mib(row.cast),
                                               static_cast<double>(row.time_us) / 1e3)
                                 : std::string(),
                         oom_here ? "   <-- OOM" : "");
    }
    prev_reserved = row.reserved;
    prev_vbar = row.vbar;
    prev_cast = row.cast;
  }
  return out;
}

}  // namespace vf

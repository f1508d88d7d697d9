// The oracle: P1 (the allocator's measured reserved peak <= predicted peak + reserve, per checked
// stage) and P2 (no OOM where the plan said it fits). A verdict carries a signature that
// identifies the bug across shrinking: kind + phase + activity + allocator mode.
#pragma once

#include <cstdint>
#include <string>

#include "harness/exec.h"
#include "harness/lower.h"
#include "harness/predict.h"
#include "harness/scenario.h"

namespace vf {

// waste: class C, over-reservation (judge_waste in oracle.cpp): no OOM and no violation, but the
// plan offloaded modules that the buffer it over-reserved could have held. A finding of lower
// severity (reports/summary.cpp: a tenth of its unused bytes' share of the device).
// knee: class G, the resolution knee (run_case in harness/campaign.cpp): the case, the smaller
// workload of a pair (Scenario::knee_of), is a violation or OOM where the same case at the larger
// workload passes. Its bytes are the smaller case's.
enum class VerdictKind : std::uint8_t { pass, violation, oom, error, waste, knee };
std::string_view verdict_kind_name(VerdictKind k);

struct Verdict {
  VerdictKind kind = VerdictKind::pass;
  std::string signature;       // "violation:forward:upcast:raw"; empty for pass
  std::int64_t overshoot = 0;  // measured - (predicted + reserve) at the judged stage, bytes (waste: the unused buffer)
  std::uint32_t stage = 0;     // the judged stage
  std::uint32_t op = 0;        // the op of the stage peak, or the failing alloc
  Bytes measured = 0;          // the stage's reserved peak
  Bytes predicted = 0;         // the stage's predicted peak
  Bytes reserve = 0;
  bool expected_oom = false;   // an OOM where the plan said it does not fit: not a finding
  std::string message;         // one line for people
  // Findings: why, in a paragraph (the first of a repro.md): what the dynamic mechanism in the
  // signature did, or what a classic peak is made of against the plan's budget; empty otherwise.
  std::string explanation;
  // What the verdict rests on: exact bytes, a modelled allocator, a modelled activation.
  std::string rests_on;
  // Findings: the cause in one line, for tables (the largest over-budget category of a classic
  // peak, harness/attribution.h; a dynamic finding's mechanism with its bytes).
  std::string cause;
  // Findings checked by check_activation_dependence (harness/campaign.h): the verdict of the same
  // case with every forward's activations capped at the predictor's budget ("pass", "expected
  // OOM", a signature, or "within budget": none was over it), and whether that is no finding.
  // Unchecked: at_budget is empty.
  std::string at_budget;
  bool activation_dependent = false;
  // A knee finding: the verdict the case had on its own (its violation or OOM signature, or
  // "expected OOM"), and what the larger workload gave ("pass", or its waste signature).
  std::string knee_small;
  std::string knee_large;
  bool finding() const {
    return kind == VerdictKind::violation || kind == VerdictKind::oom || kind == VerdictKind::waste || kind == VerdictKind::knee;
  }
};

// What an op was doing, for signatures: alloc ops are named after the buffer they create
// (weight -> load, transfer -> h2d, convert -> upcast/dequant, lora -> lora, activation -> compute).
std::string_view op_activity(const Scenario& s, const Program& p, std::uint32_t op);

// An activation-dependent finding's sentence (Verdict::activation_dependent): what the case gives
// with its activations at the predictor's estimate, and what that means for filing it.
std::string activation_dependence_text(const Verdict& v);

Verdict judge(const Scenario& s, const Plan& plan, const Program& p, const ExecResult& r);

}  // namespace vf

#include <cmath>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/cli/commands.h"
#include "harness/core/error.h"
#include "harness/sim/allocator.h"

namespace vf::cli {

// CLI11 (2.1) reads "-5" into an unsigned option as 2^64 - 5: refuse a sign before it converts.
const CLI::Validator kNonNegative(
    [](std::string& v) {
      const auto first = v.find_first_not_of(" \t");
      return first != std::string::npos && v[first] == '-' ? std::string("must not be negative, got " + v) : std::string();
    },
    "NONNEGATIVE");

// A count that must be at least 1 (0 would otherwise mean "the default" somewhere downstream).
const CLI::Validator kPositiveCount(
    [](std::string& v) {
      const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
      return digits && v.find_first_not_of('0') != std::string::npos ? std::string()
                                                                       : std::string("must be a whole number of at least 1, got " + v);
    },
    "COUNT");

void PolicyFlags::add_to(CLI::App& app, bool with_allocator) {
  app.add_option("--policy", policy, "predictor: comfy:oct2025 | comfy:nov2025 | comfy:dec2025 | exact[:PRESET]");
  app.add_option("--reserve", reserve, "override the reserve (e.g. 600MiB)");
  app.add_option("--set", sets, "override a policy constant: key=value (repeatable)");
  if (with_allocator) {
    app.add_option("--allocator", allocator, "allocator mode: raw | caching | caching-expandable | async");
    app.add_option("--option", options, "allocator option: key=value (repeatable), e.g. max_split_size_mb=128");
  }
}

void PolicyFlags::apply(Scenario& s) const {
  if (!policy.empty()) {
    const auto overrides = s.policy.overrides;
    s.policy = parse_policy(policy, "--policy");
    for (const auto& [k, v] : overrides) {
      // exact_reserve means something to `exact` only (a fuzz-import repro carries `bound`):
      // under another predictor the file's own reserve rules, as `reserve` does.
      if (k == "exact_reserve" && s.policy.predictor != PredictorKind::exact) {
        spdlog::warn("--policy {}: the scenario's exact_reserve={} applies to the exact predictor only; dropped", policy, v);
        continue;
      }
      apply_policy_override(s.policy, k, v, "--policy");
    }
  }
  if (!reserve.empty()) {
    (void)parse_size(reserve, "--reserve");  // a bad value is reported as "--reserve: ...", not "--reserve.reserve"
    apply_policy_override(s.policy, "reserve", reserve, "--reserve");
  }
  for (const std::string& kv : sets) {
    const auto [k, v] = split_kv(kv, "--set");
    apply_policy_override(s.policy, k, v, "--set");
  }
  if (!allocator.empty()) {
    const AllocatorMode m = parse_allocator_mode_field(allocator, "--allocator");
    if (m != s.allocator.mode) s.allocator.options.clear();
    s.allocator.mode = m;
  }
  for (const std::string& kv : options) {
    auto [k, v] = split_kv(kv, "--option");
    bool replaced = false;
    for (auto& [ok, ov] : s.allocator.options) {
      if (ok == k) {
        ov = v;
        replaced = true;
      }
    }
    if (!replaced) s.allocator.options.emplace_back(k, v);
  }
  sim::validate_allocator_config(s.allocator, "--option");
}

std::pair<std::string, std::string> split_kv(const std::string& kv, const std::string& flag) {
  const auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) throw InputError(flag, fmt::format("expected key=value, got \"{}\"", kv));
  return {kv.substr(0, eq), kv.substr(eq + 1)};
}

double parse_duration(const std::string& text, const std::string& flag) {
  if (text.empty()) throw InputError(flag, "empty duration");
  double scale = 1;
  std::string num = text;
  switch (text.back()) {
    case 's': num.pop_back(); break;
    case 'm': scale = 60; num.pop_back(); break;
    case 'h': scale = 3600; num.pop_back(); break;
    default: break;
  }
  double v = 0;
  try {
    std::size_t used = 0;
    v = std::stod(num, &used);
    if (used != num.size()) throw std::invalid_argument("junk");
  } catch (const std::exception&) {
    throw InputError(flag, fmt::format("not a duration: \"{}\" (examples: 60s, 5m, 1h)", text));
  }
  if (!std::isfinite(v) || v <= 0) throw InputError(flag, fmt::format("duration must be positive: \"{}\"", text));
  return v * scale;
}

}  // namespace vf::cli

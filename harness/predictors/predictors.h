// The predictors behind predict() (harness/predict.h), one file each: classic ComfyUI
// (comfy_classic.cpp), exact (exact.cpp). predict.cpp picks one by the scenario's policy.
#pragma once

#include <algorithm>
#include <array>
#include <compare>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "harness/predict.h"

namespace vf {

// ComfyUI's classic accounting for every stage of `s` (presets oct2025 .. dec2025).
Plan plan_comfy_classic(const Scenario& s);

// Dynamic VRAM (comfy_dynamic.cpp): ModelPatcherDynamic.load of model `m` at `stage`, with
// `free_before` free memory (predictor's view). Fills `dynamic`, `staging`, `resident` (the
// force-loaded modules), `loaded` (their bytes: torch tensors) and the log line.
LoadPlan stage_dynamic(const Scenario& s, std::uint32_t stage, std::uint32_t m, Bytes free_before);
// The activation of a dynamic stage: the cond batch (1.5 rule) and the VAE decode batch from the
// patcher's free memory, which counts every VBAR-resident byte as free.
void fill_dynamic_activation(const Scenario& s, StagePlan& sp, Bytes patcher_free);

// Sizes the forward's activations from the scenario's source (harness/activation_source.h), once
// activation_allowance (the predictor's own activation budget for the stage's rows) is set.
// Sets activation_bytes, activation_formula and activation.
void size_stage_activation(const Scenario& s, StagePlan& sp);

// `exact`: replaces the predicted peaks of a classic plan with the lowered program's exact live
// peaks and sets the exact reserve; `limit_need` is what a memory-fraction check can see.
void refine_exact(const Scenario& s, Plan& plan, Bytes& limit_need);

// The order of a load walk: `order` (module indices) sorted by three keys, ascending, then by
// module name (descending when `names_descending`). The keys are computed once per module into
// one contiguous array, with 16 bytes of each name taken after the prefix all the order's names
// share ("blocks." in "blocks.N.lin"), so a sort over a large model (whose equal-sized blocks tie
// on every key) compares in that array and reads a module's name only where those 16 bytes tie
// too: chasing every comparison into `modules` made the sort of 1,000,000 modules cache-bound.
struct WalkKey {
  std::uint64_t k0 = 0, k1 = 0, k2 = 0;
  auto operator<=>(const WalkKey&) const = default;  // k0, then k1, then k2
};
// A model with name ranks (ModelSpec::name_rank, the catalog's) is sorted by them instead, in
// the same order: its names are never read.
template <class KeyOf>
void sort_walk(std::vector<std::uint32_t>& order, const ModelSpec& model, KeyOf key_of, bool names_descending) {
  const std::vector<Module>& modules = model.modules;
  if (model.name_rank.size() == modules.size()) {
    struct Ranked {
      WalkKey key;
      std::uint32_t rank;
      std::uint32_t index;
    };
    std::vector<Ranked> entries;
    entries.reserve(order.size());
    for (const std::uint32_t i : order) entries.push_back(Ranked{key_of(i), model.name_rank[i], i});
    std::sort(entries.begin(), entries.end(), [&](const Ranked& a, const Ranked& b) {
      if (const auto c = a.key <=> b.key; c != 0) return c < 0;
      return names_descending ? a.rank > b.rank : a.rank < b.rank;
    });
    for (std::size_t k = 0; k < entries.size(); ++k) order[k] = entries[k].index;
    return;
  }
  constexpr std::size_t kWindow = 16;
  struct Entry {
    WalkKey key;
    // Bytes [shared, shared + 16) of the name, 0-padded, as two big-endian words: comparing the
    // words compares the bytes as unsigned, in order.
    std::uint64_t name_hi = 0, name_lo = 0;
    std::uint32_t index;
  };
  std::size_t shared = order.empty() ? 0 : modules[order.front()].name.size();
  for (const std::uint32_t i : order) {
    const std::string& a = modules[order.front()].name;
    const std::string& n = modules[i].name;
    std::size_t k = 0;
    const std::size_t up_to = std::min(shared, n.size());
    while (k < up_to && a[k] == n[k]) ++k;
    shared = k;
  }
  std::vector<Entry> entries;
  entries.reserve(order.size());
  for (const std::uint32_t i : order) {
    std::array<unsigned char, kWindow> window{};
    const std::string& n = modules[i].name;
    if (n.size() > shared) std::memcpy(window.data(), n.data() + shared, std::min(kWindow, n.size() - shared));
    std::uint64_t hi = 0, lo = 0;
    for (std::size_t b = 0; b < 8; ++b) {
      hi = hi << 8 | window[b];
      lo = lo << 8 | window[8 + b];
    }
    entries.push_back(Entry{key_of(i), hi, lo, i});
  }
  std::sort(entries.begin(), entries.end(), [&](const Entry& a, const Entry& b) {
    if (const auto c = a.key <=> b.key; c != 0) return c < 0;
    // Where the windows differ, they order the names as std::string does (bytes unsigned; a
    // name that ends first is padded with 0 and sorts first unless the other has a 0 there,
    // which makes the windows equal); equal windows compare the whole names.
    int c = a.name_hi != b.name_hi ? (a.name_hi < b.name_hi ? -1 : 1) : a.name_lo != b.name_lo ? (a.name_lo < b.name_lo ? -1 : 1) : 0;
    if (c == 0) c = modules[a.index].name.compare(modules[b.index].name);
    return names_descending ? c > 0 : c < 0;
  });
  for (std::size_t k = 0; k < entries.size(); ++k) order[k] = entries[k].index;
}

}  // namespace vf

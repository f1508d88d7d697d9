// The comfy predictor's rules one at a time, with hand-computed numbers.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "harness/campaign.h"
#include "harness/scenario.h"

namespace vf {
namespace {

// A module with one 2-D weight of `rows` x `cols` elements in `dtype`.
std::string module_json(std::string_view name, std::uint64_t rows, std::uint64_t cols, std::string_view dtype) {
  return fmt::format(R"({{"name": "{}", "tensors": [{{"name": "weight", "shape": [{}, {}], "dtype": "{}"}}]}})", name,
                     rows, cols, dtype);
}

std::string model_json(std::string_view id, std::string_view kind, const std::vector<std::string>& modules,
                       std::string_view compute = "bf16", bool lora = false) {
  std::string mods;
  for (const std::string& m : modules) mods += (mods.empty() ? "" : ", ") + m;
  return fmt::format(
      R"({{"id": "{}", "kind": "{}", "memory_usage_factor": 1.0, "compute": "{}", "lora": {},
          "arch": {{"latent_channels": 16, "hidden": 64, "widest": 192, "text_tokens": 0, "patch": 2}},
          "modules": [{}]}})",
      id, kind, compute, lora ? "true" : "false", mods);
}

Scenario scenario(std::string_view device, const std::vector<std::string>& models, std::string_view pipeline,
                  std::string_view policy = "comfy:dec2025", std::string_view extra = "") {
  std::string ms;
  for (const std::string& m : models) ms += (ms.empty() ? "" : ", ") + m;
  const std::string text = fmt::format(
      R"({{"device": {{"total": "{}", "context_overhead": 0}}, "allocator": "raw",
          "policy": {{"name": "{}", "overrides": {{"reserve": "10MiB", "inference_floor": "10MiB"}}}},
          "models": [{}], "pipeline": {} {}}})",
      device, policy, ms, pipeline, extra);
  Catalog catalog;
  return parse_scenario_json(text, catalog, "test");
}

TEST(Predict, PresetConstants) {
  const ComfyConstants oct = preset_constants(Preset::oct2025);
  EXPECT_EQ(oct.weight_floor, 128 * MiB);
  EXPECT_EQ(oct.account, AccountMode::none);
  EXPECT_EQ(oct.num_streams, 0u);
  EXPECT_FALSE(oct.dequant_term);
  EXPECT_EQ(oct.lora_patch_dtype, Dtype::fp32);
  const ComfyConstants nov = preset_constants(Preset::nov2025);
  EXPECT_EQ(nov.account, AccountMode::largest);
  EXPECT_EQ(nov.num_streams, 2u);
  const ComfyConstants dec = preset_constants(Preset::dec2025);
  EXPECT_EQ(dec.account, AccountMode::lookahead);
  EXPECT_TRUE(dec.dequant_term);
  EXPECT_TRUE(dec.patch_sync);
  for (const ComfyConstants& c : {oct, nov, dec}) {
    EXPECT_EQ(c.reserve, 400 * MiB);
    EXPECT_EQ(c.inference_floor, 858993459u);  // 0.8 GiB as ComfyUI computes it
    EXPECT_DOUBLE_EQ(c.unload_factor, 1.1);
  }
}

TEST(Predict, OffloadCostTerms) {
  Module m;
  m.tensors.push_back(Tensor{"weight", {4096, 4096}, Dtype::fp8_e4m3fn, TensorRole::weight, 4096u * 4096u, 16 * MiB});
  m.tensors.push_back(Tensor{"scale_weight", {}, Dtype::fp32, TensorRole::scale, 1, 4});
  m.tensors.push_back(Tensor{"bias", {4096}, Dtype::bf16, TensorRole::bias, 4096, 8192});
  m.bytes = 16 * MiB + 4 + 8192;
  const ComfyConstants dec = preset_constants(Preset::dec2025);
  // #11171: + one compute copy of weight (16 M x 2 B) and bias (4096 x 2 B is already bf16: 0).
  EXPECT_EQ(offload_cost(m, Dtype::bf16, false, dec), m.bytes + 32 * MiB);
  // fp32 compute: the weight copy is 64 MiB and the bf16 bias is converted too (16 KiB).
  EXPECT_EQ(offload_cost(m, Dtype::fp32, false, dec), m.bytes + 64 * MiB + 16384);
  // A LoRA-patched weight: numel x bf16 x LOWVRAM_PATCH_ESTIMATE_MATH_FACTOR (2) = 64 MiB.
  EXPECT_EQ(offload_cost(m, Dtype::bf16, true, dec), m.bytes + 64 * MiB);
  // Before #11171 the cost was module_mem alone.
  EXPECT_EQ(offload_cost(m, Dtype::bf16, false, preset_constants(Preset::nov2025)), m.bytes);
}

TEST(Predict, EvictionUnloadsCheapestModulesUntilTheShortfallIsCovered) {
  // Model A: 2 + 8 + 30 MiB (bf16), model B: 40 MiB. Device 100 MiB, R = 10, floor 10: I = 20.
  // Loading B: free 60 < 1.1 x 40 + 20 = 64, shortfall 4 MiB: A gives up a1 (2 MiB, not enough)
  // and a2 (8 MiB): 10 MiB evicted, free 70, budget 70 - 20 = 50 > 40: B loads completely.
  const Scenario s = scenario(
      "100MiB",
      {model_json("A", "text_encoder",
                  {module_json("a1", 1024, 1024, "bf16"), module_json("a2", 2048, 2048, "bf16"),
                   module_json("a3", 3840, 4096, "bf16")}),
       model_json("B", "text_encoder", {module_json("b1", 5120, 4096, "bf16")})},
      R"([{"op":"load","model":"A"},{"op":"forward","model":"A"},{"op":"load","model":"B"},{"op":"forward","model":"B"}])");
  const Plan p = predict(s);
  ASSERT_EQ(p.loads.size(), 2u);
  EXPECT_TRUE(p.loads[0].full_load);
  EXPECT_EQ(p.loads[1].free_before, 60 * MiB);
  ASSERT_EQ(p.loads[1].evictions.size(), 1u);
  EXPECT_EQ(p.loads[1].evictions[0].model, 0u);
  EXPECT_EQ(p.loads[1].evictions[0].modules, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(p.loads[1].evictions[0].bytes, 10 * MiB);
  EXPECT_TRUE(p.loads[1].full_load);
  EXPECT_EQ(p.loads[1].usable, static_cast<std::int64_t>(50 * MiB));
  EXPECT_EQ(p.stages[3].resident_total, 70 * MiB);  // a3 30 + B 40
  // Lowering frees the evicted weights, then empties the cache (soft_empty_cache).
  const Program prog = lower(s, p);
  EXPECT_EQ(check_program(prog), "");
  int evict_frees = 0, empties = 0;
  for (const Op& op : prog.ops) {
    if (op.phase == Phase::evict && op.kind == OpKind::free) ++evict_frees;
    if (op.phase == Phase::evict && op.kind == OpKind::empty_cache) ++empties;
  }
  EXPECT_EQ(evict_frees, 2);
  EXPECT_EQ(empties, 1);
}

TEST(Predict, LargestAccountingBuffersNsTimesTheLargestModule) {
  // nov2025 with NS = 2: the first miss reserves cost + 2 x largest module_mem.
  // Modules 32, 8, 8 MiB (bf16, compute bf16: cost = mem); budget 100 - 20 = 80... too big, so
  // the device is 56 MiB: budget 36 MiB. Walk: big: 32 + (32 + 64) >= 36 -> off, buffer 96;
  // then every module misses (8 + 96 >= 36): all offloaded, buffer 96 MiB.
  const Scenario s = scenario(
      "56MiB",
      {model_json("M", "text_encoder",
                  {module_json("big", 4096, 4096, "bf16"), module_json("s1", 2048, 2048, "bf16"),
                   module_json("s2", 2048, 2048, "bf16")})},
      R"([{"op":"load","model":"M"},{"op":"forward","model":"M"}])", "comfy:nov2025");
  const Plan p = predict(s);
  EXPECT_EQ(p.loads[0].usable, static_cast<std::int64_t>(36 * MiB));
  EXPECT_EQ(p.loads[0].offload_buffer, 96 * MiB);
  EXPECT_EQ(p.loads[0].loaded, 0u);
  EXPECT_FALSE(p.fits);  // 0 + 96 + 10 floor + 10 reserve > 56
}

TEST(Predict, CondBatchingFollowsTheOnePointFiveRule) {
  // Diffusion model, 1024x1024, cfg 3.5: memory_required(2) = 128^2 x 2 x 2 B x 0.01 MiB
  // = 655.36 MiB; batched only while 1.5 x 655.36 = 983.04 MiB < free memory.
  auto make = [&](std::string_view device) {
    return scenario(device, {model_json("D", "diffusion", {module_json("w", 1024, 1024, "bf16")})},
                    R"([{"op":"load","model":"D"},{"op":"forward","model":"D"}])", "comfy:dec2025",
                    R"(, "workload": {"width": 1024, "height": 1024, "batch": 1, "cfg": 3.5})");
  };
  const Plan big = predict(make("2GiB"));  // free 2048 - 2 = 2046 MiB > 983 -> batched
  EXPECT_EQ(big.stages[1].run_batch, 2u);
  EXPECT_EQ(big.stages[1].passes, 1u);
  EXPECT_EQ(big.stages[1].activation_allowance, 687194767u);  // 655.36 MiB
  const Plan small = predict(make("900MiB"));  // free 898 MiB < 983 -> cond and uncond apart
  EXPECT_EQ(small.stages[1].run_batch, 1u);
  EXPECT_EQ(small.stages[1].passes, 2u);
  EXPECT_EQ(small.stages[1].activation_allowance, 343597383u);  // 327.68 MiB
  // Two passes lower to two activation buffers, one after the other.
  const Program prog = lower(make("900MiB"), small);
  int activations = 0;
  for (const Op& op : prog.ops) activations += op.kind == OpKind::alloc && prog.buffers[op.buffer].kind == BufferKind::activation;
  EXPECT_EQ(activations, 2);
}

TEST(Predict, LoraMergeAtLoadAndLowVramPatchesWhenOffloaded) {
  // dec2025 merges LoRA in fp16 with a sync after each module; a resident [4096, 4096] weight
  // gets a 32 MiB copy and a 32 MiB result in the patch phase.
  const Scenario s = scenario("1GiB", {model_json("L", "text_encoder", {module_json("w", 4096, 4096, "fp8_e4m3fn")}, "bf16", true)},
                              R"([{"op":"load","model":"L"},{"op":"forward","model":"L"}])");
  const Plan p = predict(s);
  ASSERT_TRUE(p.loads[0].full_load);
  const Program prog = lower(s, p);
  std::vector<Bytes> patch_allocs;
  int syncs = 0;
  for (const Op& op : prog.ops) {
    if (op.phase == Phase::patch && op.kind == OpKind::alloc) patch_allocs.push_back(prog.buffers[op.buffer].bytes);
    syncs += op.phase == Phase::patch && op.kind == OpKind::sync;
  }
  EXPECT_EQ(patch_allocs, (std::vector<Bytes>{32 * MiB, 32 * MiB}));
  EXPECT_EQ(syncs, 1);
  // Squeezed onto a small device, the module is offloaded and counts as a lowvram patch.
  const Scenario tight = scenario("30MiB", {model_json("L", "text_encoder", {module_json("w", 4096, 4096, "fp8_e4m3fn")}, "bf16", true)},
                                  R"([{"op":"load","model":"L"},{"op":"forward","model":"L"}])");
  const Plan tp = predict(tight);
  EXPECT_EQ(tp.loads[0].loaded, 0u);
  EXPECT_EQ(tp.loads[0].lowvram_patches, 1u);
  // Forward of the offloaded LoRA weight: transfer 16 MiB (fp8) + its private bf16 cast copy 32
  // + the LoRA delta 32 = 80 MiB of transients, what ComfyUI's cost budgets (16 + 32 x 2).
  EXPECT_EQ(tp.loads[0].realistic_transient, 80 * MiB);
  EXPECT_EQ(tp.loads[0].offload_buffer, 80 * MiB);
}

}  // namespace
}  // namespace vf

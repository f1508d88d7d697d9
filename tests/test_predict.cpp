// The comfy predictor's rules one at a time, with hand-computed numbers.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "harness/campaign.h"
#include "harness/core/error.h"
#include "harness/generate.h"
#include "harness/predictors/predictors.h"
#include "harness/predictors/walk_memo.h"
#include "harness/scenario.h"
#include "models/activation.h"
#include "models/catalog.h"

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

// The walk's sort reads 16 bytes of each name after the prefix all share, and the whole names
// only where those tie: it must order exactly as comparing the whole names does, for names that
// differ inside the window, after it, end inside it, are prefixes of others, or hold a NUL.
TEST(Predict, WalkOrderTiesBreakByTheWholeName) {
  std::vector<Module> modules;
  const std::string tail(20, 'x');
  for (const std::string& name :
       {std::string("blocks.1.lin"), std::string("blocks.10.lin"), std::string("blocks.2.lin"), std::string("blocks.1"),
        std::string("blocks.1.lin.x"), "blocks." + tail + "1", "blocks." + tail + "2", "blocks." + tail, std::string("blocks.1\0", 9),
        std::string("blocks.1\0a", 10), std::string("blocks.\xff"), std::string("blocks.")}) {
    Module m;
    m.name = name;
    m.bytes = m.name.size() % 3 == 0 ? 512 : 1024;  // two tie groups
    modules.push_back(std::move(m));
  }
  // Through the windows, and through the name ranks the catalog's models carry (set_name_ranks).
  ModelSpec model;
  model.modules = modules;
  for (const bool ranked : {false, true}) {
    if (ranked) set_name_ranks(model);
    for (const bool descending : {false, true}) {
      std::vector<std::uint32_t> got(modules.size());
      std::iota(got.begin(), got.end(), 0u);
      std::vector<std::uint32_t> want = got;
      sort_walk(got, model, [&](std::uint32_t i) { return WalkKey{modules[i].bytes, 0, 0}; }, descending);
      std::sort(want.begin(), want.end(), [&](std::uint32_t a, std::uint32_t b) {
        if (modules[a].bytes != modules[b].bytes) return modules[a].bytes < modules[b].bytes;
        return descending ? modules[a].name > modules[b].name : modules[a].name < modules[b].name;
      });
      EXPECT_EQ(got, want) << (descending ? "descending" : "ascending") << (ranked ? ", ranked" : "");
    }
  }
}

// The catalog's models sort their walks by name ranks: the same orders as by their names, for
// every catalog model under keys that tie often (bytes alone, and none).
TEST(Predict, CatalogNameRanksOrderAsTheNamesDo) {
  for (const CatalogEntry& e : catalog_entries()) {
    const ModelSpec ranked = build_catalog_model(e.name, StorageChoice{Dtype::fp8_e4m3fn, true}, "model");
    ASSERT_EQ(ranked.name_rank.size(), ranked.modules.size()) << e.name;
    ModelSpec plain = ranked;
    plain.name_rank.clear();
    for (const bool by_bytes : {false, true}) {
      for (const bool descending : {false, true}) {
        std::vector<std::uint32_t> a(ranked.modules.size());
        std::iota(a.begin(), a.end(), 0u);
        std::vector<std::uint32_t> b = a;
        const auto key = [&](std::uint32_t i) { return WalkKey{by_bytes ? ~ranked.module_sizes[i] : 0, 0, 0}; };
        sort_walk(a, ranked, key, descending);
        sort_walk(b, plain, key, descending);
        EXPECT_EQ(a, b) << e.name;
      }
    }
  }
  // An edit empties the ranks: finalizing again cannot know the names' new order.
  ModelSpec edited = build_catalog_model("flux1-dev", StorageChoice{Dtype::bf16, true}, "model");
  edited.modules.erase(edited.modules.begin());
  finalize_model(edited, "model");
  EXPECT_TRUE(edited.name_rank.empty());
}

// Load-walk orders are remembered per thread (harness/predictors/walk_memo.h): one sort per
// model and key, and a new one for anything the order depends on.
TEST(Predict, AWalkOrderIsSortedOnceForEachModelAndWhatItDependsOn) {
  auto model = std::make_shared<ModelSpec>();
  model->name = "memo";
  for (const char* name : {"a", "b"}) {
    Module m;
    m.name = name;
    m.tensors.push_back(Tensor{"weight", {64, 64}, Dtype::fp8_e4m3fn, TensorRole::weight, 0, 0});
    model->modules.push_back(std::move(m));
  }
  finalize_model(*model, "memo");
  const std::shared_ptr<const ModelSpec> spec = model;
  int builds = 0;
  auto build = [&](WalkOrder& w) {
    ++builds;
    w.order = {1, 0};
    w.cost = {7, 9};
  };
  ComfyConstants k = preset_constants(Preset::dec2025);
  const WalkOrder& first = memo_walk(spec, WalkFlavor::classic, Dtype::bf16, false, k, build);
  EXPECT_EQ(first.order, (std::vector<std::uint32_t>{1, 0}));
  EXPECT_EQ(first.cost, (std::vector<Bytes>{7, 9}));
  EXPECT_EQ(memo_walk(spec, WalkFlavor::classic, Dtype::bf16, false, k, build).order, (std::vector<std::uint32_t>{1, 0}));
  EXPECT_EQ(builds, 1);
  memo_walk(spec, WalkFlavor::dynamic, Dtype::bf16, false, k, build);
  EXPECT_EQ(builds, 2);
  memo_walk(spec, WalkFlavor::classic, Dtype::fp16, false, k, build);
  EXPECT_EQ(builds, 3);
  memo_walk(spec, WalkFlavor::classic, Dtype::bf16, true, k, build);
  EXPECT_EQ(builds, 4);
  k.lora_math_factor = 3.0;
  memo_walk(spec, WalkFlavor::classic, Dtype::bf16, true, k, build);
  EXPECT_EQ(builds, 5);
  k.dequant_term = false;
  memo_walk(spec, WalkFlavor::classic, Dtype::bf16, true, k, build);
  EXPECT_EQ(builds, 6);
  // The same contents under another spec (a shrink candidate's copy) are sorted again.
  const std::shared_ptr<const ModelSpec> copy = std::make_shared<ModelSpec>(*spec);
  memo_walk(copy, WalkFlavor::classic, Dtype::bf16, true, k, build);
  EXPECT_EQ(builds, 7);
  memo_walk(spec, WalkFlavor::classic, Dtype::bf16, true, k, build);
  EXPECT_EQ(builds, 7);
  // A build that throws leaves nothing behind: the next call builds again.
  const std::shared_ptr<const ModelSpec> other = std::make_shared<ModelSpec>(*spec);
  EXPECT_THROW(memo_walk(other, WalkFlavor::classic, Dtype::bf16, false, k, [](WalkOrder&) { throw InputError("x", "y"); }),
               InputError);
  memo_walk(other, WalkFlavor::classic, Dtype::bf16, false, k, build);
  EXPECT_EQ(builds, 8);
  // The memo does not keep a model alive (a campaign makes a synthetic model per case, a shrinker
  // a copy per candidate).
  std::weak_ptr<const ModelSpec> watch;
  {
    const std::shared_ptr<const ModelSpec> short_lived = std::make_shared<ModelSpec>(*spec);
    watch = short_lived;
    memo_walk(short_lived, WalkFlavor::classic, Dtype::bf16, false, k, build);
  }
  EXPECT_TRUE(watch.expired());
}

// The planners take their walk from the memo: a model whose copy has a module grown (what the
// shrinker's edits make) is walked in its own order, and the original keeps its order after.
TEST(Predict, AnEditedCopyOfAModelIsWalkedInItsOwnOrder) {
  const std::string pipeline = R"([{"op": "load", "model": "A"}])";
  Scenario s = scenario("1GiB", {model_json("A", "text_encoder", {module_json("x", 256, 256, "bf16"), module_json("y", 512, 256, "bf16")})},
                        pipeline);
  EXPECT_EQ(predict(s).loads[0].sorted, (std::vector<std::uint32_t>{1, 0}));  // y (256 KiB) before x (128 KiB)
  auto grown = std::make_shared<ModelSpec>(*s.models[0].spec);
  grown->modules[0].tensors[0].shape = {1024, 256};  // x: 512 KiB
  finalize_model(*grown, "A");
  Scenario edited = s;
  edited.models[0].spec = grown;
  EXPECT_EQ(predict(edited).loads[0].sorted, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(predict(s).loads[0].sorted, (std::vector<std::uint32_t>{1, 0}));
  const Scenario dynamic = scenario("1GiB", {model_json("A", "diffusion", {module_json("x", 256, 256, "bf16"), module_json("y", 512, 256, "bf16")})},
                                    pipeline, "comfy:sep2026");
  Scenario dynamic_edited = dynamic;
  auto grown_dynamic = std::make_shared<ModelSpec>(*dynamic.models[0].spec);
  grown_dynamic->modules[0].tensors[0].shape = {1024, 256};
  finalize_model(*grown_dynamic, "A");
  dynamic_edited.models[0].spec = grown_dynamic;
  EXPECT_EQ(predict(dynamic).loads[0].sorted, (std::vector<std::uint32_t>{1, 0}));
  EXPECT_EQ(predict(dynamic_edited).loads[0].sorted, (std::vector<std::uint32_t>{0, 1}));
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

// A GGUF weight is ComfyUI-GGUF's GGMLTensor, whose numel() counts its packed bytes (run on
// ComfyUI-GGUF 795e451, torch 2.15): the term is packed bytes x the compute size, not the
// dequantized copy the forward makes.
TEST(Predict, AGgufWeightsTermCountsItsPackedBytesAsComfyUiGgufsNumelDoes) {
  const ComfyConstants dec = preset_constants(Preset::dec2025);
  auto gguf = [](Dtype d, Bytes packed) {
    Module m;
    m.tensors.push_back(Tensor{"weight", {3072, 3072}, d, TensorRole::weight, 3072u * 3072u, packed});
    m.bytes = packed;
    return m;
  };
  // q8_0: 3072 rows x 96 blocks x 34 B = 10,027,008 B; the term 2 B each: 20,054,016 (the bf16
  // copy the forward makes is 18,874,368: budgeted 6 % over).
  const Module q8 = gguf(Dtype::q8_0, 3072u * 96u * 34u);
  EXPECT_EQ(offload_cost(q8, Dtype::bf16, false, dec), 10027008u + 20054016u);
  // q6_k: 3072 x 12 blocks x 210 B = 7,741,440 B; the term 15,482,880, 3,391,488 B short of
  // the 18,874,368 B copy.
  const Module q6 = gguf(Dtype::q6_k, 3072u * 12u * 210u);
  EXPECT_EQ(offload_cost(q6, Dtype::bf16, false, dec), 7741440u + 15482880u);
  // LoRA on it: the packed count x 2 B x LOWVRAM_PATCH_ESTIMATE_MATH_FACTOR 2.
  EXPECT_EQ(offload_cost(q6, Dtype::bf16, true, dec), 7741440u + 2u * 15482880u);
  // An fp8 weight's numel() is its logical element count (a torch dtype): unchanged.
  Module f8 = gguf(Dtype::fp8_e4m3fn, 3072u * 3072u);
  EXPECT_EQ(offload_cost(f8, Dtype::bf16, false, dec), 9437184u + 18874368u);
}

TEST(Predict, EvictionUnloadsCheapestModulesUntilTheShortfallAndTheBufferGrowthAreCovered) {
  // Model A: eight 2 MiB modules a1..a8 and a 30 MiB one (bf16, 46 MiB), model B: 40 MiB.
  // Device 106 MiB, R = 10, floor 10: I = 20. A loads completely; free 60. Loading B: 60 < 1.1 x
  // 40 + 20 = 64, shortfall 4 MiB. partially_unload (look-ahead, NS = 2) walks a1, a2, ... and
  // grows A's buffer through a window of the last 2 unloaded sizes, seeded min(0 / 3, 2 MiB) = 0:
  // potentials 2, 4, 6, 6 ... MiB, so it stops only once freed > 4 + 6: after a6, 12 MiB (the
  // old rule, freed >= shortfall, stopped after a2). Free 72, budget 72 - 20 = 52 > 40: B loads
  // completely; A keeps a7, a8 and the 30 MiB module (34 MiB) with a 6 MiB buffer.
  std::vector<std::string> a;
  for (int i = 1; i <= 8; ++i) a.push_back(module_json(fmt::format("a{}", i), 1024, 1024, "bf16"));
  a.push_back(module_json("big", 3840, 4096, "bf16"));
  const std::string pipeline = R"([{"op":"load","model":"A"},{"op":"forward","model":"A"},{"op":"load","model":"B"},{"op":"forward","model":"B"},{"op":"forward","model":"A"}])";
  const std::string b = model_json("B", "text_encoder", {module_json("b1", 5120, 4096, "bf16")});
  const Scenario s = scenario("106MiB", {model_json("A", "text_encoder", a), b}, pipeline);
  const Plan p = predict(s);
  ASSERT_EQ(p.loads.size(), 2u);
  EXPECT_TRUE(p.loads[0].full_load);
  EXPECT_EQ(p.loads[1].free_before, 60 * MiB);
  ASSERT_EQ(p.loads[1].evictions.size(), 1u);
  EXPECT_EQ(p.loads[1].evictions[0].model, 0u);
  EXPECT_EQ(p.loads[1].evictions[0].modules, (std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(p.loads[1].evictions[0].bytes, 12 * MiB);
  EXPECT_TRUE(p.loads[1].full_load);
  EXPECT_EQ(p.loads[1].usable, static_cast<std::int64_t>(52 * MiB));
  EXPECT_EQ(p.stages[3].resident_total, 74 * MiB);  // A's 34 + B's 40
  EXPECT_EQ(p.stages[4].offload_buffer, 6 * MiB);   // A's buffer, grown by the unload
  // Lowering frees the evicted weights, then empties the cache (soft_empty_cache).
  const Program prog = lower(s, p);
  EXPECT_EQ(check_program(prog), "");
  int evict_frees = 0, empties = 0;
  for (const Op& op : prog.ops) {
    if (op.phase == Phase::evict && op.kind == OpKind::free) ++evict_frees;
    if (op.phase == Phase::evict && op.kind == OpKind::empty_cache) ++empties;
  }
  EXPECT_EQ(evict_frees, 6);
  EXPECT_EQ(empties, 1);
  // Before the look-ahead buffer (nov2025) partially_unload stopped once the shortfall was
  // freed: a1 and a2, 4 MiB, and A's buffer stays 0.
  const Plan before = predict(scenario("106MiB", {model_json("A", "text_encoder", a), b}, pipeline, "comfy:nov2025"));
  ASSERT_EQ(before.loads[1].evictions.size(), 1u);
  EXPECT_EQ(before.loads[1].evictions[0].modules, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(before.loads[1].evictions[0].bytes, 4 * MiB);
  EXPECT_EQ(before.stages[4].offload_buffer, 0u);
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

// ComfyUI's VAE.decode (checked against v0.31.0 through adapters/comfyui): memory_used_decode is
// one sample's (2178 x latent h x w x 64 x dtype size: at 256x256, a 32x32 latent, in bf16,
// 2178 x 1024 x 64 x 2 B = 272.25 MiB), the load is asked for that, and the decode takes
// batch_number = free memory / it samples per call.
TEST(Predict, TheVaeDecodesAsManySamplesPerCallAsFitAfterItsLoad) {
  const Scenario s = scenario("1GiB", {model_json("V", "vae", {module_json("w", 1024, 1024, "bf16")})},
                              R"([{"op":"load","model":"V"},{"op":"forward","model":"V"}])", "comfy:dec2025",
                              R"(, "workload": {"width": 256, "height": 256, "batch": 8})");
  const Bytes one = 2178ull * 32 * 32 * 64 * 2;
  ASSERT_EQ(one, 285474816u);
  ASSERT_EQ(comfy_memory_required(*s.models[0].spec, s.workload, 1, Dtype::bf16, true, "V"), one);
  const Plan p = predict(s);
  EXPECT_EQ(p.loads[0].est_max, one);  // not 8 samples' worth
  EXPECT_EQ(p.loads[0].extra_mem, one + 10 * MiB);
  EXPECT_TRUE(p.loads[0].full_load);
  // Free after the load: 1024 MiB - the 2 MiB weight = 1022 MiB, 3 samples of 272.25 MiB.
  EXPECT_EQ(p.stages[1].decode_batch, 3u);
  EXPECT_EQ(p.stages[1].run_batch, 3u);
  EXPECT_EQ(p.stages[1].passes, 3u);  // 3 + 3 + 2
  EXPECT_EQ(p.stages[1].activation_allowance, comfy_memory_required(*s.models[0].spec, s.workload, 3, Dtype::bf16, true, "V"));
  // Three calls lower to three activation buffers, one after the other.
  const Program prog = lower(s, p);
  int activations = 0;
  for (const Op& op : prog.ops) activations += op.kind == OpKind::alloc && prog.buffers[op.buffer].kind == BufferKind::activation;
  EXPECT_EQ(activations, 3);
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

// ---- modules without a cast hook (issue #18) -------------------------------------------------
//
// ComfyUI's classic walk, side by side with vramfuzz on four minimal models: bf16 storage and
// compute, offload streams 0, no context overhead, the presets' own reserve R = 400 MiB and floor
// 0.8 GiB (858993459 B), so I = 0.8 GiB + 400 MiB, and the device holds I + x: a text encoder's
// min_req is I, so the weight budget is exactly x. "Linear 1024 x N" is a weight [N, 1024] with no
// bias, so every figure is a whole MiB.

constexpr Bytes kInferenceFloor = 858993459;  // 0.8 GiB as ComfyUI computes it
constexpr Bytes kReserve = 400 * MiB;

Scenario raw_case(std::string_view policy, Bytes x, std::string_view modules) {
  const std::string text = fmt::format(
      R"({{"device": {{"total": {}, "context_overhead": 0}}, "allocator": "raw", "policy": "{}",
          "models": [{{"id": "m", "kind": "text_encoder", "compute": "bf16", "modules": [{}]}}],
          "offload_streams": 0, "pipeline": [{{"op": "load", "model": "m"}}, {{"op": "forward", "model": "m"}}]}})",
      kInferenceFloor + kReserve + x, policy, modules);
  Catalog catalog;
  return parse_scenario_json(text, catalog, "test");
}

// A: a raw leaf `nc` [1024, 1024] (2 MiB) beside a Linear 1024 x 1024 (2 MiB).
constexpr const char* kCaseA =
    R"({"name": "nc", "cast_hook": false, "tensors": [{"name": "weight", "shape": [1024, 1024], "dtype": "bf16"}]},
       {"name": "lin", "tensors": [{"name": "weight", "shape": [1024, 1024], "dtype": "bf16"}]})";
// B and C: a container `blk` holding a raw tensor beside its child `blk.lin` (Linear 1024 x 1024).
// No cast_hook is given: the names make `blk` a container, and a container has none.
std::string container_case(std::uint64_t raw_rows) {
  return fmt::format(
      R"({{"name": "blk", "tensors": [{{"name": "gate", "shape": [{}, 1024], "dtype": "bf16"}}]}},
         {{"name": "blk.lin", "tensors": [{{"name": "weight", "shape": [1024, 1024], "dtype": "bf16"}}]}})",
      raw_rows);
}
// D: a raw fp32 leaf [1024, 1024] (4 MiB) beside a bf16 Linear 1024 x 2560 (5 MiB).
constexpr const char* kCaseD =
    R"({"name": "nc", "cast_hook": false, "tensors": [{"name": "weight", "shape": [1024, 1024], "dtype": "fp32"}]},
       {"name": "lin", "tensors": [{"name": "weight", "shape": [2560, 1024], "dtype": "bf16"}]})";

// Transfers the forward stage issues, as (module, bytes).
std::vector<std::pair<std::uint32_t, Bytes>> forward_transfers(const Program& prog) {
  std::vector<std::pair<std::uint32_t, Bytes>> out;
  for (const Op& op : prog.ops) {
    if (op.phase == Phase::forward && op.kind == OpKind::h2d) out.emplace_back(prog.buffers[op.buffer].module, prog.buffers[op.buffer].bytes);
  }
  return out;
}

TEST(PredictRaw, CaseARawLeafThatDoesNotFitStaysButRaisesTheBuffer) {
  // Budget 1 MiB < 4 MiB: the walk. Costs: nc 2 MiB (raw: its bytes), lin 2 MiB (bf16 -> bf16);
  // the tie goes to the name, descending: nc, lin. With NS = 0 the potential is the cost:
  //   nc:  max(0, 2) = 2; 0 + 2 + 2 = 4 >= 1 -> buffer 2; no cast hook: it stays in host memory
  //   lin: max(2, 2) = 2; 0 + 2 + 2 = 4 >= 1 -> offloaded (2 MiB), buffer 2
  // vramfuzz before: nc offloaded too, "4.00 MB offloaded, 2.00 MB buffer".
  const Scenario s = raw_case("comfy:dec2025", 1 * MiB, kCaseA);
  const Plan p = predict(s);
  const LoadPlan& lp = p.loads[0];
  EXPECT_EQ(lp.usable, static_cast<std::int64_t>(1 * MiB));
  EXPECT_EQ(lp.offload_cost, (std::vector<Bytes>{2 * MiB, 2 * MiB}));
  EXPECT_EQ(lp.sorted, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_FALSE(lp.full_load);
  EXPECT_EQ(lp.resident, (std::vector<std::uint8_t>{0, 0}));
  EXPECT_EQ(lp.lowvram, (std::vector<std::uint8_t>{0, 1}));
  EXPECT_EQ(lp.loaded, 0u);
  EXPECT_EQ(lp.offloaded, 2 * MiB);
  EXPECT_EQ(lp.uncounted, 2 * MiB);
  EXPECT_EQ(lp.offload_buffer, 2 * MiB);
  EXPECT_EQ(lp.log_line,
            "loaded partially; 1.00 MB usable, 0.00 MB loaded, 2.00 MB offloaded, 2.00 MB buffer reserved, lowvram patches: 0");
  // Only lin is transferred per forward (2 MiB, the transient window too); nc is never copied.
  EXPECT_EQ(lp.realistic_transient, 2 * MiB);
  EXPECT_EQ(lp.transient_module, 1u);
  EXPECT_EQ(p.stages[1].resident_total, 0u);
  EXPECT_EQ(p.stages[1].predicted_peak, 2 * MiB + kInferenceFloor);  // buffer + max(floor, no estimate)
  const Program prog = lower(s, p);
  EXPECT_EQ(check_program(prog), "");
  EXPECT_EQ(forward_transfers(prog), (std::vector<std::pair<std::uint32_t, Bytes>>{{1, 2 * MiB}}));
}

TEST(PredictRaw, CaseBContainerIsLeftOutOfAFullLoadsLoadedFigure) {
  // Budget 100 MiB > 4 MiB: a full load. The walk lists blk.lin only (blk holds a raw tensor
  // beside a child with parameters: ComfyUI skips it), so the log counts 2 MiB; model.to(device)
  // then moves blk too, and the device holds all 4 MiB. vramfuzz before: "4.00 MB loaded".
  const Scenario s = raw_case("comfy:dec2025", 100 * MiB, container_case(1024));
  const ModelSpec& m = *s.models[0].spec;
  EXPECT_TRUE(m.modules[0].container);
  EXPECT_FALSE(m.modules[0].cast_hook);
  EXPECT_FALSE(m.modules[1].container);
  EXPECT_TRUE(m.modules[1].cast_hook);
  const Plan p = predict(s);
  const LoadPlan& lp = p.loads[0];
  EXPECT_TRUE(lp.full_load);
  EXPECT_EQ(lp.sorted, (std::vector<std::uint32_t>{1}));
  EXPECT_EQ(lp.resident, (std::vector<std::uint8_t>{1, 1}));
  EXPECT_EQ(lp.loaded, 2 * MiB);
  EXPECT_EQ(lp.offloaded, 0u);
  EXPECT_EQ(lp.uncounted, 2 * MiB);
  EXPECT_EQ(lp.offload_buffer, 0u);
  EXPECT_EQ(lp.log_line, "loaded completely; 100.00 MB usable, 2.00 MB loaded, full load: True");
  EXPECT_EQ(p.stages[1].resident_total, 4 * MiB);  // what is on the device
  EXPECT_EQ(p.stages[1].predicted_peak, 4 * MiB + kInferenceFloor);
  // Load: blk.lin as the walk places it, then blk with the rest of the model; no transfers after.
  const Program prog = lower(s, p);
  EXPECT_EQ(check_program(prog), "");
  std::vector<std::uint32_t> moved;
  for (const Op& op : prog.ops) {
    if (op.phase == Phase::load && op.kind == OpKind::h2d) moved.push_back(prog.buffers[op.buffer].module);
  }
  EXPECT_EQ(moved, (std::vector<std::uint32_t>{1, 0}));
  EXPECT_TRUE(forward_transfers(prog).empty());
}

TEST(PredictRaw, CaseCContainerIsSkippedSoTheWalkLoadsCompletely) {
  // Budget 5 MiB < 6 MiB: the walk, over blk.lin alone: potential 2, 0 + 2 + 2 = 4 < 5 ->
  // resident. Nothing is cast on the fly, so "loaded completely", but not a full load; blk's
  // 4 MiB stay in host memory, in neither figure. vramfuzz before: "loaded partially; 0.00 MB
  // loaded, 6.00 MB offloaded, 4.00 MB buffer reserved".
  const Scenario s = raw_case("comfy:dec2025", 5 * MiB, container_case(2048));
  const Plan p = predict(s);
  const LoadPlan& lp = p.loads[0];
  EXPECT_FALSE(lp.full_load);
  EXPECT_EQ(lp.resident, (std::vector<std::uint8_t>{0, 1}));
  EXPECT_EQ(lp.lowvram, (std::vector<std::uint8_t>{0, 0}));
  EXPECT_EQ(lp.loaded, 2 * MiB);
  EXPECT_EQ(lp.offloaded, 0u);
  EXPECT_EQ(lp.uncounted, 4 * MiB);
  EXPECT_EQ(lp.offload_buffer, 0u);
  EXPECT_EQ(lp.log_line, "loaded completely; 5.00 MB usable, 2.00 MB loaded, full load: False");
  EXPECT_EQ(p.stages[1].resident_total, 2 * MiB);
  EXPECT_EQ(p.stages[1].predicted_peak, 2 * MiB + kInferenceFloor);
  const Program prog = lower(s, p);
  EXPECT_EQ(check_program(prog), "");
  EXPECT_TRUE(forward_transfers(prog).empty());  // blk is read in host memory, never copied
  // The plan printout says where the uncounted bytes are, and has no transient line.
  const std::string text = format_plan(s, p);
  EXPECT_NE(text.find("uncounted 4.00 MiB (modules without the cast hook: 0.00 MiB on the device, 4.00 MiB in host memory)"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("realistic transient"), std::string::npos) << text;
}

TEST(PredictRaw, CaseDRawModuleHasNoConversionTermAndSortsSecond) {
  // The raw fp32 tensor costs its 4 MiB (no bf16 copy: nothing casts it), the Linear 5 MiB, so
  // the Linear goes first. Budget 9 MiB, model 9 MiB: the walk.
  //   lin: potential 5; 0 + 5 + 5 = 10 >= 9 -> offloaded, buffer 5
  //   nc:  max(5, 4) = 5; 0 + 4 + 5 = 9 >= 9 -> stays, buffer 5
  // vramfuzz before: nc cost 4 + 2 = 6 sorted first, "9.00 MB offloaded, 6.00 MB buffer".
  const Scenario s = raw_case("comfy:dec2025", 9 * MiB, kCaseD);
  const Plan p = predict(s);
  const LoadPlan& lp = p.loads[0];
  EXPECT_EQ(lp.offload_cost, (std::vector<Bytes>{4 * MiB, 5 * MiB}));
  EXPECT_EQ(lp.sorted, (std::vector<std::uint32_t>{1, 0}));
  EXPECT_EQ(lp.lowvram, (std::vector<std::uint8_t>{0, 1}));
  EXPECT_EQ(lp.offloaded, 5 * MiB);
  EXPECT_EQ(lp.uncounted, 4 * MiB);
  EXPECT_EQ(lp.offload_buffer, 5 * MiB);
  EXPECT_EQ(lp.log_line,
            "loaded partially; 9.00 MB usable, 0.00 MB loaded, 5.00 MB offloaded, 5.00 MB buffer reserved, lowvram patches: 0");
  // Forward: lin's 5 MiB transfer and nothing for nc: no copy, no fp32 -> bf16 upcast.
  const Program prog = lower(s, p);
  EXPECT_EQ(check_program(prog), "");
  EXPECT_EQ(forward_transfers(prog), (std::vector<std::pair<std::uint32_t, Bytes>>{{1, 5 * MiB}}));
  for (const Op& op : prog.ops) EXPECT_NE(op.kind, OpKind::upcast);
  EXPECT_EQ(lp.realistic_transient, 5 * MiB);
}

TEST(PredictRaw, EveryPresetPlansRawModulesTheSameWay) {
  // nov2025 with NS = 0 budgets cost + 0 x largest: the same walk as dec2025, and without a
  // dequant term (the raw module never had one) D sorts the same way too.
  for (const Preset preset : {Preset::nov2025, Preset::dec2025}) {
    const std::string policy = preset == Preset::nov2025 ? "comfy:nov2025" : "comfy:dec2025";
    SCOPED_TRACE(policy);
    EXPECT_EQ(predict(raw_case(policy, 1 * MiB, kCaseA)).loads[0].log_line,
              "loaded partially; 1.00 MB usable, 0.00 MB loaded, 2.00 MB offloaded, 2.00 MB buffer reserved, lowvram patches: 0");
    EXPECT_EQ(predict(raw_case(policy, 100 * MiB, container_case(1024))).loads[0].log_line,
              "loaded completely; 100.00 MB usable, 2.00 MB loaded, full load: True");
    EXPECT_EQ(predict(raw_case(policy, 5 * MiB, container_case(2048))).loads[0].log_line,
              "loaded completely; 5.00 MB usable, 2.00 MB loaded, full load: False");
    EXPECT_EQ(predict(raw_case(policy, 9 * MiB, kCaseD)).loads[0].log_line,
              "loaded partially; 9.00 MB usable, 0.00 MB loaded, 5.00 MB offloaded, 5.00 MB buffer reserved, lowvram patches: 0");
  }
  // oct2025's 128 MiB weight floor loads all four completely; the log's figure counts the listed
  // modules: the raw leaf of A and D is listed, the container of B and C is not.
  const auto oct = [](Bytes x, const std::string& modules) { return predict(raw_case("comfy:oct2025", x, modules)).loads[0]; };
  EXPECT_EQ(oct(1 * MiB, kCaseA).log_line, "loaded completely; 128.00 MB usable, 4.00 MB loaded, full load: True");
  EXPECT_EQ(oct(100 * MiB, container_case(1024)).log_line, "loaded completely; 128.00 MB usable, 2.00 MB loaded, full load: True");
  EXPECT_EQ(oct(5 * MiB, container_case(2048)).log_line, "loaded completely; 128.00 MB usable, 2.00 MB loaded, full load: True");
  EXPECT_EQ(oct(9 * MiB, kCaseD).log_line, "loaded completely; 128.00 MB usable, 9.00 MB loaded, full load: True");
}

TEST(PredictRaw, EvictionLeavesAContainerOnTheDeviceUnlessTheModelIsDetached) {
  // R = 10 MiB, floor 10 MiB: I = 20 MiB, NS = 0 (the preset's 2 streams do not matter here).
  // P: container blk (raw 2 MiB) + blk.lin 8 MiB + p2 8 MiB = 18 MiB; 60 MiB device: P loads
  // fully (budget 40 > 18), the log counts 16 MiB, ComfyUI counts all 18 as loaded.
  const std::string p_model = model_json(
      "P", "text_encoder",
      {R"({"name": "blk", "tensors": [{"name": "gate", "shape": [1024, 1024], "dtype": "bf16"}]})",
       module_json("blk.lin", 2048, 2048, "bf16"), module_json("p2", 2048, 2048, "bf16")});
  const std::string pipeline =
      R"([{"op":"load","model":"P"},{"op":"forward","model":"P"},{"op":"load","model":"Q"},{"op":"forward","model":"Q"}])";
  {
    // Q = 32 MiB: free 42 < 1.1 x 32 + 20 = 55.2, shortfall 13.2 MiB < P's 18: partially_unload
    // moves blk.lin and p2 (16 MiB) and cannot move blk, which stays on the device. Free 58:
    // Q loads fully (budget 38 > 32); the device holds blk 2 + Q 32.
    const Scenario s = scenario("60MiB", {p_model, model_json("Q", "text_encoder", {module_json("q", 4096, 4096, "bf16")})},
                                pipeline, "comfy:dec2025", R"(, "offload_streams": 0)");
    const Plan p = predict(s);
    EXPECT_EQ(p.loads[0].log_line, "loaded completely; 40.00 MB usable, 16.00 MB loaded, full load: True");
    EXPECT_EQ(p.stages[1].resident_total, 18 * MiB);
    ASSERT_EQ(p.loads[1].evictions.size(), 1u);
    EXPECT_EQ(p.loads[1].evictions[0].modules, (std::vector<std::uint32_t>{1, 2}));
    EXPECT_EQ(p.loads[1].evictions[0].bytes, 16 * MiB);
    EXPECT_TRUE(p.loads[1].full_load);
    EXPECT_EQ(p.loads[1].usable, static_cast<std::int64_t>(38 * MiB));
    EXPECT_EQ(p.stages[3].resident_total, 34 * MiB);
    const Program prog = lower(s, p);
    EXPECT_EQ(check_program(prog), "");
    int evict_frees = 0;
    for (const Op& op : prog.ops) evict_frees += op.phase == Phase::evict && op.kind == OpKind::free;
    EXPECT_EQ(evict_frees, 2);
  }
  {
    // Q = 40 MiB: shortfall 64 - 42 = 22 MiB is more than P's 18: model_unload detaches P, blk
    // included. Free 60, budget 40 = Q's size: not a full load, and q (cost 40, 0 + 40 + 40 >= 40)
    // is cast on the fly.
    const Scenario s = scenario("60MiB", {p_model, model_json("Q", "text_encoder", {module_json("q", 5120, 4096, "bf16")})},
                                pipeline, "comfy:dec2025", R"(, "offload_streams": 0)");
    const Plan p = predict(s);
    ASSERT_EQ(p.loads[1].evictions.size(), 1u);
    EXPECT_EQ(p.loads[1].evictions[0].modules, (std::vector<std::uint32_t>{1, 2, 0}));
    EXPECT_EQ(p.loads[1].evictions[0].bytes, 18 * MiB);
    EXPECT_EQ(p.loads[1].usable, static_cast<std::int64_t>(40 * MiB));
    EXPECT_EQ(p.loads[1].log_line,
              "loaded partially; 40.00 MB usable, 0.00 MB loaded, 40.00 MB offloaded, 40.00 MB buffer reserved, lowvram patches: 0");
    EXPECT_EQ(p.stages[3].resident_total, 0u);
    EXPECT_EQ(check_program(lower(s, p)), "");
  }
}

// The models a campaign draws, synthetic ones included, have unique module names: the partial
// unload's order is the load walk's reversed only then (comfy_classic.cpp free_memory; the
// catalog's models: test_catalog.cpp).
TEST(Predict, GeneratedModelsHaveUniqueModuleNames) {
  Catalog catalog;
  std::size_t synthetic = 0;
  for (std::uint64_t seed = 1; seed <= 400; ++seed) {
    PrngChoices c(seed * 0x9e3779b97f4a7c15ull);
    GenConfig cfg;
    const Scenario s = generate_scenario(c, cfg, catalog);
    for (const ModelRef& ref : s.models) {
      if (ref.spec->source.rfind("catalog:", 0) == 0) continue;
      ++synthetic;
      std::set<std::string> names;
      for (const Module& mod : ref.spec->modules) EXPECT_TRUE(names.insert(mod.name).second) << "seed " << seed << " duplicate " << mod.name;
    }
  }
  EXPECT_GT(synthetic, 40u);
}

// The load walks' offload cost from a model's flat arrays is the one from its Modules and Tensors,
// for every module of every catalog model in four storages, synthetic models, four compute dtypes,
// with and without LoRA and the dequant term; and the module flags the walks list by are the
// modules' own.
TEST(Predict, FlatOffloadCostIsTheModulesOwn) {
  Catalog catalog;
  std::vector<std::shared_ptr<const ModelSpec>> models;
  for (const CatalogEntry& e : catalog_entries()) {
    for (const StorageChoice storage : {StorageChoice{Dtype::bf16, true}, StorageChoice{Dtype::fp8_e4m3fn, true},
                                        StorageChoice{Dtype::fp8_e4m3fn, false}, StorageChoice{Dtype::q4_k, true}}) {
      models.push_back(catalog.get(e.name, storage, "model"));
    }
  }
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    PrngChoices c(seed * 0x2545f4914f6cdd1dull);
    for (const ModelRef& ref : generate_scenario(c, GenConfig{}, catalog).models) models.push_back(ref.spec);
  }
  std::size_t checked = 0, converted = 0;
  for (const auto& model : models) {
    for (std::uint32_t i = 0; i < model->modules.size(); ++i) {
      const Module& mod = model->modules[i];
      const std::uint8_t flags = model->module_flags[i];
      ASSERT_EQ((flags & kModuleContainer) != 0, mod.container) << model->name << " " << mod.name;
      ASSERT_EQ((flags & kModuleOwnsParameters) != 0, owns_parameters(mod)) << model->name << " " << mod.name;
      ASSERT_EQ((flags & kModuleCastHook) != 0, mod.cast_hook) << model->name << " " << mod.name;
      for (const Dtype compute : {Dtype::bf16, Dtype::fp16, Dtype::fp32, Dtype::fp8_e4m3fn}) {
        if (!dtype_info(compute).compute) continue;
        for (const bool lora : {false, true}) {
          for (const bool dequant : {false, true}) {
            ComfyConstants c;
            c.dequant_term = dequant;
            c.lora_math_factor = 1.5;
            const Bytes want = offload_cost(mod, compute, lora, c);
            ASSERT_EQ(offload_cost(*model, i, compute, lora, c), want) << model->name << " " << mod.name;
            ++checked;
            if (want > mod.bytes) ++converted;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100000u);
  EXPECT_GT(converted, 10000u);  // the conversion and LoRA terms, not only the bytes
}

}  // namespace
}  // namespace vf

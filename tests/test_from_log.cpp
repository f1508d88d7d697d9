// `vramfuzz from-log`: ComfyUI console logs written here (never downloaded) read, reconstructed
// into scenarios and compared with a run; the log reader's forms one by one; bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/campaign.h"
#include "harness/comfy_log.h"
#include "harness/core/error.h"
#include "harness/from_log.h"
#include "harness/scenario.h"
#include "tests/run_cli.h"

#ifndef VF_CLI
#error "VF_CLI must name the vramfuzz executable (tests/CMakeLists.txt)"
#endif

namespace vf {
namespace {

namespace fs = std::filesystem;

// The origin case as ComfyUI 0.3.64 logged it (README, "What it finds"): the FLUX.2 text encoder
// stored fp8 with fp32 compute on a 12 GiB RTX 3060, cudaMallocAsync, two offload streams; the
// plan line in that release's form (no semicolon, no offloaded figure); the cudaMallocAsync OOM
// in the conversion of an MLP weight.
constexpr const char* kOriginLog = R"(Checkpoint files will always be loaded safely.
Total VRAM 12288 MB, total RAM 32012 MB
pytorch version: 2.8.0+cu128
Set vram state to: NORMAL_VRAM
Device: cuda:0 NVIDIA GeForce RTX 3060 : cudaMallocAsync
Using async weight offloading with 2 streams
Using pytorch attention
Python version: 3.12.3 (main, Jun 18 2025, 17:59:45) [GCC 13.3.0]
ComfyUI version: 0.3.64
Starting server

To see the GUI go to: http://127.0.0.1:8188
got prompt
Using scaled fp8: fp8 matrix mult: False, scale input: False
CLIP/text encoder model load device: cuda:0, offload device: cpu, current: cpu, dtype: torch.float32
Requested to load Flux2TEModel_
loaded partially 10795.05 10795.05 0
!!! Exception during processing !!! Allocation on device 0 would exceed allowed memory. (out of memory)
Currently allocated     : 11.26 GiB
Requested               : 640.00 MiB
Device limit            : 12.00 GiB
Free (according to CUDA): 430.25 MiB
PyTorch limit (set by user-supplied memory fraction)
                        : 17179869184.00 GiB
Traceback (most recent call last):
  File "/home/u/ComfyUI/execution.py", line 496, in execute
    output_data, output_ui, has_subgraph, has_pending_tasks = await get_output_data(prompt_id, unique_id, obj, input_data_all)
  File "/home/u/ComfyUI/comfy/sd.py", line 239, in encode_from_tokens
    o = self.cond_stage_model.encode_token_weights(tokens)
  File "/home/u/ComfyUI/comfy/ops.py", line 98, in cast_bias_weight
    weight = comfy.model_management.cast_to(s.weight, dtype, device, non_blocking=non_blocking, copy=weight_has_function)
  File "/home/u/ComfyUI/comfy/model_management.py", line 1046, in cast_to
    return weight.to(dtype=dtype, copy=copy)
torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)
Currently allocated     : 11.26 GiB
Requested               : 640.00 MiB
Device limit            : 12.00 GiB
Free (according to CUDA): 430.25 MiB
PyTorch limit (set by user-supplied memory fraction)
                        : 17179869184.00 GiB

Got an OOM, unloading all loaded models.
Prompt executed in 41.77 seconds
)";

struct Rebuilt {
  ComfyLog log;
  Reconstruction rec;
  CaseResult run;
  LogComparison cmp;
};

Rebuilt rebuild(const std::string& text, FromLogOptions o = {}) {
  Rebuilt r;
  r.log = read_comfy_log(text, "test.log");
  Catalog catalog;
  o.file = "test.log";
  r.rec = reconstruct_from_log(r.log, o, catalog);
  auto backend = make_backend("sim", BackendOptions{});
  r.run = run_case(r.rec.scenario, *backend, false);
  r.cmp = compare_with_log(r.rec.scenario, r.run);
  return r;
}

const LogFact* fact(const Reconstruction& r, std::string_view what) {
  for (const LogFact& f : r.facts) {
    if (f.what == what) return &f;
  }
  return nullptr;
}

TEST(FromLog, TheReadmeOriginCaseFromItsLogTextReproducesItsPlanLineAndItsOom) {
  const Rebuilt r = rebuild(kOriginLog);
  const Scenario& s = r.rec.scenario;
  EXPECT_EQ(s.device.total, 12 * GiB);
  EXPECT_EQ(s.device.used_by_others, 0u);  // back-solved from 10795.05 MB usable
  EXPECT_EQ(s.allocator.mode, AllocatorMode::async);
  EXPECT_EQ(s.policy.label(), "comfy:oct2025");
  EXPECT_EQ(s.streams(), 2u);
  ASSERT_EQ(s.models.size(), 1u);
  EXPECT_EQ(s.models[0].source, "catalog:flux2-text-encoder");
  EXPECT_EQ(s.models[0].storage.dtype, Dtype::fp8_e4m3fn);  // from "Using scaled fp8"
  EXPECT_EQ(s.models[0].compute, Dtype::fp32);              // the text encoder's dtype line
  ASSERT_EQ(s.stages.size(), 2u);
  EXPECT_EQ(s.stages[1].op, StageOp::forward);
  // The plan line, exactly as the emulation prints it, and the OOM where the log has it.
  ASSERT_EQ(r.run.plan.loads.size(), 1u);
  EXPECT_EQ(r.run.plan.loads[0].log_line,
            "loaded partially; 10795.05 MB usable, 10795.05 MB loaded, 6385.55 MB offloaded, 0.00 MB buffer reserved, lowvram patches: 0");
  EXPECT_EQ(r.cmp.status, LogComparison::Status::reproduced) << r.cmp.summary;
  ASSERT_TRUE(r.run.exec.oom.has_value());
  EXPECT_EQ(r.run.exec.oom->request, 640 * MiB);
  EXPECT_EQ(r.run.exec.oom->device_free, 430 * MiB + 256 * KiB);  // the log's "Free (according to CUDA): 430.25 MiB"
  EXPECT_NE(r.cmp.summary.find("same request size"), std::string::npos) << r.cmp.summary;
  ASSERT_TRUE(s.from_log.has_value());
  EXPECT_EQ(s.from_log->plans.size(), 1u);
  EXPECT_EQ(s.from_log->plans[0].line, 17u);
  ASSERT_TRUE(s.from_log->oom.has_value());
  EXPECT_EQ(s.from_log->oom->line, 18u);
  EXPECT_EQ(s.from_log->oom->stage, 1u);
  EXPECT_EQ(s.from_log->oom->activity, "weight-cast");
}

TEST(FromLog, OthersAreBackSolvedFromTheUsableFigure) {
  // The same log with 1 GiB held by another process: ComfyUI's planner saw 1024 MiB less, and
  // printed 9771.05 MB usable (vramfuzz plan of the same case with used_by_others 1GiB).
  std::string text = kOriginLog;
  text.replace(text.find("loaded partially 10795.05 10795.05 0"), 36, "loaded partially 9771.05 9770.60 0");
  const Rebuilt r = rebuild(text);
  // To the log's 2 decimals: within 0.005 MiB of 1 GiB.
  EXPECT_NEAR(static_cast<double>(r.rec.scenario.device.used_by_others), static_cast<double>(GiB), 0.005 * MiB);
  EXPECT_EQ(r.cmp.status, LogComparison::Status::reproduced) << r.cmp.summary << "\n" << format_facts(r.rec);
  const LogFact* f = fact(r.rec, "used by others");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->sure, Sureness::derived);
  EXPECT_NE(f->source.find("9771.05 MB usable"), std::string::npos) << f->source;
}

// A classic partial load of ComfyUI between PR #11096 and #11171 (master of 2025-12-04..09, still
// "0.3.76"): the look-ahead buffer without the upcast term. The version says nov2025, whose
// buffer would be 2720 MiB: the plan differs, and says where; with the policy of that state given
// the plan matches and the OOM in the text encoder's forward is reproduced.
constexpr const char* kDec04Log = R"(Total VRAM 12288 MB, total RAM 32012 MB
pytorch version: 2.9.1+cu128
Device: cuda:0 NVIDIA GeForce RTX 3060 : cudaMallocAsync
Using async weight offloading with 2 streams
Enabled pinned memory 30411.0
ComfyUI version: 0.3.76
got prompt
Using scaled fp8: fp8 matrix mult: False, scale input: False
CLIP/text encoder model load device: cuda:0, offload device: cpu, current: cpu, dtype: torch.float32
Requested to load Flux2TEModel_
loaded partially; 10795.05 MB usable, 10315.05 MB loaded, 6865.55 MB offloaded, 480.00 MB buffer reserved, lowvram patches: 0
!!! Exception during processing !!! Allocation on device 0 would exceed allowed memory. (out of memory)
Currently allocated     : 11.41 GiB
Requested               : 640.00 MiB
Device limit            : 12.00 GiB
Free (according to CUDA): 270.25 MiB
PyTorch limit (set by user-supplied memory fraction)
                        : 17179869184.00 GiB
Traceback (most recent call last):
  File "/srv/ComfyUI/comfy/sd.py", line 245, in encode_from_tokens
    o = self.cond_stage_model.encode_token_weights(tokens)
  File "/srv/ComfyUI/comfy/ops.py", line 110, in cast_bias_weight
    weight = comfy.model_management.cast_to(s.weight, dtype, device, non_blocking=non_blocking)
torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)
Currently allocated     : 11.41 GiB
Requested               : 640.00 MiB
Device limit            : 12.00 GiB
Free (according to CUDA): 270.25 MiB
PyTorch limit (set by user-supplied memory fraction)
                        : 17179869184.00 GiB
)";

TEST(FromLog, AClassicPartialLoadOomInTheOffloadedTextEncodersForward) {
  const Rebuilt by_version = rebuild(kDec04Log);
  EXPECT_EQ(by_version.rec.scenario.policy.label(), "comfy:nov2025");
  EXPECT_EQ(by_version.cmp.status, LogComparison::Status::plan_differs) << by_version.cmp.summary;
  ASSERT_FALSE(by_version.cmp.lines.empty());
  EXPECT_NE(by_version.cmp.lines[0].find("MB buffer 2720.00 here, 480.00 in the log"), std::string::npos) << by_version.cmp.lines[0];

  FromLogOptions o;
  o.policy = "comfy:dec2025";
  o.overrides = {{"dequant_term", "false"}};
  const Rebuilt r = rebuild(kDec04Log, o);
  EXPECT_EQ(r.rec.scenario.policy.key(), "comfy:dec2025 dequant_term=false");
  EXPECT_EQ(r.run.plan.loads.at(0).log_line,
            "loaded partially; 10795.05 MB usable, 10315.05 MB loaded, 6865.55 MB offloaded, 480.00 MB buffer reserved, lowvram patches: 0");
  EXPECT_EQ(r.cmp.status, LogComparison::Status::reproduced) << r.cmp.summary;
  EXPECT_EQ(r.run.exec.oom->request, 640 * MiB);
  EXPECT_EQ(r.run.exec.oom->device_free, 270 * MiB + 256 * KiB);
}

// cudaMallocAsync running out while FLUX.1 loads: the load never printed its plan line. The
// async message has no per-process figures: others = limit - free - allocated - context, an
// upper bound (12.00 GiB - 1.20 GiB - 10.21 GiB - 273.75 MiB = 341.35 MiB, to the message's 2
// decimals).
constexpr const char* kLoadOomLog = R"(Total VRAM 12288 MB, total RAM 65436 MB
Device: cuda:0 NVIDIA GeForce RTX 3060 : cudaMallocAsync
Dynamic vram disabled with argument. If you have any issues with dynamic vram enabled please give us a detailed reports as this argument will be removed soon.
ComfyUI version: 0.38.1
got prompt
model weight dtype torch.float8_e4m3fn, manual cast: torch.bfloat16
model_type FLUX
Requested to load Flux
!!! Exception during processing !!! Allocation on device 0 would exceed allowed memory. (out of memory)
Currently allocated     : 10.21 GiB
Requested               : 36.00 MiB
Device limit            : 12.00 GiB
Free (according to CUDA): 1.20 GiB
PyTorch limit (set by user-supplied memory fraction)
                        : 17179869184.00 GiB
Traceback (most recent call last):
  File "/srv/ComfyUI/comfy/model_management.py", line 704, in load_models_gpu
    loaded_model.model_load(lowvram_model_memory, force_patch_weights=force_patch_weights)
  File "/srv/ComfyUI/comfy/model_patcher.py", line 812, in load
    x[2].to(device_to)
torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)
Currently allocated     : 10.21 GiB
Requested               : 36.00 MiB
Device limit            : 12.00 GiB
Free (according to CUDA): 1.20 GiB
PyTorch limit (set by user-supplied memory fraction)
                        : 17179869184.00 GiB
)";

TEST(FromLog, ACudaMallocAsyncOomAtModelLoad) {
  const Rebuilt r = rebuild(kLoadOomLog);
  const Scenario& s = r.rec.scenario;
  EXPECT_EQ(s.policy.label(), "comfy:dec2025");  // 0.38.1 with dynamic VRAM switched off
  EXPECT_EQ(s.allocator.mode, AllocatorMode::async);
  ASSERT_EQ(s.stages.size(), 1u);  // the load it failed in, nothing after
  EXPECT_EQ(s.stages[0].op, StageOp::load);
  EXPECT_EQ(s.models[0].storage.dtype, Dtype::fp8_e4m3fn);  // "model weight dtype"
  EXPECT_EQ(s.models[0].compute, Dtype::bf16);              // "manual cast"
  ASSERT_TRUE(s.from_log->oom.has_value());
  EXPECT_EQ(s.from_log->oom->activity, "load");
  EXPECT_EQ(s.from_log->oom->stage, 0u);
  EXPECT_TRUE(s.from_log->plans.empty());
  // 12 GiB - round(1.20 GiB) - round(10.21 GiB) - 287047680 B context.
  const Bytes expect = 12 * GiB - static_cast<Bytes>(std::llround(1.20 * GiB)) - static_cast<Bytes>(std::llround(10.21 * GiB)) - kPyTorchContextOverhead;
  EXPECT_EQ(s.device.used_by_others, expect);
  EXPECT_NE(fact(r.rec, "used by others")->source.find("an upper bound"), std::string::npos);
  // The run loads FLUX.1 without running out: the comparison says so, and by how much.
  EXPECT_EQ(r.cmp.status, LogComparison::Status::no_oom) << r.cmp.summary;
  EXPECT_NE(r.cmp.summary.find("no plan line to compare"), std::string::npos) << r.cmp.summary;
  ASSERT_FALSE(r.cmp.lines.empty());
  EXPECT_NE(r.cmp.lines[0].find("36.00 MiB requested with 1228.80 MiB free in stage 0 (load dit, load)"), std::string::npos) << r.cmp.lines[0];
}

// Dynamic VRAM (ComfyUI 0.38.1): the staging line, then an OOM in a conversion. The staged MB and
// the force-loaded weights pick the unscaled fp8 file (a scaled one force-loads 271 weights).
constexpr const char* kDynamicLog = R"(Total VRAM 12288 MB, total RAM 65436 MB
pytorch version: 2.10.0+cu130
Set vram state to: NORMAL_VRAM
Device: cuda:0 NVIDIA GeForce RTX 3060 : cudaMallocAsync
Using async weight offloading with 2 streams
aimdo: src/control.c:236:INFO:comfy-aimdo inited for GPU: NVIDIA GeForce RTX 3060 (VRAM: 12288 MB)
DynamicVRAM support detected and enabled
ComfyUI version: 0.38.1
comfy-aimdo version: 0.5.5
got prompt
CLIP/text encoder model load device: cuda:0, offload device: cpu, current: cpu, dtype: torch.float32
Requested to load Flux2TEModel_
Model Flux2TEModel_ prepared for dynamic VRAM loading. 17180MB Staged. 0 patches attached. Force pre-loaded 61 weights: 610 KB.
!!! Exception during processing !!! CUDA out of memory. Tried to allocate 640.00 MiB. GPU 0 has a total capacity of 12.00 GiB of which 402.25 MiB is free. Including non-PyTorch memory, this process has 11.33 GiB memory in use. Of the allocated memory 10.81 GiB is allocated by PyTorch, and 232.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)
Traceback (most recent call last):
  File "/opt/ComfyUI/comfy/sd.py", line 312, in encode_from_tokens
    o = self.cond_stage_model.encode_token_weights(tokens)
  File "/opt/ComfyUI/comfy/ops.py", line 233, in cast_bias_weight
    weight = comfy.model_management.cast_to(s.weight, dtype, device, non_blocking=non_blocking)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 640.00 MiB. GPU 0 has a total capacity of 12.00 GiB of which 402.25 MiB is free. Including non-PyTorch memory, this process has 11.33 GiB memory in use. Of the allocated memory 10.81 GiB is allocated by PyTorch, and 232.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)

Memory summary: |===========================================================================|
|                  PyTorch CUDA memory summary, device ID 0                 |
|            CUDA OOMs: 1            |        cudaMalloc retries: 1         |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |  11068 MiB |  11069 MiB |  22890 MiB |  11822 MiB |
|       from large pool |  11000 MiB |  11001 MiB |  22000 MiB |  11000 MiB |
|---------------------------------------------------------------------------|
| GPU reserved memory   |  11300 MiB |  11300 MiB |  11300 MiB |      0 B   |
|===========================================================================|
Got an OOM, unloading all loaded models.
)";

TEST(FromLog, ADynamicVramLogWithAnOomInAConversion) {
  const Rebuilt r = rebuild(kDynamicLog);
  const Scenario& s = r.rec.scenario;
  EXPECT_EQ(s.policy.label(), "comfy:sep2026");
  EXPECT_EQ(fact(r.rec, "policy")->sure, Sureness::derived);
  EXPECT_EQ(s.models[0].storage.dtype, Dtype::fp8_e4m3fn);
  EXPECT_FALSE(s.models[0].storage.scaled);
  EXPECT_EQ(r.run.plan.loads.at(0).log_line,
            "Model te prepared for dynamic VRAM loading. 17180MB Staged. 0 patches attached. Force pre-loaded 61 weights: 610 KB.");
  // others = 12.00 GiB - 402.25 MiB - 11.33 GiB (the message's own figures).
  EXPECT_EQ(s.device.used_by_others, 12 * GiB - (402 * MiB + 256 * KiB) - static_cast<Bytes>(std::llround(11.33 * GiB)));
  ASSERT_EQ(r.log.ooms.size(), 1u);  // before and after the traceback: one OOM
  EXPECT_EQ(r.log.ooms[0].other_processes.size(), 0u);
  EXPECT_EQ(*r.log.ooms[0].reserved_unallocated, 232 * MiB);
  EXPECT_EQ(s.from_log->oom->activity, "weight-cast");
  // Staging matches; aimdo makes room by evicting pages where the real run failed.
  EXPECT_EQ(r.cmp.status, LogComparison::Status::no_oom) << r.cmp.summary;
  ASSERT_EQ(r.cmp.lines.size(), 3u);
  EXPECT_NE(r.cmp.lines[1].find("comfy-aimdo evicts weight pages"), std::string::npos) << r.cmp.lines[1];
  // PyTorch's memory summary, printed after the OOM, beside the run's peaks.
  ASSERT_TRUE(r.log.memory_summary);
  EXPECT_EQ(*r.log.memory_summary->reserved_peak, 11300 * MiB);
  EXPECT_EQ(*r.log.memory_summary->allocated_cur, 11068 * MiB);
  EXPECT_EQ(r.rec.scenario.from_log->summary_line, 22u);
  EXPECT_NE(r.cmp.lines[2].find("the log's memory summary (line 22): reserved peak 11300.00 MiB, allocated peak 11069.00 MiB; the run's: "),
            std::string::npos)
      << r.cmp.lines[2];
}

// Windows portable, coloured log levels, CRLF, a progress bar redrawn with '\r', the traceback's
// drive paths: the 600 MiB Windows reserve, 20 steps, an attention OOM in the sampler.
std::string windows_log() {
  const std::string g = "\x1b[32m[INFO]\x1b[0m ";
  const std::string w = "\x1b[33m[WARNING]\x1b[0m ";
  const std::string e = "\x1b[31m[ERROR]\x1b[0m ";
  const std::string oom =
      "CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total capacity of 11.99 GiB of which 0 bytes is free. Of the "
      "allocated memory 10.02 GiB is allocated by PyTorch, and 511.27 MiB is reserved by PyTorch but unallocated.";
  const std::vector<std::string> lines = {
      "D:\\ComfyUI_windows_portable>.\\python_embeded\\python.exe -s ComfyUI\\main.py --windows-standalone-build",
      g + "Total VRAM 12288 MB, total RAM 32607 MB",
      g + "pytorch version: 2.9.1+cu130",
      g + "Device: cuda:0 NVIDIA GeForce RTX 4070 : cudaMallocAsync",
      g + "Using async weight offloading with 2 streams",
      w + "Dynamic vram disabled with argument. If you have any issues with dynamic vram enabled please give us a detailed reports "
          "as this argument will be removed soon.",
      g + "ComfyUI version: 0.37.0",
      "[ComfyUI-Manager] network_mode: public",
      "\x1b[36mLoading: ComfyUI-Impact-Pack (V8.8)\x1b[0m",
      g + "got prompt",
      g + "model weight dtype torch.float8_e4m3fn, manual cast: torch.bfloat16",
      g + "model_type FLUX",
      g + "Requested to load Flux",
      g + "loaded partially; 9886.44 MB usable, 9749.97 MB loaded, 1603.04 MB offloaded, 135.05 MB buffer reserved, lowvram patches: 0",
      "\r  0%|          | 0/20 [00:00<?, ?it/s]\r  5%|\xe2\x96\x8c         | 1/20 [00:02<00:41,  2.18s/it]\r 10%|\xe2\x96\x88         | "
      "2/20 [00:04<00:38,  2.14s/it]",
      e + "!!! Exception during processing !!! " + oom,
      "Traceback (most recent call last):",
      "  File \"D:\\ComfyUI_windows_portable\\ComfyUI\\comfy\\samplers.py\", line 1053, in sample",
      "    output = self.inner_sample(noise, latent_image, device, sampler, sigmas, denoise_mask, callback, disable_pbar, seed)",
      "  File \"D:\\ComfyUI_windows_portable\\ComfyUI\\comfy\\ldm\\modules\\attention.py\", line 530, in attention_pytorch",
      "    out = comfy.ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)",
      "torch.OutOfMemoryError: " + oom,
      "",
      e + "Got an OOM, unloading all loaded models.",
  };
  std::string out;
  for (const std::string& l : lines) out += l + "\r\n";
  return out;
}

TEST(FromLog, AWindowsLogWithAnsiColoursAndAProgressBar) {
  const Rebuilt r = rebuild(windows_log());
  const Scenario& s = r.rec.scenario;
  EXPECT_EQ(r.log.windows_line, 1u);
  EXPECT_EQ(s.policy.label(), "comfy:dec2025");
  EXPECT_EQ(s.policy.constants.reserve, 600 * MiB);  // Windows, 12 GiB <= 15 GiB
  EXPECT_EQ(s.workload.steps, 20u);                  // the progress bar's total
  EXPECT_EQ(s.device.used_by_others, 512 * MiB);     // back-solved from 9886.44 MB usable
  EXPECT_EQ(s.models[0].source, "catalog:flux1-dev");
  EXPECT_EQ(s.from_log->oom->activity, "compute");
  EXPECT_EQ(s.stages.at(*s.from_log->oom->stage).op, StageOp::forward);
  EXPECT_EQ(r.log.ooms.at(0).requested, static_cast<Bytes>(std::llround(1.25 * GiB)));
  EXPECT_EQ(r.log.ooms.at(0).precision, static_cast<Bytes>(0.005 * GiB));
  EXPECT_EQ(*r.log.ooms.at(0).free, 0u);
  // The plan line is the emulation's to the byte; the attention working set on the sim is the
  // structural formula's, which leaves room where the real run had none: no OOM, and the
  // comparison says how much room.
  EXPECT_EQ(r.cmp.lines.at(0), "line 14 (load dit): matches (MB usable, MB loaded, MB offloaded, MB buffer, lowvram patches)");
  EXPECT_FALSE(s.models[0].lora);
  EXPECT_EQ(r.cmp.status, LogComparison::Status::no_oom) << r.cmp.summary;
  EXPECT_NE(r.cmp.lines.at(1).find("activations larger than modelled"), std::string::npos) << r.cmp.lines.at(1);
}

// A FLUX.1 workflow as ComfyUI logs it: the loader nodes run first (their dtype lines before any
// request), a custom node's import traceback at startup, other programs' lines that start like
// ComfyUI's, a cp1252 path; then the text encoder, the DiT and the VAE, whose decode OOMs.
constexpr const char* kThreeModelLog =
    "[Crystools] Total VRAM 24 GB\n"
    "Total VRAM 24576 MB, total RAM 64000 MB\n"
    "Device: cuda:0 NVIDIA GeForce RTX 4090 : cudaMallocAsync\n"
    "Using async weight offloading with 2 streams\n"
    "Dynamic vram disabled with argument. If you have any issues with dynamic vram enabled please give us a detailed reports as this argument will be removed soon.\n"
    "ComfyUI version: 0.38.1\n"
    "Traceback (most recent call last):\n"
    "  File \"/srv/ComfyUI/nodes.py\", line 2100, in load_custom_node\n"
    "  File \"/srv/ComfyUI/custom_nodes/broken/__init__.py\", line 1, in <module>\n"
    "ModuleNotFoundError: No module named 'cv3'\n"
    "Cannot import /srv/ComfyUI/custom_nodes/broken module for custom nodes: No module named 'cv3'\n"
    "Loading models from /home/Jos\xe9/models\n"
    "got prompt\n"
    "model weight dtype torch.float8_e4m3fn, manual cast: torch.bfloat16\n"
    "model_type FLUX\n"
    "CLIP/text encoder model load device: cuda:0, offload device: cpu, current: cpu, dtype: torch.float16\n"
    "VAE load device: cuda:0, offload device: cpu, dtype: torch.bfloat16\n"
    "Requested to load FluxClipModel_\n"
    "loaded completely; 23083.05 MB usable, 9083.39 MB loaded, full load: True\n"
    "[MyNode] model loaded completely; took 3.2 s\n"
    "Requested to load Flux\n"
    "loaded completely; 13803.06 MB usable, 11353.01 MB loaded, full load: True\n"
    "100%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88| 20/20 [00:28<00:00,  1.41s/it]\n"
    "Requested to load AutoencodingEngine\n"
    // What ComfyUI v0.31.0's own planner prints for this VAE load (read through
    // adapters/comfyui): partially_unload freed 1184.39 MB of the TE, its 96 MB buffer growth on top.
    "loaded completely; 294.24 MB usable, 159.87 MB loaded, full load: True\n"
    "!!! Exception during processing !!! CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 23.99 GiB of which "
    "2.81 GiB is free. Including non-PyTorch memory, this process has 20.91 GiB memory in use. Of the allocated memory 19.43 GiB is "
    "allocated by PyTorch, and 1.11 GiB is reserved by PyTorch but unallocated.\n"
    "Traceback (most recent call last):\n"
    "  File \"/srv/ComfyUI/nodes.py\", line 296, in decode\n"
    "  File \"/srv/ComfyUI/comfy/sd.py\", line 780, in decode\n"
    "  File \"/srv/ComfyUI/comfy/ldm/modules/diffusionmodules/model.py\", line 210, in forward\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 23.99 GiB of which 2.81 GiB "
    "is free. Including non-PyTorch memory, this process has 20.91 GiB memory in use. Of the allocated memory 19.43 GiB is allocated by "
    "PyTorch, and 1.11 GiB is reserved by PyTorch but unallocated.\n"
    "Got an OOM, unloading all loaded models.\n";

TEST(FromLog, LowvramPatchesInThePlanLineMeanALora) {
  std::string text = windows_log();
  text.replace(text.find("lowvram patches: 0"), 18, "lowvram patches: 40");
  const Rebuilt r = rebuild(text);
  EXPECT_TRUE(r.rec.scenario.models[0].lora);
  const LogFact* f = fact(r.rec, "model dit lora");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->sure, Sureness::guessed);
  EXPECT_NE(f->source.find("line 14: 40 patches in its plan line"), std::string::npos) << f->source;
  // The run patches every weight: its count is compared with the log's and said when it differs.
  const std::string& line = r.cmp.lines.at(0);
  const std::string run_count = std::to_string(r.run.plan.loads.at(0).lowvram_patches);
  if (r.run.plan.loads.at(0).lowvram_patches != 40) {
    EXPECT_NE(line.find(run_count + " lowvram patches here, 40 in the log"), std::string::npos) << line;
  }
}

TEST(FromLog, ThreeModelsGetTheirOwnLoaderLinesAndTheVaeDecodeOomItsTraceback) {
  const Rebuilt r = rebuild(kThreeModelLog);
  const Scenario& s = r.rec.scenario;
  ASSERT_EQ(s.models.size(), 3u) << format_facts(r.rec);
  EXPECT_EQ(s.models[0].source, "catalog:t5xxl");
  EXPECT_EQ(s.models[0].storage.dtype, Dtype::fp16);  // fp16 and bf16 weigh the same: the TE's dtype line decides
  EXPECT_EQ(s.models[0].compute, Dtype::fp16);
  EXPECT_EQ(fact(r.rec, "model te")->sure, Sureness::guessed);
  EXPECT_NE(fact(r.rec, "model te")->source.find("bf16 weigh(s) the same"), std::string::npos) << fact(r.rec, "model te")->source;
  EXPECT_EQ(s.models[1].source, "catalog:flux1-dev");
  EXPECT_EQ(s.models[1].storage.dtype, Dtype::fp8_e4m3fn);  // the diffusion model's own dtype line
  EXPECT_EQ(s.models[1].compute, Dtype::bf16);
  EXPECT_EQ(s.models[2].source, "catalog:flux-vae");
  EXPECT_EQ(s.models[2].compute, Dtype::bf16);
  EXPECT_EQ(fact(r.rec, "model vae compute")->sure, Sureness::read);
  // The startup traceback (a custom node's import) does not place the OOM; the decode's does.
  ASSERT_EQ(s.stages.size(), 6u);
  EXPECT_EQ(*s.from_log->oom->stage, 5u);
  EXPECT_EQ(s.stages[5].op, StageOp::forward);
  EXPECT_EQ(s.models[s.stages[5].model].id, "vae");
  EXPECT_EQ(s.from_log->oom->activity, "compute");
  EXPECT_EQ(s.from_log->plans.size(), 3u);
  EXPECT_EQ(s.workload.steps, 20u);
  EXPECT_EQ(r.log.total_vram_mb, 24576u);  // not Crystools' "24 GB"
  EXPECT_EQ(s.device.used_by_others, 0u);
  for (const std::string& l : r.cmp.lines) {
    if (l.rfind("line ", 0) == 0) {
      EXPECT_NE(l.find(": matches"), std::string::npos) << l;
    }
  }
  // The cp1252 byte stays out of everything written: the scenario is valid JSON.
  EXPECT_TRUE(nlohmann::json::accept(scenario_to_json(s)));
}

TEST(FromLog, AModelRequestedAgainWasUnloadedAndIsLoadedAgain) {
  std::string text = kOriginLog;
  const std::string again = "Requested to load Flux2TEModel_\nloaded partially 10795.05 10795.05 0\n";
  text.insert(text.find("!!! Exception"), "Prompt executed in 3.00 seconds\ngot prompt\n" + again);
  const Rebuilt r = rebuild(text);
  const Scenario& s = r.rec.scenario;
  ASSERT_EQ(s.stages.size(), 5u);  // load, forward, unload, load, forward
  EXPECT_EQ(s.stages[2].op, StageOp::unload);
  EXPECT_EQ(s.stages[3].op, StageOp::load);
  ASSERT_EQ(s.from_log->plans.size(), 2u);
  EXPECT_EQ(s.from_log->plans[1].stage, 3u);
  EXPECT_EQ(*s.from_log->oom->stage, 4u);
  // Both plan lines match; the sim runs out already in the first prompt's forward, which the
  // log's first prompt survived: said as such, not as reproduced.
  EXPECT_NE(r.cmp.lines[0].find(": matches"), std::string::npos) << r.cmp.lines[0];
  EXPECT_NE(r.cmp.lines[1].find(": matches"), std::string::npos) << r.cmp.lines[1];
  EXPECT_EQ(r.cmp.status, LogComparison::Status::oom_elsewhere) << r.cmp.summary;
  EXPECT_NE(r.cmp.summary.find("the run OOMs in stage 1 (weight-cast), the log in stage 4 (weight-cast)"), std::string::npos) << r.cmp.summary;
}

TEST(FromLog, OtherProgramsLinesAreSkippedCutOffOnesAreErrors) {
  // Lines that start like ComfyUI's and go on differently are someone else's.
  for (const char* noise : {"[MyNode] model loaded completely; took 3.2 s", "[Crystools] Total VRAM 24 GB",
                            "Model X prepared for dynamic VRAM loading. Ready.", "CUDA out of memory. Retrying with tiles",
                            "Using async weight offloading with many streams"}) {
    std::string text = kOriginLog;
    text.insert(text.find("got prompt"), std::string(noise) + "\n");
    EXPECT_NO_THROW(rebuild(text)) << noise;
  }
  // A line cut inside its own form is a cut-off log.
  for (const char* cut : {"Total VRAM 12288 MB, total R", "torch.OutOfMemoryError: CUDA out of memory. Tri",
                          "Model Flux2TEModel_ prepared for dynamic VRAM loading. 17180MB Sta"}) {
    std::string text = kOriginLog;
    text.insert(text.find("got prompt"), std::string(cut) + "\n");
    EXPECT_THROW(read_comfy_log(text, "t.log"), InputError) << cut;
  }
  // A version past any int is not a version, and no crash.
  std::string text = kOriginLog;
  text.replace(text.find("0.3.64"), 6, "0.99999999999999.1");
  EXPECT_NO_THROW(rebuild(text));
}

// The head of a FLUX.1 log on a 12 GiB card; each test below adds what happened next.
constexpr const char* kFluxHead = R"(Total VRAM 12288 MB, total RAM 32000 MB
Device: cuda:0 NVIDIA GeForce RTX 3060 : cudaMallocAsync
Using async weight offloading with 2 streams
ComfyUI version: 0.4.0
got prompt
model weight dtype torch.float8_e4m3fn, manual cast: torch.bfloat16
)";
constexpr const char* kFluxPlan =
    "loaded partially; 10598.44 MB usable, 10463.29 MB loaded, 889.72 MB offloaded, 135.05 MB buffer reserved, lowvram patches: 0\n";
constexpr const char* kAttentionOom =
    "!!! Exception during processing !!! CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total capacity of 12.00 GiB of "
    "which 402.25 MiB is free. Including non-PyTorch memory, this process has 11.33 GiB memory in use. Of the allocated memory 10.81 GiB "
    "is allocated by PyTorch, and 232.00 MiB is reserved by PyTorch but unallocated.\n";

TEST(FromLog, ALoadThatFailedOrWasInterruptedDoesNotTakeALaterPlanLine) {
  // Prompt 1's load OOMs (no plan line); prompt 2 requests the model again and plans it. The
  // OOM reconstructed is the first, in the load; the later plan line is the second request's.
  const std::string retry = std::string(kFluxHead) + "Requested to load Flux\n" +
                            "!!! Exception during processing !!! Allocation on device 0 would exceed allowed memory. (out of memory)\n"
                            "Currently allocated     : 10.21 GiB\nRequested               : 36.00 MiB\nDevice limit            : 12.00 GiB\n"
                            "Free (according to CUDA): 12.00 MiB\n"
                            "Got an OOM, unloading all loaded models.\ngot prompt\nRequested to load Flux\n" + kFluxPlan;
  const Rebuilt a = rebuild(retry);
  ASSERT_EQ(a.rec.scenario.stages.size(), 1u);
  EXPECT_EQ(a.rec.scenario.stages[0].op, StageOp::load);
  EXPECT_TRUE(a.rec.scenario.from_log->plans.empty());
  EXPECT_EQ(a.log.loads.at(0).plan.has_value(), false);
  ASSERT_TRUE(a.log.loads.at(1).plan.has_value());
  // Interrupted, then requested again: the first is left out, the second keeps the dtype line.
  const std::string interrupted = std::string(kFluxHead) + "Requested to load Flux\nProcessing interrupted\ngot prompt\nRequested to load Flux\n" +
                                  kFluxPlan + kAttentionOom + "Traceback (most recent call last):\n"
                                  "  File \"/srv/ComfyUI/comfy/samplers.py\", line 1053, in sample\n"
                                  "  File \"/srv/ComfyUI/comfy/ldm/modules/attention.py\", line 530, in attention_pytorch\n";
  const Rebuilt b = rebuild(interrupted);
  ASSERT_EQ(b.rec.scenario.stages.size(), 2u) << format_facts(b.rec);
  EXPECT_EQ(b.rec.scenario.models[0].compute, Dtype::bf16);
  EXPECT_EQ(fact(b.rec, "model dit compute")->sure, Sureness::read);
  EXPECT_EQ(*b.rec.scenario.from_log->oom->stage, 1u);
  ASSERT_FALSE(b.rec.notes.empty());
  EXPECT_NE(b.rec.notes[0].find("line 7: Flux requested but its load never printed a plan line"), std::string::npos) << b.rec.notes[0];
}

TEST(FromLog, AnOomAfterOnlyAnInterruptedLoadIsAnErrorNotACrash) {
  // The only load was interrupted; the OOM's traceback says it came in a forward.
  const std::string text = std::string(kFluxHead) + "Requested to load Flux\nProcessing interrupted\n" +
                           "Traceback (most recent call last):\n  File \"/srv/ComfyUI/comfy/samplers.py\", line 1053, in sample\n" +
                           "torch.OutOfMemoryError: " + std::string(kAttentionOom).substr(36);
  EXPECT_EQ(read_comfy_log(text, "t.log").ooms.at(0).frames.size(), 1u);
  EXPECT_THROW(rebuild(text), InputError);
}

TEST(FromLog, APlanLineWithoutARequestIsAReplanNotAModel) {
  const std::string text = std::string(kFluxHead) + "Requested to load Flux\n" + kFluxPlan + kFluxPlan + kAttentionOom;
  const Rebuilt r = rebuild(text);
  EXPECT_EQ(r.rec.scenario.models.size(), 1u);
  EXPECT_EQ(r.rec.scenario.from_log->plans.size(), 1u);
  bool noted = false;
  for (const std::string& n : r.rec.notes) noted = noted || n.find("line 9: a plan line without a request") != std::string::npos;
  EXPECT_TRUE(noted) << format_facts(r.rec);
}

TEST(FromLog, APrefixOnEveryLineKeepsTheTraceback) {
  // docker logs -t: a timestamp before every line, frames included.
  std::string text;
  const std::string body = std::string(kFluxHead) + "Requested to load Flux\n" + kFluxPlan + kAttentionOom +
                           "Traceback (most recent call last):\n  File \"/srv/ComfyUI/comfy/ops.py\", line 98, in cast_bias_weight\n";
  std::size_t pos = 0;
  while (pos < body.size()) {
    const std::size_t nl = body.find('\n', pos);
    text += "2026-12-02T05:00:00.123456789Z " + body.substr(pos, nl - pos) + "\n";
    pos = nl + 1;
  }
  text += "2026-12-02T05:00:00.123456789Z torch.OutOfMemoryError: " + std::string(kAttentionOom).substr(36);
  const Rebuilt r = rebuild(text);
  ASSERT_EQ(r.log.ooms.size(), 1u);
  ASSERT_EQ(r.log.ooms[0].frames.size(), 1u);
  EXPECT_EQ(r.log.ooms[0].frames[0], "comfy/ops.py:cast_bias_weight");
  EXPECT_EQ(r.rec.scenario.from_log->oom->activity, "weight-cast");
}

TEST(FromLog, AClipVisionModelTakesNoneOfTheCheckpointsLoaderLines) {
  const std::string text = std::string(kFluxHead) + "Requested to load CLIPVisionModelProjection\n"
                           "loaded completely; 11000.00 MB usable, 1208.10 MB loaded, full load: True\nRequested to load Flux\n" +
                           kFluxPlan;
  FromLogOptions o;
  o.leave_out = {"CLIPVisionModelProjection"};
  const Rebuilt r = rebuild(text, o);
  ASSERT_EQ(r.rec.scenario.models.size(), 1u);
  EXPECT_EQ(r.rec.scenario.models[0].compute, Dtype::bf16);
  EXPECT_EQ(fact(r.rec, "model dit compute")->sure, Sureness::read);  // Flux keeps its "model weight dtype" line
}

TEST(FromLog, ADriverOomSaysNothingOfTheAllocatorAndTheCfgIsSaid) {
  const std::string text = std::string(kFluxHead).replace(std::string(kFluxHead).find("Device:"), 56, "") + "Requested to load Flux\n" +
                           kFluxPlan + "torch.AcceleratorError: CUDA error: out of memory\n";
  const Rebuilt r = rebuild(text);
  const LogFact* a = fact(r.rec, "allocator");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->sure, Sureness::assumed);
  EXPECT_EQ(r.rec.scenario.allocator.mode, AllocatorMode::async);  // ComfyUI's default, not "the driver's backend"
  const LogFact* cfg = fact(r.rec, "cfg");
  ASSERT_NE(cfg, nullptr);
  EXPECT_EQ(cfg->sure, Sureness::assumed);
  EXPECT_EQ(cfg->flag, "--cfg");
  FromLogOptions o;
  o.cfg = 3.5;
  EXPECT_EQ(rebuild(text, o).rec.scenario.workload.cfg, 3.5);
}

TEST(FromLog, TheReaderTakesEveryFormOfThePlanLine) {
  auto p = [](std::string_view t) { return parse_plan_line(t, "t"); };
  auto old = p("loaded partially 10795.05078125 10795.05078125 7");
  ASSERT_TRUE(old);
  EXPECT_TRUE(old->old_form);
  EXPECT_DOUBLE_EQ(*old->usable, 10795.05078125);
  EXPECT_FALSE(old->offloaded);
  EXPECT_EQ(old->lowvram_patches, 7u);
  auto unlimited = p("loaded completely 9.5367431640625e+25 4897.0483474731445 True");
  ASSERT_TRUE(unlimited);
  EXPECT_FALSE(unlimited->usable);  // 1e32 bytes: ComfyUI's "no limit"
  EXPECT_DOUBLE_EQ(unlimited->loaded, 4897.0483474731445);
  EXPECT_TRUE(*unlimited->full_load);
  auto no_buffer = p("loaded partially; 4651.05 MB usable, 4638.55 MB loaded, 258.50 MB offloaded, lowvram patches: 3");
  ASSERT_TRUE(no_buffer);
  EXPECT_FALSE(no_buffer->buffer);
  EXPECT_DOUBLE_EQ(*no_buffer->offloaded, 258.50);
  auto newest = p("loaded completely;  1403.92 MB loaded, full load: True");  // no usable figure: two spaces
  ASSERT_TRUE(newest);
  EXPECT_FALSE(newest->usable);
  EXPECT_DOUBLE_EQ(newest->loaded, 1403.92);
  auto early_dynamic = p("Model Flux prepared for dynamic VRAM loading. 11338MB Staged.");
  ASSERT_TRUE(early_dynamic);
  EXPECT_EQ(early_dynamic->staged_mb, 11338u);
  EXPECT_EQ(early_dynamic->forced, 0u);
  EXPECT_FALSE(p("Model Flux is ready"));
  EXPECT_THROW(p("loaded partially; 10795.05 MB usable, 107"), InputError);
  try {
    p("loaded partially; 10795.05 MB usable, 10795.05 MB loaded, 6385.55 MB offl");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("the line ends inside \" MB offloaded, \""), std::string::npos) << e.what();
  }
}

TEST(FromLog, TheReaderTakesBothBackendsMessagesAndTorchSizes) {
  EXPECT_EQ(parse_torch_size("1024.00 KiB")->bytes, MiB);
  EXPECT_EQ(parse_torch_size("0 bytes")->bytes, 0u);
  EXPECT_EQ(parse_torch_size("17.50 MiB.")->bytes, 17 * MiB + 512 * KiB);
  EXPECT_EQ(parse_torch_size("2.00 GiB")->precision, static_cast<Bytes>(0.005 * GiB));
  EXPECT_FALSE(parse_torch_size("2.00 GB"));
  // PyTorch before 2.1.
  auto old = parse_oom_text("CUDA out of memory. Tried to allocate 2.50 GiB (GPU 0; 23.56 GiB total capacity; 19.11 GiB already "
                            "allocated; 1.93 GiB free; 20.80 GiB reserved in total by PyTorch)",
                            "t");
  ASSERT_TRUE(old);
  EXPECT_EQ(old->requested, static_cast<Bytes>(std::llround(2.5 * GiB)));
  EXPECT_EQ(*old->total, static_cast<Bytes>(std::llround(23.56 * GiB)));
  EXPECT_EQ(*old->free, static_cast<Bytes>(std::llround(1.93 * GiB)));
  // Another process listed.
  auto procs = parse_oom_text("CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 31.36 GiB of which 471.69 MiB "
                              "is free. Including non-PyTorch memory, this process has 16.63 GiB memory in use. Process 19239 has "
                              "14.26 GiB memory in use. Of the allocated memory 15.03 GiB is allocated by PyTorch, and 1.00 GiB is "
                              "reserved by PyTorch but unallocated.",
                              "t");
  ASSERT_TRUE(procs);
  ASSERT_EQ(procs->other_processes.size(), 1u);
  EXPECT_EQ(procs->other_processes[0], static_cast<Bytes>(std::llround(14.26 * GiB)));
  EXPECT_EQ(*procs->reserved_unallocated, GiB);
  EXPECT_EQ(*procs->process_used, static_cast<Bytes>(std::llround(16.63 * GiB)));
  EXPECT_EQ(parse_oom_text("HIP out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.98 GiB of which 6.00 MiB is free.", "t")
                ->requested,
            20 * MiB);
  EXPECT_EQ(parse_oom_text("torch.AcceleratorError: CUDA error: out of memory", "t")->backend, "driver");
  EXPECT_THROW(parse_oom_text("CUDA out of memory. Tried to allocate 640.00 MiB. GPU 0 has a tot", "t"), InputError);
  EXPECT_THROW(parse_oom_text("Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated     : 11.26 GiB", "t"),
               InputError);
}

TEST(FromLog, TheScenarioKeepsTheLogRecordAndChecksIt) {
  const Rebuilt r = rebuild(kOriginLog);
  const std::string json = scenario_to_json(r.rec.scenario);
  Catalog catalog;
  const Scenario back = parse_scenario_json(json, catalog, "s.json");
  ASSERT_TRUE(back.from_log);
  EXPECT_EQ(scenario_to_json(back), json);
  EXPECT_EQ(back.from_log->digest, r.log.digest);
  EXPECT_FALSE(scenario_fingerprint(back) == scenario_fingerprint([&] {
    Scenario t = back;
    t.from_log->plans.clear();
    return t;
  }()));
  auto doc = nlohmann::json::parse(json);
  auto bad = [&](auto edit, std::string_view where) {
    nlohmann::json d = doc;
    edit(d);
    try {
      parse_scenario_json(d.dump(), catalog, "s.json");
      ADD_FAILURE() << "accepted " << where;
    } catch (const InputError& e) {
      EXPECT_EQ(e.path(), where) << e.what();
    }
  };
  bad([](nlohmann::json& d) { d["from_log"]["digest"] = "md5:1234"; }, "from_log.digest");
  bad([](nlohmann::json& d) { d["from_log"]["plans"][0]["stage"] = 1; }, "from_log.plans[0].stage");  // a forward stage
  bad([](nlohmann::json& d) { d["from_log"]["plans"][0]["text"] = "loaded partially; 12 MB usable"; }, "from_log.plans[0].text");
  bad([](nlohmann::json& d) { d["from_log"]["oom"]["activity"] = "sampling"; }, "from_log.oom.activity");
  bad([](nlohmann::json& d) { d["from_log"]["oom"]["text"] = "it broke"; }, "from_log.oom.text");
}

TEST(FromLog, AModelClassTheCatalogCannotStandForAsksForModel) {
  std::string text = kOriginLog;
  text.replace(text.find("Requested to load Flux2TEModel_"), 31, "Requested to load WanTEModel");
  try {
    rebuild(text);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "--model");
    EXPECT_NE(std::string(e.what()).find("--model WanTEModel=FILE"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--leave-out WanTEModel"), std::string::npos) << e.what();
  }
  // A ControlNet beside the model: left out on request, and said so.
  std::string with_cn = kOriginLog;
  with_cn.insert(with_cn.find("Requested to load Flux2TEModel_"), "Requested to load ControlNet\nloaded completely; 11000.00 MB usable, 1250.00 MB loaded, full load: True\n");
  FromLogOptions o;
  o.leave_out = {"ControlNet"};
  const Rebuilt r = rebuild(with_cn, o);
  EXPECT_EQ(r.rec.scenario.models.size(), 1u);
  ASSERT_FALSE(r.rec.notes.empty());
  EXPECT_NE(r.rec.notes[0].find("ControlNet left out (--leave-out), 1250.00 MB by its plan line"), std::string::npos) << r.rec.notes[0];
  o.leave_out = {"CLIPVisionModelProjection"};
  EXPECT_THROW(rebuild(with_cn, o), InputError);  // a class the log does not load
}

class FromLogCli : public test::TempDirTest {
 protected:
  test::Proc run(std::vector<std::string> args) { return test::run_process(VF_CLI, std::move(args), dir_, 120); }
  fs::path write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return dir_ / name;
  }
};

TEST_F(FromLogCli, WritesTheScenarioAndRunReportsReproduced) {
  write("comfy.log", kOriginLog);
  const test::Proc p = run({"from-log", "comfy.log", "--out", "s.json"});
  test::expect_clean(p);
  ASSERT_EQ(p.exit_code, 0) << test::describe(p);
  EXPECT_NE(p.out.find("against the log: reproduced"), std::string::npos) << p.out;
  const test::Proc r = run({"run", "s.json"});
  ASSERT_EQ(r.exit_code, 1) << test::describe(r);  // an OOM the plan said fits: a finding
  EXPECT_NE(r.out.find("against the log: reproduced"), std::string::npos) << r.out;
  // Without --out the scenario goes to stdout, the report to stderr.
  const test::Proc q = run({"from-log", "comfy.log", "--no-run"});
  ASSERT_EQ(q.exit_code, 0) << test::describe(q);
  EXPECT_EQ(nlohmann::json::parse(q.out)["policy"], "comfy:oct2025");
  EXPECT_NE(q.err.find("used by others"), std::string::npos);
}

TEST_F(FromLogCli, FlagsOutsideTheirRangeAndAnEmptyModelFileAreErrors) {
  write("comfy.log", kOriginLog);
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--width", "0"}, {"--steps", "0"}, {"--batch", "65"}, {"--model", "Flux="}, {"--tolerance", "lots"},
        {"--os", "mac"}}) {
    std::vector<std::string> args = {"from-log", "comfy.log", "--out", "never.json"};
    args.insert(args.end(), bad.begin(), bad.end());
    const test::Proc p = run(args);
    test::expect_clean(p);
    EXPECT_EQ(p.exit_code, 2) << bad[0] << " " << bad[1] << "\n" << test::describe(p);
    EXPECT_NE(p.err.find(bad[0]), std::string::npos) << p.err;
    EXPECT_FALSE(fs::exists(dir_ / "never.json")) << bad[0];
  }
}

TEST_F(FromLogCli, ALogWithoutItsStartupLinesAsksForVram) {
  std::string text = kOriginLog;
  text.erase(0, text.find("got prompt"));
  write("tail.log", text);
  const test::Proc p = run({"from-log", "tail.log", "--no-run"});
  test::expect_clean(p);
  EXPECT_EQ(p.exit_code, 2) << test::describe(p);
  EXPECT_NE(p.err.find("--vram: the log has no \"Total VRAM N MB\" line"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("a total capacity of 12288.00 MiB"), std::string::npos) << p.err;  // the OOM message's device limit, as a hint
  const test::Proc ok = run({"from-log", "tail.log", "--vram", "12GiB", "--out", "t.json"});
  ASSERT_EQ(ok.exit_code, 0) << test::describe(ok);
  EXPECT_NE(ok.out.find("device total      12288.00 MiB  "), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("given"), std::string::npos) << ok.out;
  // No Device line: the allocator comes from the OOM message's form.
  EXPECT_NE(ok.out.find("the OOM message is the cudaMallocAsync backend's"), std::string::npos) << ok.out;
}

TEST_F(FromLogCli, GarbageAndTruncatedLogsExitTwoNamingTheLine) {
  write("bin.log", std::string("Total VRAM 12288 MB, total RAM 1 MB\n\x7f" "ELF\x02\x01\x01\0\0\0", 46));
  const test::Proc bin = run({"from-log", "bin.log"});
  test::expect_clean(bin);
  EXPECT_EQ(bin.exit_code, 2) << test::describe(bin);
  EXPECT_NE(bin.err.find("bin.log:line 2: byte 0x7f at offset 36 is not text"), std::string::npos) << bin.err;
  write("noise.log", "hello\nthis is not comfyui\n");
  const test::Proc noise = run({"from-log", "noise.log"});
  EXPECT_EQ(noise.exit_code, 2) << test::describe(noise);
  EXPECT_NE(noise.err.find("none of its 2 lines is a ComfyUI line"), std::string::npos) << noise.err;
  std::string cut = kOriginLog;
  cut.resize(cut.find("loaded partially 10795.05 10795.05 0") + 24);  // "loaded partially 10795.0", then the end
  write("cut.log", cut);
  const test::Proc c = run({"from-log", "cut.log"});
  EXPECT_EQ(c.exit_code, 2) << test::describe(c);
  EXPECT_NE(c.err.find("cut.log:line 17: a \"loaded partially\" line that is cut off"), std::string::npos) << c.err;
  std::string oom = kOriginLog;
  oom.resize(oom.find("Requested               : 640.00 MiB"));  // the async block ends after "Currently allocated"
  write("oom.log", oom);
  const test::Proc o = run({"from-log", "oom.log"});
  EXPECT_EQ(o.exit_code, 2) << test::describe(o);
  EXPECT_NE(o.err.find("oom.log:line 18: the cudaMallocAsync out-of-memory message is cut off"), std::string::npos) << o.err;
  write("empty.log", "");
  EXPECT_EQ(run({"from-log", "empty.log"}).exit_code, 2);
}

TEST_F(FromLogCli, AShrunkReproSaysWhichLogItCameFromAndHowToRunItInComfyUi) {
  write("comfy.log", kOriginLog);
  ASSERT_EQ(run({"from-log", "comfy.log", "--out", "s.json", "--no-run"}).exit_code, 0);
  ASSERT_EQ(run({"run", "s.json", "--json", "finding.json"}).exit_code, 1);
  const test::Proc sh = run({"shrink", "finding.json", "--out", "repro"});
  ASSERT_EQ(sh.exit_code, 1) << test::describe(sh);
  const std::string md = test::read_file(dir_ / "repro" / "repro.md");
  EXPECT_NE(md.find("**From log:** `comfy.log` (fnv1a64:"), std::string::npos) << md;
  EXPECT_NE(md.find("its OOM at line 18: \"Allocation on device 0 would exceed allowed memory. (out of memory)\""), std::string::npos) << md;
  EXPECT_NE(md.find("## Reproduce in ComfyUI"), std::string::npos) << md;
  EXPECT_NE(md.find("ComfyUI 0.3.75 or older"), std::string::npos) << md;
  // The repro's record is where it came from, not the log's plan line (its case is smaller).
  const auto repro = nlohmann::json::parse(test::read_file(dir_ / "repro" / "repro.json"));
  EXPECT_FALSE(repro["scenario"]["from_log"].contains("plans"));
  EXPECT_FALSE(repro["scenario"]["from_log"]["oom"].contains("stage"));
  const test::Proc rr = run({"run", "repro/repro.json"});
  EXPECT_NE(rr.out.find("from log comfy.log (fnv1a64:"), std::string::npos) << rr.out;
  EXPECT_NE(rr.out.find("shrunk or edited since, nothing to compare"), std::string::npos) << rr.out;
}

TEST_F(FromLogCli, AModelFileStandsForAClassTheCatalogDoesNotHave) {
  // Wan's umt5 text encoder is not in the catalog: --model WanTEModel=FILE gives it (here the
  // inline model JSON `models import --out` writes: 24 x 80 MiB bf16 weights = 1920 MiB).
  write("umt5.json", R"({"kind": "text_encoder", "family": "t5", "modules": [{"name": "blk", "repeat": 24,
      "tensors": [{"name": "weight", "shape": [10240, 4096], "dtype": "bf16"}]}]})");
  const std::string log = R"(Total VRAM 24576 MB, total RAM 65436 MB
Device: cuda:0 NVIDIA GeForce RTX 4090 : cudaMallocAsync
ComfyUI version: 0.4.0
got prompt
CLIP/text encoder model load device: cuda:0, offload device: cpu, current: cpu, dtype: torch.float16
Requested to load WanTEModel
loaded completely; 22331.05 MB usable, 1920.00 MB loaded, full load: True
Prompt executed in 3.02 seconds
)";
  FromLogOptions o;
  o.models = {{"WanTEModel", (dir_ / "umt5.json").string()}};
  const Rebuilt r = rebuild(log, o);
  ASSERT_EQ(r.rec.scenario.models.size(), 1u);
  EXPECT_EQ(r.rec.scenario.models[0].id, "te");
  EXPECT_EQ(r.rec.scenario.models[0].spec->bytes, 1920 * MiB);
  EXPECT_EQ(r.rec.scenario.models[0].compute, Dtype::fp16);
  EXPECT_EQ(fact(r.rec, "model te")->sure, Sureness::given);
  EXPECT_EQ(r.cmp.status, LogComparison::Status::plan_matches) << r.cmp.summary << "\n" << format_facts(r.rec);
  // A --model no load asks for is an error, not silently unused.
  o.models.push_back({"QwenImage", (dir_ / "umt5.json").string()});
  EXPECT_THROW(rebuild(log, o), InputError);
  // Through the CLI, a missing file names the flag.
  write("wan.log", log);
  const test::Proc p = run({"from-log", "wan.log", "--model", "WanTEModel=missing.safetensors", "--no-run"});
  test::expect_clean(p);
  EXPECT_EQ(p.exit_code, 2) << test::describe(p);
  EXPECT_NE(p.err.find("--model missing.safetensors"), std::string::npos) << p.err;
}

TEST(FromLog, ReproduceInComfyUiNamesTheFlagsTheCaseNeeds) {
  Catalog catalog;
  Scenario s = parse_scenario_json(
      R"({"device": {"total": "12GiB", "used_by_others": "1GiB"}, "allocator": "caching",
          "policy": {"name": "comfy:dec2025", "overrides": {"reserve": "1GiB"}}, "offload_streams": 0,
          "models": [{"id": "te", "source": "catalog:flux2-text-encoder", "storage": "fp8_e4m3fn", "compute": "fp32"}]})",
      catalog, "s.json");
  const std::string md = comfyui_reproduction(s, GiB);
  EXPECT_NE(md.find("python main.py --disable-dynamic-vram --reserve-vram 1 --disable-async-offload --disable-cuda-malloc"), std::string::npos)
      << md;
  // 12 GiB - 1 GiB others = 11 GiB to leave free on a larger card.
  EXPECT_NE(md.find("torch.empty(C - 11811160064"), std::string::npos) << md;
  EXPECT_NE(md.find("CLIPTextEncode with `te` (flux2-text-encoder stored fp8_e4m3fn, compute fp32)"), std::string::npos) << md;
}

}  // namespace
}  // namespace vf

// Reading a ComfyUI console log: the lines that say what the runtime saw and did (startup
// figures, each model load and its plan line, progress bars, PyTorch's OOM message and the
// traceback that led to it), with the line each came from. Everything else (custom nodes'
// output, warnings, HTTP noise) is skipped. Real logs carry Windows paths, ANSI colours,
// progress bars redrawn with '\r' and logging prefixes ("[2026-02-28 12:00:01.123]",
// "INFO:root:"): the reader finds each known line by its own words wherever it starts.
//
// A line that starts a known form and does not finish it (a truncated plan line, an OOM message
// cut off before its figures) is an InputError naming the line; so is input that is not text.
// docs/from-log.md lists every form.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "harness/core/bytes.h"

namespace vf {

// One "loaded completely" / "loaded partially" / "prepared for dynamic VRAM loading" line.
struct LogPlanLine {
  enum class Kind : std::uint8_t { complete, partial, dynamic };
  Kind kind = Kind::complete;
  std::uint32_t line = 0;
  std::string text;            // from "loaded ..." / "Model ..." to the end of the line
  // Classic lines, in the log's MB (MiB) with two decimals.
  std::optional<double> usable;     // absent in ComfyUI's oldest "loaded completely" form
  double loaded = 0;
  std::optional<double> offloaded;  // partial, except in the oldest form
  bool old_form = false;            // "loaded partially U L N": up to October 2025
  std::optional<double> buffer;     // partial, since PR #10733 ("B MB buffer reserved")
  std::uint32_t lowvram_patches = 0;
  std::optional<bool> full_load;    // complete: "full load: True|False"
  // Dynamic lines.
  std::string model_class;          // "Model CLASS prepared for ..."
  std::uint64_t staged_mb = 0;      // "N MB Staged" (whole MiB, floored)
  std::uint32_t patches = 0;        // "P patches attached"
  bool patches_given = false;       // early dynamic builds end after "Staged."
  std::uint32_t forced = 0;         // "Force pre-loaded K weights"
  std::uint64_t forced_kb = 0;      // "... S KB"
};

// Parses one plan line's text (from "loaded" / "Model" on). nullopt when the text is not a plan
// line at all; InputError(where) when it starts one and is malformed or cut off.
std::optional<LogPlanLine> parse_plan_line(std::string_view text, const std::string& where);

// PyTorch's out-of-memory message, from either allocator backend.
struct LogOom {
  std::uint32_t line = 0;            // where the message starts
  std::string text;                  // the message as read (lines joined with "\n")
  std::string backend;               // "native" or "cudaMallocAsync" (by the message's form)
  Bytes requested = 0;               // "Tried to allocate X" / "Requested : X"
  Bytes precision = 0;               // half a unit of the last printed digit of `requested`
  std::optional<Bytes> total;        // "total capacity of Y" / "Device limit : Y"
  std::optional<Bytes> free;         // "of which Z is free" / "Free (according to CUDA): Z"
  std::optional<Bytes> process_used; // "this process has W memory in use"
  std::optional<Bytes> allocated;    // "V is allocated by PyTorch" / "Currently allocated : V"
  std::optional<Bytes> reserved_unallocated;  // "U is reserved by PyTorch but unallocated"
  std::vector<Bytes> other_processes;          // "Process N has X memory in use" lines
  // The traceback's frames that led to it, innermost last: "comfy/ops.py:cast_bias_weight".
  std::vector<std::string> frames;
};

// Parses PyTorch's message: the native backend's one line, or the cudaMallocAsync backend's
// block (its lines joined with "\n"). nullopt when `text` is neither; InputError(where) when it
// starts one and is cut off before the requested size and the device's figures.
std::optional<LogOom> parse_oom_text(std::string_view text, const std::string& where);

struct LogSizeText {
  Bytes bytes = 0;
  Bytes precision = 0;
};
// "640.00 MiB", "11.76 GiB", "512 bytes", "1.5 KiB": PyTorch's format_size. nullopt otherwise.
std::optional<LogSizeText> parse_torch_size(std::string_view text);

// What the loader said about a model before it was requested: "model weight dtype X, manual
// cast: Y", "CLIP/text encoder model load device: ..., dtype: Z", "VAE load device: ..., dtype:
// Z", "Using scaled fp8: ...", "gguf qtypes: Q8_0 (304), F32 (471)" (each line 0: not seen).
struct LogLoaderLines {
  std::string weight_dtype;            // torch dtype name without "torch.", e.g. "float8_e4m3fn"
  std::uint32_t weight_dtype_line = 0;
  std::string manual_cast;             // "bfloat16", "None" or empty
  std::string te_dtype;                // the text encoder's dtype
  std::uint32_t te_dtype_line = 0;
  std::string vae_dtype;
  std::uint32_t vae_dtype_line = 0;
  std::uint32_t scaled_fp8_line = 0;   // its weights are scaled fp8
  std::string gguf_qtype;              // the qtype with the most tensors
  std::uint32_t gguf_line = 0;
};

struct LogLoad : LogLoaderLines {
  std::uint32_t line = 0;              // "Requested to load CLASS"
  std::string model_class;
  std::optional<LogPlanLine> plan;     // absent when the load did not finish (an OOM in it)
  bool requested = false;              // false: only a plan line shows it (no "Requested to load")
  bool abandoned = false;              // requested again (or failed) before its plan line came
};

// The PyTorch memory summary newer ComfyUI prints after an OOM ("Memory summary: |===..."): the
// "Allocated memory" and "GPU reserved memory" rows' current and peak (whole units).
struct LogMemorySummary {
  std::uint32_t line = 0;
  std::optional<Bytes> allocated_cur, allocated_peak, reserved_cur, reserved_peak;
};

struct ComfyLog {
  std::uint32_t lines = 0;
  std::uint64_t digest = 0;            // FNV-1a 64 of the raw bytes: which log a repro came from
  // Startup.
  std::optional<std::uint64_t> total_vram_mb;  // "Total VRAM N MB, total RAM M MB"
  std::uint32_t total_vram_line = 0;
  std::string device;                  // "cuda:0 NVIDIA GeForce RTX 3060"
  std::string backend;                 // "native" / "cudaMallocAsync" (Device line)
  std::uint32_t device_line = 0;
  std::string comfy_version;           // "0.3.73"
  std::uint32_t comfy_version_line = 0;
  std::optional<std::uint32_t> async_streams;  // "Using async weight offloading with N streams"
  std::uint32_t async_streams_line = 0;
  std::optional<bool> dynamic_vram;    // enabled / disabled message
  std::uint32_t dynamic_vram_line = 0;
  // Windows drive paths ("D:\ComfyUI\...") in some line: ComfyUI's Windows reserve applies.
  std::uint32_t windows_line = 0;
  // Flags from the command line the launcher echoed ("... main.py --reserve-vram 2 ...").
  std::vector<std::string> flags;      // "--reserve-vram", "2", ... as given
  std::uint32_t flags_line = 0;
  // What happened.
  std::vector<LogLoad> loads;
  std::uint32_t steps = 0;             // the last progress bar's total before the OOM (0: none)
  std::uint32_t steps_line = 0;
  std::vector<LogOom> ooms;            // every distinct OOM message, in order
  std::optional<LogMemorySummary> memory_summary;  // the first one
};

// Reads a whole log. `origin` names it in errors ("comfy.log:line 12: ..."). InputError when the
// input is not text, is cut off inside a known form, or holds no ComfyUI line at all.
ComfyLog read_comfy_log(std::string_view text, const std::string& origin);

// The flag's value in `log.flags` ("--reserve-vram" -> "2"), "" when given without one,
// nullopt when not given.
std::optional<std::string> log_flag(const ComfyLog& log, std::string_view flag);

std::string_view plan_kind_name(LogPlanLine::Kind k);

// `s` with every byte sequence that is not UTF-8 replaced by U+FFFD (a cp1252 path, a file name):
// what goes into JSON and reports.
std::string log_text_clean(std::string_view s);

}  // namespace vf

// Reproducers people can file: `vramfuzz.repro/1` JSON (the minimal scenario, signature, bytes,
// trace around the peak, reliability, seed and choices, tool version, environment, the exact
// replay command) and repro.md, a ready-to-file issue body. A repro file is data only: replaying
// it never runs a command named inside it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/shrink.h"

namespace vf {

inline constexpr std::string_view kReproSchema = "vramfuzz.repro/1";

// Where the case came from, when known.
struct ReproOrigin {
  std::optional<std::uint64_t> campaign_seed;
  std::optional<std::uint64_t> case_index;
  std::optional<std::uint64_t> case_seed;
  std::vector<std::uint64_t> choices;  // the generator's recorded draws
  std::string source_file;             // the finding it was shrunk from
  std::string found_by;                // the command that generates the case (its last one), when known
};

// `path` is where the repro will be written (it goes into the replay command).
std::string repro_json(const ShrinkResult& r, const ReproOrigin& origin, const std::string& path);
std::string repro_markdown(const ShrinkResult& r, const ReproOrigin& origin, const std::string& path);
// A one-line title: "oom:forward:upcast:raw: te OOMs converting fp8_e4m3fn -> fp32 (12 GiB, raw)".
std::string repro_title(const ShrinkResult& r);

// Writes DIR/repro.json and DIR/repro.md atomically; returns the repro.json path.
std::string write_repro(const std::string& dir, const ShrinkResult& r, const ReproOrigin& origin);

// One word of a command line as a POSIX shell reads it back: as is when it holds only safe
// characters, else in single quotes (for the commands vramfuzz prints for people to paste).
std::string shell_quote(std::string_view word);

// What a repro file records of the shrink that made it (its signature, the bytes.*_overshoot and
// shrink_margin, reliability, and the shrink block), as a ShrinkResult without `minimal`,
// `result` and `final_size`: with those from the file's scenario (run again; case_size), write_repro renders the repro
// with this version and keeps its lineage (`vramfuzz render-repro`). InputError naming the field
// for a file that is not a repro or lacks one of them.
ShrinkResult read_repro_lineage(const std::string& path);

// Reads the origin block back from a finding / repro file (campaign seed, case seed, choices).
// Absent fields stay unknown; a present one of the wrong type (null included) is an InputError.
ReproOrigin read_origin(const std::string& path);

// The signature a finding / repro / result file records: "" when it has none (a plain scenario).
// Present but not a string (null included) is InputError("<prefix>signature"): `replay` would
// otherwise take any finding as reproducing it.
std::string recorded_signature(const nlohmann::json& doc, const std::string& prefix = "");

}  // namespace vf

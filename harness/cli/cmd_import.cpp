// vramfuzz models import FILE... : reads safetensors / GGUF headers (never the weights), prints
// what the loader will see, and writes the inline-model fragment a scenario embeds.
#include <algorithm>
#include <cstdio>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "harness/cli/commands.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "models/import.h"

namespace vf::cli {
namespace {

struct ImportFlags {
  std::vector<std::string> files;
  std::string name;
  std::string family;
  std::string out;
  std::size_t top = 5;
};

constexpr std::size_t kMaxTop = 100;

// The fragment must load back as the model it describes: parse it inside a minimal scenario.
void verify_fragment(const std::string& fragment, const ModelSpec& m, const std::string& out) {
  nlohmann::json doc;
  doc["schema"] = kScenarioSchema;
  doc["device"] = {{"total", "1024GiB"}};
  doc["models"] = nlohmann::json::array({nlohmann::json::parse(fragment)});
  Catalog catalog;
  const Scenario s = parse_scenario_json(doc.dump(), catalog, out);
  const ModelSpec& back = *s.models.at(0).spec;
  if (back.bytes != m.bytes || back.params != m.params || back.modules.size() != m.modules.size()) {
    throw InfraError(fmt::format("the fragment for {} does not load back as the same model ({} vs {} bytes)", out, back.bytes, m.bytes));
  }
}

int do_import(const ImportFlags& f) {
  ImportOptions opts;
  opts.name = f.name;
  if (!f.family.empty()) {
    const auto fam = parse_family(f.family);
    if (!fam) throw InputError("--family", fmt::format("unknown family \"{}\" (flux, flux2, sd3, qwen_image, wan21, sdxl, sd15, t5, clip, "
                                                      "mistral, vae_kl, generic)",
                                                      f.family));
    opts.family = *fam;
  }
  const ImportedModel r = import_model_files(f.files, opts);
  const ModelSpec& m = r.model;
  for (const std::string& w : r.warnings) spdlog::warn("{}", w);

  std::string text;
  text += fmt::format("{}: {}\n", m.name, r.format);
  text += fmt::format("family {} ({}), kind {}\n", family_name(m.family), r.family_reason, kind_name(m.kind));
  if (!r.stripped_prefix.empty()) text += fmt::format("prefix removed: {}\n", r.stripped_prefix);
  if (!r.quantization.empty()) text += fmt::format("quantization: {}\n", r.quantization);
  // Binary units labelled as such, like `models show` (docs/formats.md: MB/GB mean MiB/GiB).
  text += fmt::format("{} modules, {} tensors, {} params, {} ({:.2f} GiB)\n", m.modules.size(), r.tensors, m.params, format_mib(m.bytes),
                      static_cast<double>(m.bytes) / static_cast<double>(GiB));
  text += fmt::format("memory_usage_factor {:.3f}; arch: latent {} ch, hidden {}, widest {}{}, text tokens {}, patch {}, temporal /{}\n",
                      m.memory_usage_factor, m.arch.latent_channels, m.arch.hidden, m.arch.widest, m.arch.gated ? " (gated)" : "",
                      m.arch.text_tokens, m.arch.patch, m.arch.temporal_down);
  std::map<std::string_view, std::pair<Bytes, std::size_t>> by_dtype;
  for (const Module& mod : m.modules) {
    for (const Tensor& t : mod.tensors) {
      auto& d = by_dtype[dtype_name(t.dtype)];
      d.first += t.bytes;
      ++d.second;
    }
  }
  text += cast_hook_summary(m);
  text += "bytes by dtype:\n";
  for (const auto& [d, v] : by_dtype) text += fmt::format("  {:<12} {:>16} {:>7} tensors\n", d, format_mib(v.first), v.second);
  std::vector<const Module*> largest;
  for (const Module& mod : m.modules) largest.push_back(&mod);
  const std::size_t top = std::min(largest.size(), f.top);
  std::partial_sort(largest.begin(), largest.begin() + static_cast<std::ptrdiff_t>(top), largest.end(),
                    [](const Module* a, const Module* b) { return a->bytes != b->bytes ? a->bytes > b->bytes : a->name < b->name; });
  text += fmt::format("largest modules:\n");
  for (std::size_t i = 0; i < top; ++i) {
    text += fmt::format("  {:<56} {:>14}\n", largest[i]->name.empty() ? "(root)" : largest[i]->name, format_mib(largest[i]->bytes));
  }
  if (!f.out.empty()) {
    const std::string fragment = model_fragment_json(m, m.name);
    verify_fragment(fragment, m, f.out);
    write_file_atomic(f.out, fragment);
    text += fmt::format("wrote {} (an inline model for a scenario's \"models\" list)\n", f.out);
  }
  std::fputs(text.c_str(), stdout);
  return kExitOk;
}

}  // namespace

void add_import(CLI::App& models, Action& action) {
  auto f = std::make_shared<ImportFlags>();
  CLI::App* cmd = models.add_subcommand("import", "read safetensors / GGUF headers into a model (never the weights)");
  cmd->add_option("files", f->files, "a .safetensors file, a *.safetensors.index.json, a .gguf, or the shards of one model")->required();
  cmd->add_option("--name", f->name, "model name (default: from the file name)");
  cmd->add_option("--family", f->family, "model family when the names cannot tell it (flux, flux2, sd3, sdxl, sd15, t5, ...)");
  cmd->add_option("--out", f->out, "write the inline-model JSON fragment a scenario embeds");
  cmd->add_option("--top", f->top, "largest modules to list")->capture_default_str()->transform(kNonNegative)->check(CLI::Range(std::size_t{0}, kMaxTop));
  cmd->callback([f, &action] { action = [f] { return do_import(*f); }; });
}

}  // namespace vf::cli

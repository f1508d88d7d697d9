// vramfuzz models list / show.
#include <cstdio>
#include <map>

#include <fmt/format.h>

#include "harness/cli/commands.h"
#include "harness/core/error.h"
#include "models/activation.h"
#include "models/catalog.h"

namespace vf::cli {
namespace {

// Sizes in binary units like the rest of the CLI (docs/formats.md: MB/GB mean MiB/GiB), labelled
// GiB; docs/models.md's catalog table quotes file sizes in decimal GB and says so.
std::string gib2(Bytes b) { return fmt::format("{:.2f} GiB", static_cast<double>(b) / static_cast<double>(GiB)); }

int do_list() {
  std::fputs(fmt::format("{:<20} {:<13} {:<10} {:>16} {:>12}  {}\n", "name", "kind", "family", "params", "native", "description").c_str(), stdout);
  for (const CatalogEntry& e : catalog_entries()) {
    const ModelSpec m = build_catalog_model(e.name, StorageChoice{e.native_dtype, true}, "models");
    std::fputs(fmt::format("{:<20} {:<13} {:<10} {:>16} {:>12}  {}\n", e.name, kind_name(e.kind), family_name(e.family),
                           fmt::format("{:.3f} B", static_cast<double>(m.params) / 1e9),
                           fmt::format("{} {}", dtype_name(e.native_dtype), gib2(m.bytes)),
                           e.description)
                   .c_str(),
               stdout);
  }
  return kExitOk;
}

int do_show(const std::string& name, const std::string& storage, bool unscaled, bool modules) {
  const CatalogEntry* e = find_catalog_entry(name);
  StorageChoice sc{e ? e->native_dtype : Dtype::bf16, !unscaled};
  if (!storage.empty()) {
    const auto d = parse_dtype(storage);
    if (!d) throw InputError("--storage", fmt::format("unknown dtype \"{}\" (known: {})", storage, dtype_list()));
    sc.dtype = *d;
  }
  const ModelSpec m = build_catalog_model(name, sc, "models show");
  // The same rule as a scenario's "scaled": per-weight scales exist for fp8 and int8 only.
  if (unscaled && !dtype_info(sc.dtype).fp8 && sc.dtype != Dtype::int8) {
    throw InputError("--unscaled", fmt::format("applies to fp8 and int8 storage only, not {}", dtype_name(sc.dtype)));
  }
  std::fputs(fmt::format("{} ({}, family {}): {} params, {} modules, {} ({}) stored as {}{}\n", m.name,
                         kind_name(m.kind), family_name(m.family), m.params, m.modules.size(), format_mib(m.bytes),
                         gib2(m.bytes), dtype_name(sc.dtype),
                         (dtype_info(sc.dtype).fp8 || sc.dtype == Dtype::int8) ? (sc.scaled ? " (scaled)" : " (unscaled)") : "")
                 .c_str(),
             stdout);
  std::fputs(fmt::format("memory_usage_factor {:.3f}; arch: latent {} ch, hidden {}, widest {}{}, text tokens {}, patch {}, temporal /{}\n",
                         m.memory_usage_factor, m.arch.latent_channels, m.arch.hidden, m.arch.widest, m.arch.gated ? " (gated)" : "",
                         m.arch.text_tokens, m.arch.patch, m.arch.temporal_down)
                 .c_str(),
             stdout);
  std::map<std::string_view, Bytes> by_dtype;
  const Module* largest = nullptr;
  for (const Module& mod : m.modules) {
    for (const Tensor& t : mod.tensors) by_dtype[dtype_name(t.dtype)] += t.bytes;
    if (!largest || mod.bytes > largest->bytes) largest = &mod;
  }
  for (const auto& [d, b] : by_dtype) std::fputs(fmt::format("  {:<12} {}\n", d, format_mib(b)).c_str(), stdout);
  if (largest) {
    std::fputs(fmt::format("largest module: {} ({})\n", largest->name.empty() ? "(root)" : largest->name, format_mib(largest->bytes)).c_str(),
               stdout);
  }
  if (m.kind != ModelKind::text_encoder) {
    // What each activation source would size one forward at (docs/activations.md).
    const Workload w;
    const Bytes est = comfy_memory_required(m, w, 1, Dtype::bf16, true, "models show");
    const Bytes live = activation_working_set(m, w, 1, Dtype::bf16, "models show");
    const ActivationMarginRange& range = catalog_activation_margin();
    std::fputs(fmt::format("activations at 1024x1024, batch 1, bf16: ComfyUI's estimate {}, vramfuzz's formula {} (estimate / "
                           "formula {:.2f}{})\n",
                           format_mib(est), format_mib(live), static_cast<double>(est) / static_cast<double>(live),
                           m.kind == ModelKind::diffusion ? fmt::format("; catalog diffusion models {:.2f} ({}) .. {:.2f} ({})", range.lo,
                                                                        range.lo_model, range.hi, range.hi_model)
                                                          : std::string())
                   .c_str(),
               stdout);
  }
  std::fputs(cast_hook_summary(m).c_str(), stdout);
  if (modules) {
    for (const Module& mod : m.modules) {
      std::string tensors;
      for (const Tensor& t : mod.tensors) {
        std::string shape;
        for (std::uint64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        tensors += fmt::format(" {}[{}] {}", t.name, shape, dtype_name(t.dtype));
      }
      const std::string_view tag = module_tag(mod);
      std::fputs(fmt::format("  {:<48} {:>14} {}{}\n", mod.name.empty() ? "(root)" : mod.name, format_mib(mod.bytes), tensors,
                             tag.empty() ? "" : fmt::format("  [{}]", tag))
                     .c_str(),
                 stdout);
    }
  }
  return kExitOk;
}

}  // namespace

void add_models(CLI::App& app, Action& action) {
  CLI::App* cmd = app.add_subcommand("models", "the built-in model catalog");
  cmd->require_subcommand(1);
  CLI::App* list = cmd->add_subcommand("list", "list catalog models");
  list->callback([&action] { action = [] { return do_list(); }; });
  struct ShowFlags {
    std::string name, storage;
    bool unscaled = false, modules = false;
  };
  auto f = std::make_shared<ShowFlags>();
  CLI::App* show = cmd->add_subcommand("show", "show one catalog model");
  show->add_option("name", f->name, "catalog model name")->required();
  show->add_option("--storage", f->storage, "storage dtype to apply (fp8_e4m3fn, q4_k, ...)");
  show->add_flag("--unscaled", f->unscaled, "fp8/int8 without per-weight scales");
  show->add_flag("--modules", f->modules, "list every module and tensor");
  show->callback([f, &action] { action = [f] { return do_show(f->name, f->storage, f->unscaled, f->modules); }; });
}

}  // namespace vf::cli

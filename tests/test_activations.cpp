// Activation sources (harness/activation_source.h, docs/activations.md): what sizes a forward's
// activations, how a verdict names it, and the activation-dependence check.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "harness/activation_source.h"
#include "harness/campaign.h"
#include "harness/core/error.h"
#include "harness/exec.h"
#include "harness/generate.h"
#include "harness/predict.h"
#include "harness/repro.h"
#include "harness/scenario.h"
#include "harness/shrink.h"
#include "models/activation.h"

namespace vf {
namespace {

// FLUX.1-dev alone on an 80 GiB card at 1024 x 1024, batch 1, bf16: everything fits, so the
// forward's activation bytes are what the source gives.
std::string flux_scenario(const std::string& activations, std::uint32_t width = 1024) {
  return R"({"schema": "vramfuzz.scenario/1", "device": {"total": "80GiB"},
             "models": [{"id": "dit", "source": "catalog:flux1-dev"}],
             "workload": {"width": )" +
         std::to_string(width) + R"(, "height": )" + std::to_string(width) + R"(, "batch": 1, "cfg": 1.0})" +
         (activations.empty() ? "" : ", \"activations\": " + activations) + "}";
}

const StagePlan& forward_of(const Plan& p) {
  for (const StagePlan& sp : p.stages) {
    if (sp.op == StageOp::forward) return sp;
  }
  throw std::runtime_error("no forward stage");
}

Bytes forward_bytes(const std::string& activations, std::uint32_t width = 1024) {
  Catalog catalog;
  const Scenario s = parse_scenario_json(flux_scenario(activations, width), catalog, "test.json");
  return forward_of(predict(s)).activation_bytes;
}

std::string error_of(const std::string& text) {
  Catalog catalog;
  try {
    (void)parse_scenario_json(text, catalog, "test.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Activations, EachSourceSizesTheFluxForwardAsDocumented) {
  // model: 4096 image tokens (64 x 64 latent in 2 x 2 patches) + 512 text tokens = 4608
  // positions, x (21504 MLP + 3 x 3072 hidden) x 2 bytes = 283,115,520 B (270 MiB).
  EXPECT_EQ(forward_bytes(""), 4608ull * (21504 + 3 * 3072) * 2);
  EXPECT_EQ(forward_bytes("\"model\""), 283115520ull);
  // estimate: the predictor's budget, max(0.8 GiB floor, memory_required): 128 x 128 latent
  // positions x 2 bytes x 0.01 MiB x 3.1 = 1015.81 MiB.
  {
    Catalog catalog;
    const Scenario s = parse_scenario_json(flux_scenario("\"estimate\""), catalog, "test.json");
    const StagePlan& sp = forward_of(predict(s));
    EXPECT_EQ(sp.activation_bytes, sp.activation_allowance);
    EXPECT_NEAR(static_cast<double>(sp.activation_bytes), 16384.0 * 2 * 0.01 * 3.1 * MiB, 1.0);
    EXPECT_EQ(sp.activation_formula, 283115520ull);
    EXPECT_EQ(sp.activation.source, ActivationSource::estimate);
  }
  // bytes: as given, by model id or "*".
  EXPECT_EQ(forward_bytes(R"({"source": "bytes", "bytes": {"dit": "1GiB"}})"), GiB);
  EXPECT_EQ(forward_bytes(R"({"source": "bytes", "bytes": {"*": 123456789}})"), 123456789ull);
  // profile: an entry at the same workload is exact; at 512 x 512 (1024 image + 512 text = 1536
  // positions against 4608) it scales linearly: 300 MiB x 1536 / 4608 = 100 MiB.
  const std::string profile = R"({"source": "profile", "entries": [
      {"model": "flux1-dev", "width": 1024, "height": 1024, "batch": 1, "peak": "300MiB"},
      {"model": "flux1-dev", "width": 2048, "height": 2048, "batch": 1, "peak": "1200MiB"}]})";
  EXPECT_EQ(forward_bytes(profile), 300 * MiB);
  EXPECT_EQ(forward_bytes(profile, 512), 100 * MiB);
  // capped: the formula, never above the budget (here it is under it: unchanged).
  EXPECT_EQ(forward_bytes("\"capped\""), 283115520ull);
  EXPECT_EQ(forward_bytes(R"({"source": "bytes", "bytes": {"dit": "4GiB"}, "cap": "budget"})"),
            forward_bytes("\"estimate\""));
}

TEST(Activations, EverySourceRoundTripsThroughTheScenarioJson) {
  for (const std::string& a : {std::string("\"estimate\""), std::string("\"capped\""),
                              std::string(R"({"source": "bytes", "bytes": {"dit": "1GiB"}})"),
                              std::string(R"({"source": "bytes", "bytes": {"dit": "1GiB"}, "cap": "budget"})"),
                              std::string(R"({"source": "profile", "fallback": "model", "entries": [{"model": "dit", "compute": "bf16",
                                  "width": 512, "height": 768, "batch": 2, "peak": 1000000}]})")}) {
    SCOPED_TRACE(a);
    Catalog catalog;
    const Scenario s = parse_scenario_json(flux_scenario(a), catalog, "test.json");
    const std::string once = scenario_to_json(s);
    const Scenario back = parse_scenario_json(once, catalog, "test.json");
    EXPECT_EQ(back.activations, s.activations);
    EXPECT_EQ(scenario_to_json(back), once);
    EXPECT_EQ(scenario_fingerprint(back), scenario_fingerprint(s));
  }
  // The default source is not written; another source changes the fingerprint.
  Catalog catalog;
  const Scenario plain = parse_scenario_json(flux_scenario(""), catalog, "test.json");
  EXPECT_EQ(scenario_to_json(plain).find("activations"), std::string::npos);
  const Scenario est = parse_scenario_json(flux_scenario("\"estimate\""), catalog, "test.json");
  EXPECT_NE(scenario_fingerprint(plain), scenario_fingerprint(est));
}

TEST(Activations, AProfileFileIsReadRelativeToTheScenarioAndCopiedIntoIt) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "vramfuzz-test-activation-profile";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "flux.profile.json") << R"({"schema": "vramfuzz.activation-profile/1", "source": "torch.cuda.max_memory_allocated",
        "entries": [{"model": "flux1-dev", "width": 1024, "height": 1024, "peak": "512MiB"}]})";
    std::ofstream(dir / "case.json") << flux_scenario(R"({"source": "profile", "file": "flux.profile.json"})");
  }
  Catalog catalog;
  const Scenario s = load_scenario_file((dir / "case.json").string(), catalog);
  EXPECT_EQ(forward_of(predict(s)).activation_bytes, 512 * MiB);
  ASSERT_EQ(s.activations.profile.size(), 1u);
  EXPECT_EQ(s.activations.profile_origin, "flux.profile.json");
  // Written with its entries: the repro replays without the file.
  const std::string written = scenario_to_json(s);
  std::filesystem::remove_all(dir);
  const Scenario again = parse_scenario_json(written, catalog, "elsewhere.json");
  EXPECT_EQ(forward_of(predict(again)).activation_bytes, 512 * MiB);
  // --activations profile:FILE reads the same document; a missing file is bad input.
  EXPECT_THROW((void)parse_activation_flag("profile:/nonexistent/p.json", "--activations"), InputError);
  EXPECT_THROW((void)parse_activation_flag("measured", "--activations"), InputError);
}

TEST(Activations, BadInputNamesTheField) {
  EXPECT_NE(error_of(flux_scenario("\"measured\"")).find("activations: unknown activation source \"measured\""), std::string::npos)
      << error_of(flux_scenario("\"measured\""));
  EXPECT_NE(error_of(flux_scenario(R"({"source": "bytes", "bytes": {"vae": "1GiB"}})")).find("activations.bytes.vae"),
            std::string::npos);
  EXPECT_NE(error_of(flux_scenario(R"({"source": "bytes", "bytes": {"dit": "lots"}})")).find("activations.bytes.dit"),
            std::string::npos);
  const std::string no_entry = error_of(flux_scenario(R"({"source": "profile", "entries": [{"model": "sdxl-unet", "peak": "1GiB"}]})"));
  EXPECT_NE(no_entry.find("activations.entries: no entry for model \"dit\" (flux1-dev, computing in bf16)"), std::string::npos) << no_entry;
  EXPECT_NE(no_entry.find("\"fallback\": \"model\""), std::string::npos) << no_entry;
  EXPECT_NE(error_of(flux_scenario(R"({"source": "profile", "entries": [{"model": "dit", "peak": 0}]})")).find("activations.entries[0].peak"),
            std::string::npos);
  EXPECT_NE(error_of(flux_scenario(R"({"source": "profile", "entries": [{"model": "dit", "peak": "1GiB", "width": 3}]})"))
                .find("activations.entries[0].width"),
            std::string::npos);
  EXPECT_NE(error_of(flux_scenario(R"({"source": "profile", "entries": [], "file": "x.json"})")).find("either \"file\" or \"entries\""),
            std::string::npos);
  EXPECT_NE(error_of(flux_scenario(R"({"source": "model", "cap": "half"})")).find("activations.cap: unknown cap \"half\""),
            std::string::npos);
  // A profile without an entry for a model falls back to the formula only when it says so, and
  // the verdict then names the model.
  Catalog catalog;
  const Scenario s = parse_scenario_json(
      flux_scenario(R"({"source": "profile", "fallback": "model", "entries": [{"model": "sdxl-unet", "peak": "1GiB"}]})"), catalog, "t.json");
  const Plan p = predict(s);
  EXPECT_TRUE(forward_of(p).activation.fallback);
  EXPECT_EQ(forward_of(p).activation_bytes, 283115520ull);
  SimBackend sim;
  const CaseResult r = run_case(s, sim, false);
  (void)r;
}

TEST(Activations, AFindingThatNeedsMoreThanTheBudgetIsActivationDependent) {
  // The corpus' activation finding: 2410.31 MiB of activations against an allowance of 1182.66
  // MiB. Capped at that budget the case passes: activation-dependent, and the repro says so.
  Catalog catalog;
  const Scenario s = load_case_file(
      std::string(VF_SOURCE_DIR) + "/fuzz/corpus/regressions/dec2025-violation-forward-compute-caching-expandable/repro.json", catalog);
  SimBackend sim;
  CaseResult r = run_case(s, sim, false);
  ASSERT_TRUE(r.verdict.finding());
  check_activation_dependence(s, r.plan, sim, r.verdict);
  EXPECT_TRUE(r.verdict.activation_dependent);
  EXPECT_EQ(r.verdict.at_budget, "pass");
  EXPECT_NE(activation_dependence_text(r.verdict).find("capped at that budget, this case gives a pass"), std::string::npos);
  // What the capped run was: the same case with "activations": "capped".
  Scenario capped = s;
  capped.activations.cap_at_budget = true;
  EXPECT_FALSE(run_case(capped, sim, false).verdict.finding());

  // The origin case's OOM is the fp32 copies of the weights, with 252 MiB of activations under an
  // 819.20 MiB allowance: within budget, not activation-dependent, and no re-run was needed.
  const Scenario origin = load_scenario_file(std::string(VF_SOURCE_DIR) + "/docs/examples/flux2-te-fp8-fp32-12gib.json", catalog);
  CaseResult o = run_case(origin, sim, false);
  ASSERT_TRUE(o.verdict.finding());
  check_activation_dependence(origin, o.plan, sim, o.verdict);
  EXPECT_FALSE(o.verdict.activation_dependent);
  EXPECT_EQ(o.verdict.at_budget, "within budget");
}

TEST(Activations, AShrunkActivationFindingSaysSoInItsReproAndSummary) {
  Catalog catalog;
  const Scenario s = load_case_file(
      std::string(VF_SOURCE_DIR) + "/fuzz/corpus/regressions/dec2025-violation-forward-compute-caching-expandable/repro.json", catalog);
  SimBackend sim;
  ShrinkOptions opt;
  opt.max_execs = 50;
  const ShrinkResult sr = shrink(s, sim, opt);
  ASSERT_TRUE(sr.result.verdict.activation_dependent);
  const std::string md = repro_markdown(sr, ReproOrigin{}, "/tmp/repro.json");
  EXPECT_NE(md.find("**Activation-dependent:** the activation source sized some forward's activations above the predictor's own budget"),
            std::string::npos)
      << md;
  EXPECT_LT(md.find("**Activation-dependent:**"), md.find("**Verdict:**"));
  const std::string json = repro_json(sr, ReproOrigin{}, "/tmp/repro.json");
  EXPECT_NE(json.find("\"activation_dependent\": true"), std::string::npos);
  EXPECT_NE(json.find("\"at_budget\": \"pass\""), std::string::npos);
  EXPECT_NE(sr.result.verdict.rests_on.find("activations from vramfuzz's structural formula"), std::string::npos);
}

TEST(Activations, SyntheticModelsAreTunedWithinTheCatalogsRange) {
  // The catalog's diffusion models: ComfyUI's estimate over vramfuzz's formula at 1024 x 1024
  // runs from 1.38 (SDXL: 262.14 MiB / 190 MiB) to 14.79 (FLUX.2: 9586.98 / 648 MiB).
  const ActivationMarginRange& range = catalog_activation_margin();
  EXPECT_EQ(range.lo_model, "sdxl-unet");
  EXPECT_EQ(range.hi_model, "flux2-dev");
  EXPECT_NEAR(range.lo, 262.144 / 190.0, 0.01);
  EXPECT_NEAR(range.hi, 9586.98 / 648.0, 0.01);
  // Every synthetic model the generator draws is inside it (none under-tuned below SDXL).
  Catalog catalog;
  GenConfig gen;
  gen.policy = "comfy:dec2025";
  int synthetic = 0;
  double lo = 1e9, hi = 0;
  for (std::uint64_t i = 0; i < 600 && synthetic < 40; ++i) {
    PrngChoices c(case_seed(7, i));
    const Scenario s = generate_scenario(c, gen, catalog);
    for (const ModelRef& m : s.models) {
      if (m.source != "inline") continue;
      ++synthetic;
      const Workload w;
      const double ratio = static_cast<double>(comfy_memory_required(*m.spec, w, 1, Dtype::bf16, true, "t")) /
                           static_cast<double>(activation_working_set(*m.spec, w, 1, Dtype::bf16, "t"));
      lo = std::min(lo, ratio);
      hi = std::max(hi, ratio);
      EXPECT_GE(ratio, range.lo * 0.999) << m.id;
      EXPECT_LE(ratio, range.hi * 1.001) << m.id;
    }
  }
  EXPECT_GE(synthetic, 20);
  EXPECT_LT(lo, 3.0);  // the draw covers the range, not one corner of it
  EXPECT_GT(hi, 6.0);
}

}  // namespace
}  // namespace vf

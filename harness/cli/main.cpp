// vramfuzz: finds the cases where a GPU model loader's VRAM prediction is wrong.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "harness/campaign.h"
#include "harness/cli/commands.h"
#include "harness/core/error.h"
#include "harness/predictors/external.h"

int main(int argc, char** argv) {
  CLI::App app{"vramfuzz: stress-test and OOM fuzzing harness for GPU model loaders"};
  app.set_version_flag("--version", vf::tool_version());
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off (before or after the command)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  // Every command takes --log-level, also after its name (`vramfuzz run X --log-level debug`): an
  // option a subcommand does not know falls through to this app, which knows only this one (and
  // --version). Subcommands inherit the setting when created, so it comes before the add_* calls.
  app.fallthrough();
  double predictor_timeout = vf::external_settings().reply_timeout_s;
  app.add_option("--predictor-timeout", predictor_timeout,
                 "seconds an external predictor (--policy exec:...) may take per case before the case is an error and the "
                 "predictor is restarted (default 60)")
      ->check(CLI::Range(0.001, 86400.0));

  vf::cli::Action action;
  vf::cli::add_run(app, action);
  vf::cli::add_plan(app, action);
  vf::cli::add_from_log(app, action);
  vf::cli::add_fuzz(app, action);
  vf::cli::add_shrink(app, action);
  vf::cli::add_replay(app, action);
  vf::cli::add_render_repro(app, action);
  vf::cli::add_alloc_replay(app, action);
  vf::cli::add_calibrate(app, action);
  vf::cli::add_report(app, action);
  vf::cli::add_merge(app, action);
  vf::cli::add_fuzz_import(app, action);
  vf::cli::add_exec_case(app, action);
  vf::cli::add_gpu_check(app, action);
  vf::cli::add_predict_serve(app, action);
  vf::cli::add_diff(app, action);
  vf::cli::add_models(app, action);
  vf::cli::add_import(*app.get_subcommand("models"), action);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return vf::kExitBadInput;
  }

  // Logs go to stderr so stdout stays the command's output.
  auto logger = spdlog::stderr_color_mt("vramfuzz");
  logger->set_pattern("%^[%l]%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(log_level));

  vf::ExternalSettings settings = vf::external_settings();
  settings.reply_timeout_s = predictor_timeout;
  vf::set_external_settings(settings);

  // Every external predictor's stdin is closed when the command ends, however it ends.
  struct StopPredictors {
    ~StopPredictors() { vf::stop_external_predictors(); }
  } stop_predictors;
  try {
    vf::cli::reject_empty_values(app);
    return action ? action() : vf::kExitBadInput;
  } catch (const vf::InputError& e) {
    spdlog::error("{}", e.what());
    return vf::kExitBadInput;
  } catch (const vf::InfraError& e) {
    spdlog::error("{}", e.what());
    return vf::kExitInfra;
  } catch (const std::exception& e) {
    spdlog::critical("internal error: {}", e.what());
    return vf::kExitInfra;
  }
}

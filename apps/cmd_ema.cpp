// `moh ema list RUN`: the post-hoc EMA snapshots of a run trained with train.phema.
// `moh ema reconstruct RUN --sigma-rel S [--step N] --out DIR`: the EMA of σ_rel S at step N (default: the last
// snapshot) as the least-squares combination of the snapshots (EDM2, core/phema.h), written as a run directory that
// moh sample / moh eval / moh fid read with --checkpoint DIR.
#include <cstring>
#include <iomanip>
#include <iostream>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/phema_run.h"

namespace moh::apps {

namespace {

int ema_list(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "List the post-hoc EMA snapshots of a run (train.phema)");
  auto flag = opts.add_options();
  flag("run", "run directory", cxxopts::value<std::string>());
  flag("h,help", "show this help");
  opts.parse_positional({"run"});
  opts.positional_help("RUN");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return kExitOk;
  if (!args.count("run")) throw UserError(argv[0], "needs a run directory", "moh ema list RUN");
  for (const auto& s : phema::list_snapshots(args["run"].as<std::string>()))
    std::cout << "step " << s.step << "  sigma_rel " << s.sigma_rel << "  gamma " << std::setprecision(6) << s.gamma
              << "  " << s.file << "\n";
  return kExitOk;
}

int ema_reconstruct(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Reconstruct an EMA of any sigma_rel from a run's post-hoc EMA snapshots (EDM2)");
  auto flag = opts.add_options();
  flag("run", "run directory trained with train.phema", cxxopts::value<std::string>());
  flag("sigma-rel", "relative std of the EMA profile to reconstruct (EDM2 sweeps about 0.01-0.25)",
       cxxopts::value<double>());
  flag("step", "the EMA's end step: the last snapshot at or before it (default: the last snapshot)",
       cxxopts::value<int64_t>()->default_value("0"));
  flag("out", "output run directory (new or empty)", cxxopts::value<std::string>());
  flag("h,help", "show this help");
  opts.parse_positional({"run"});
  opts.positional_help("RUN");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return kExitOk;
  if (!args.count("run") || !args.count("sigma-rel") || !args.count("out"))
    throw UserError(argv[0], "needs RUN, --sigma-rel and --out", "moh ema reconstruct RUN --sigma-rel 0.07 --out DIR");
  const int64_t step = args["step"].as<int64_t>();
  if (step < 0) throw UserError("--step", "must be >= 0 (0 = the last snapshot)", "");
  const std::string run = args["run"].as<std::string>(), out = args["out"].as<std::string>();
  const phema::Reconstruction r = phema::reconstruct(run, args["sigma-rel"].as<double>(), step);
  phema::write_reconstruction(r, run, out);
  std::cout << "wrote " << out << ": EMA of sigma_rel " << r.sigma_rel << " (gamma " << r.gamma << ") at step "
            << r.step << " from " << r.used.size() << " snapshots (phema_reconstruction.json lists the coefficients)"
            << std::endl;
  return kExitOk;
}

}  // namespace

int cmd_ema(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::cout << "usage: moh ema list RUN | moh ema reconstruct RUN --sigma-rel S [--step N] --out DIR\n";
    return argc < 2 ? kExitUserError : kExitOk;
  }
  const std::string what = argv[1], prog = std::string(argv[0]) + " " + what;
  std::vector<char*> args(argv + 1, argv + argc);
  args[0] = const_cast<char*>(prog.c_str());
  if (what == "list") return ema_list(static_cast<int>(args.size()), args.data());
  if (what == "reconstruct") return ema_reconstruct(static_cast<int>(args.size()), args.data());
  throw UserError("moh ema", "unknown subcommand '" + what + "'", "list or reconstruct");
}

}  // namespace moh::apps

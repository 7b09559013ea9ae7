// `moh`: the command line of the MoH vision toolkit. Dispatches to one subcommand per file in apps/ and is the
// single place that turns exceptions into the documented exit codes.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <typeinfo>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/dist/distributed.h"
#include "core/environment.h"
#include "core/error.h"
#include "core/io/progress.h"
#include "core/parse.h"
#include "core/platform/blas_core.h"
#include "core/platform/memory_preflight.h"
#include "core/platform/run_context.h"
#include "datasets/image_decode.h"
#include "vision/nn/cpu_simd.h"

namespace moh::apps {

const std::vector<Command>& commands() {
  static const std::vector<Command> all{
      {"info", "list model variants; parameters, MoH layers and active-head ratio of one (--model)", cmd_info},
      {"config", "validate an experiment YAML and print it resolved (--schema lists every key)", cmd_config},
      {"train", "train a classifier or DiT from an experiment YAML (--resume auto continues exactly)", cmd_train},
      {"eval", "top-1 / top-5 of a classifier checkpoint", cmd_eval},
      {"sample", "class-conditional samples of a DiT / MoH-DiT (CFG) as ADM .npz + grid.png", cmd_sample},
      {"fid", "FID / sFID / IS / precision / recall of samples vs a reference (ADM evaluator)", cmd_fid},
      {"extract-latents", "encode a dataset once with the SD-VAE or VA-VAE into latent shards for DiT training",
       cmd_extract_latents},
      {"ref-stats", "precompute reference statistics for moh fid", cmd_ref_stats},
      {"export-images", "write a labelled image source as an ImageFolder split of PNGs", cmd_export_images},
      {"convert", "weights (torch.save .pt/.pth, checkpoint dir) -> safetensors with official names", cmd_convert},
      {"ema", "post-hoc EMA: list a run's snapshots, reconstruct an EMA of any sigma_rel (EDM2)", cmd_ema},
      {"plot", "loss / lr / top-1 curves of runs (PNG, overlaid) and a Markdown table across them", cmd_plot},
      {"compare", "max relative error between two weights sources, tensor by tensor (--tol: exit 1 above)",
       cmd_compare},
      {"forward", "one forward pass of a network on safetensors inputs (parity checks against PyTorch)", cmd_forward},
      {"launch", "run train/sample/eval as N data-parallel processes here (like torchrun)", cmd_launch},
      {"bench", "benchmarks: `moh bench attention|eval|train|sample|data [--json]`", cmd_bench},
  };
  return all;
}

namespace {

// Whether the flag's value is held as a T (cxxopts keeps each flag's declared type).
template <class T>
bool holds(const cxxopts::OptionValue& value) {
  try {
    (void)value.as<T>();
    return true;
  } catch (const std::bad_cast&) {
    return false;
  }
}

// The text between the first pair of quotes (‘…’ or '…') of a cxxopts message.
std::string quoted_in(const std::string& what) {
  for (const auto& [open, close] : {std::pair<std::string, std::string>{"\xe2\x80\x98", "\xe2\x80\x99"}, {"'", "'"}}) {
    const size_t b = what.find(open), e = b == std::string::npos ? b : what.find(close, b + open.size());
    if (e != std::string::npos) return what.substr(b + open.size(), e - b - open.size());
  }
  return what;
}

// The flag whose value cxxopts could not parse ("--batch 12x" or "--batch=12x"), or "".
std::string flag_of_value(const std::string& what, int argc, char** argv) {
  const std::string value = quoted_in(what);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == value && i > 1 && std::strncmp(argv[i - 1], "--", 2) == 0) return argv[i - 1];
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos && a.substr(eq + 1) == value) return a.substr(0, eq);
  }
  return "";
}

// cxxopts reads a floating-point flag with a stream: "0.07abc" passes as 0.07 and "1e-3x" as 0.001. Every numeric
// flag's text must be one whole number (core/parse.h), as every other number a user types.
void check_number_flags(const cxxopts::ParseResult& result) {
  for (const auto& kv : result.arguments()) {
    const cxxopts::OptionValue& value = result[kv.key()];
    const bool real = holds<double>(value) || holds<float>(value);
    const bool whole = holds<int64_t>(value) || holds<int>(value);
    if ((real && !parse_double(kv.value())) || (whole && !parse_int(kv.value())))
      throw UserError("--" + kv.key(), "\"" + kv.value() + "\" is not " + (real ? "a number" : "an integer"),
                      real ? "e.g. 0.05 or 1e-3" : "e.g. 8");
  }
}

}  // namespace

cxxopts::ParseResult parse_or_throw(cxxopts::Options& options, int argc, char** argv) {
  cxxopts::ParseResult result;
  try {
    result = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::no_such_option& e) {
    // "Option ‘chekpoint’ does not exist": suggest the nearest flag of this command.
    std::string what = e.what(), name;
    size_t b = what.find("\xe2\x80\x98"), end = what.find("\xe2\x80\x99"), q = 3;  // ‘name’ (or 'name')
    if (b == std::string::npos) {
      b = what.find('\'');
      end = what.find('\'', b + 1);
      q = 1;
    }
    if (b != std::string::npos && end != std::string::npos && end > b + q) name = what.substr(b + q, end - b - q);
    std::vector<std::string> flags;
    for (const auto& g : options.groups())
      for (const auto& d : options.group_help(g).options)
        for (const auto& l : d.l) flags.push_back(l);
    const std::string near = name.empty() ? "" : nearest_name(name, flags);
    throw UserError(options.program(), "unknown flag --" + name,
                    near.empty() ? "see `" + options.program() + " --help`" : "did you mean --" + near + "?");
  } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
    const std::string flag = flag_of_value(e.what(), argc, argv);
    throw UserError(flag.empty() ? options.program() : flag,
                    "\"" + quoted_in(e.what()) + "\" is not the number it takes",
                    "see `" + options.program() + " --help`");
  } catch (const cxxopts::exceptions::exception& e) {
    throw UserError(options.program(), e.what(), "see `" + options.program() + " --help`");
  }
  // A word beyond the command's positional arguments ("moh train a.yaml lr=1") would otherwise be dropped unread.
  if (!result.unmatched().empty())
    throw UserError(options.program(), "unexpected argument '" + result.unmatched().front() + "'",
                    "overrides are --set key=value; see `" + options.program() + " --help`");
  check_number_flags(result);
  return result;
}

void add_config_args(cxxopts::Options& options) {
  auto flag = options.add_options();
  flag("config", "experiment YAML file", cxxopts::value<std::string>());
  flag("set", "override a key: --set optim.lr=5e-4 (repeatable)", cxxopts::value<std::vector<std::string>>());
  flag("weights",
       "initialise the model from this file (= --set model.weights=...): torch.save .pt/.pth/.bin, "
       ".safetensors or a checkpoint dir",
       cxxopts::value<std::string>());
  flag("weights-key", "entry of a nested checkpoint: ema, model, state_dict (= model.weights_key)",
       cxxopts::value<std::string>());
  flag("allow-missing", "tolerate tensors the weights lack (= model.weights_allow_missing)");
  options.parse_positional({"config"});
  options.positional_help("CONFIG.yaml");
}

bool print_help_if_asked(const cxxopts::Options& options, const cxxopts::ParseResult& args) {
  if (!args.count("help")) return false;
  std::cout << options.help() << std::endl;
  return true;
}

std::vector<std::string> config_overrides(const cxxopts::ParseResult& args) {
  std::vector<std::string> sets;
  if (args.count("set")) sets = args["set"].as<std::vector<std::string>>();
  if (args.count("weights")) sets.push_back("model.weights=" + args["weights"].as<std::string>());
  if (args.count("weights-key")) sets.push_back("model.weights_key=" + args["weights-key"].as<std::string>());
  if (args.count("allow-missing")) sets.push_back("model.weights_allow_missing=true");
  return sets;
}

experiments::ExperimentConfig config_from_args(const cxxopts::ParseResult& args, const std::string& program,
                                               experiments::ExperimentUse use) {
  if (!args.count("config"))
    throw UserError(program, "missing CONFIG.yaml", "e.g. " + program + " configs/fashion_mnist/moh_vit_nano.yaml");
  experiments::ExperimentConfig cfg =
      experiments::load_experiment(args["config"].as<std::string>(), config_overrides(args));
  experiments::validate_experiment(cfg, use);  // every rule of the model's family, before any work
  return cfg;
}

namespace {
std::string g_invoked_as = "moh";
}

const std::string& invoked_as() {
  return g_invoked_as;
}

static void print_usage() {
  std::cout << "moh " << toolkit_version() << " — Mixture-of-Head attention toolkit (MoH-ViT, MoH-DiT, FID tools)\n\n"
            << "usage: moh <command> [options]    (moh <command> --help for its options)\n\ncommands:\n";
  size_t width = 0;
  for (const auto& c : commands()) width = std::max(width, std::strlen(c.name));
  for (const auto& c : commands())
    std::cout << "  " << c.name << std::string(width + 2 - std::strlen(c.name), ' ') << c.summary << "\n";
  std::cout << "\nglobal: --help, --version\n";
}

// "2 intra-op (OpenMP, idle workers sleep: OMP_WAIT_POLICY=passive, set by moh); OpenBLAS pool: 2 threads".
static std::string threads_line() {
  const ThreadSetup t = thread_setup();
  std::string s = std::to_string(t.intra_op) + " intra-op (" + t.backend;
  if (t.backend == "OpenMP")
    s += t.wait_policy.empty() ? ", idle workers spin (libgomp default)"
                               : ", OMP_WAIT_POLICY=" + t.wait_policy + (t.set_by_moh ? ", set by moh" : ", yours");
  s += "; OMP_NUM_THREADS overrides)";
  if (t.blas_threads > 0) s += "; OpenBLAS pool: " + std::to_string(t.blas_threads) + " threads";
  return s;
}

// "OpenBLAS core: Cooperlake (detected Prescott; chosen by moh for this CPU, self-check passed)\n", or "".
static std::string blas_core_line() {
  const BlasCore c = blas_core();
  if (c.used.empty()) return "";
  return "OpenBLAS core: " + c.used + " (detected " + c.detected + "; " + c.how + ")\n";
}

static void print_version() {
  BlasInfo blas = detect_blas();
  const char* images =
      datasets::can_decode_images()
          ? "images: OpenCV: yes (image folders, PNG/JPEG in and out)\n"
          : "images: OpenCV: no (built with -DMOH_WITH_OPENCV=OFF: .npz, latents and the embedded datasets)\n";
  std::cout << "moh " << toolkit_version() << " (commit " << toolkit_commit() << ")\n"
            << "LibTorch " << libtorch_version() << " ("
            << (libtorch_cuda_build().empty()
                    ? std::string("CPU-only build")
                    : "CUDA " + libtorch_cuda_build() + " build, GPU: " +
                          (cuda_available() ? std::to_string(torch::cuda::device_count()) + " visible"
                                            : std::string("none visible")))
            << ")\n"
            << "BLAS: " << blas.name << (blas.path.empty() ? "" : " (" + blas.path + ")") << "\n"
            << blas_core_line() << "CPU threads: " << threads_line() << "\n"
            << "CPU kernels: " << nn::simd::isa_name(nn::simd::isa())
            << " (the toolkit's own loops: attention core, GELU; with model.fused on, LayerNorm-modulate and"
               " gate-residual)\n"
            << "data parallel: " << (dist::available() ? "c10d (Gloo)" : "off (no c10d/Gloo headers at build time)")
            << "\n"
            << images;
}

static int run(int argc, char** argv) {
  if (argc > 0 && argv[0] && *argv[0]) g_invoked_as = argv[0];
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    print_usage();
    if (argc < 2) throw UserError("moh", "no command given", "the commands are listed above");
    return kExitOk;
  }
  if (!std::strcmp(argv[1], "--version")) {
    print_version();
    return kExitOk;
  }
  std::vector<std::string> names;
  for (const auto& c : commands()) {
    names.emplace_back(c.name);
    if (c.name == std::string(argv[1])) {
      warn_if_reference_blas();
      std::string prog = std::string("moh ") + c.name;
      std::vector<char*> args(argv + 1, argv + argc);
      args[0] = prog.data();
      return c.run(static_cast<int>(args.size()), args.data());
    }
  }
  std::string near = nearest_name(argv[1], names);
  throw UserError("moh", std::string("unknown command '") + argv[1] + "'",
                  near.empty() ? "commands: " + join(names) : "did you mean '" + near + "'?");
}

// Whether this command may skip the CPU setup's second start of the program (reexec_for_cpu) for now: help texts,
// `config`, `info` and `plot`, which compute next to nothing; `train`, which re-executes once its input is checked (a
// refused config answers from the first start); `launch`, whose ranks start with the setup (set_cpu_env_for_children).
// `--version` reports the setup runs get, so it re-executes.
bool defers_cpu_setup(int argc, char** argv) {
  if (argc < 2) return true;
  static const std::set<std::string> later{"--help", "-h", "help", "config", "info", "plot", "train", "launch"};
  if (later.count(argv[1])) return true;
  for (int i = 2; i < argc && std::strcmp(argv[i], "--") != 0; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return true;
  return false;
}

// The whole program: `moh` is this and nothing else (apps/moh.cpp); tests/tools/zygote.cpp runs it in forked children.
int program_main(int argc, char** argv) {
  moh::prefer_system_libstdcxx();  // before any std::filesystem call (core/platform/run_context.h says why)
  // The environment first (core/environment.h): its rank variables decide who speaks below, so a bad one is said by
  // whichever process meets it.
  try {
    moh::check_environment();
  } catch (const moh::UserError& e) {
    std::cerr << e.what() << std::endl;
    return moh::kExitUserError;
  }
  // Once the ranks have met, an input error is every rank's: the first rank of each machine says it on that
  // machine's console and the others stay quiet. A rank that fails before (its own error) says it with its rank, as
  // runtime errors are.
  const char* rank_env = std::getenv("RANK");
  const char* local_env = std::getenv("LOCAL_RANK");
  const std::string rank = rank_env && std::strcmp(rank_env, "0") != 0 ? rank_env : "";
  const auto speaks = [&] {
    return rank.empty() || (local_env && std::strcmp(local_env, "0") == 0) || !moh::dist::met_other_ranks();
  };
  const std::string prefix = rank.empty() ? "error: " : "error: rank " + rank + ": ";
  const auto ranked = [&](const std::string& line) {  // "error: X" → "error: rank N: X"
    return line.rfind("error: ", 0) == 0 ? prefix + line.substr(7) : line;
  };
  try {
    moh::prepare_cpu_setup(argv);  // Debian's LibTorch + OpenBLAS: before any OpenMP region or product runs
    if (!moh::apps::defers_cpu_setup(argc, argv)) moh::reexec_for_cpu();
    moh::configure_cpu_threads();
    moh::keep_freed_heap();
    const int code = moh::apps::run(argc, argv);
    if (speaks()) moh::print_notes();  // input notes a command did not print itself (its input was accepted)
    return code;
  } catch (const moh::UserError& e) {
    // A rank `moh launch` started (other than its first) that fails before the ranks met leaves its line to the
    // launcher, which prints it unless rank 0 says the same input error itself (core/dist/launcher.cpp).
    const char* error_file = std::getenv("MOH_RANK_ERROR_FILE");
    if (speaks() && error_file && *error_file && !moh::dist::met_other_ranks())
      std::ofstream(error_file) << ranked(e.what()) << "\n";
    else if (speaks())
      std::cerr << ranked(e.what()) << std::endl;
    return moh::kExitUserError;
  } catch (const moh::RunStopped& e) {
    if (speaks()) std::cerr << prefix << e.what() << std::endl;
    return moh::kExitRuntime;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave that cannot be used (not a directory, a link loop, no permission) is an input error; a
    // full or failing disk is a runtime failure.
    const std::error_code c = e.code();
    const bool runtime = c == std::errc::no_space_on_device || c == std::errc::io_error || c.value() == EDQUOT;
    if (rank.empty() || runtime)
      std::cerr << prefix << (e.path1().empty() ? std::string("filesystem") : e.path1().string()) << ": " << c.message()
                << (runtime ? "" : " (check the path)") << std::endl;
    return runtime ? moh::kExitRuntime : moh::kExitUserError;
  } catch (const c10::Error& e) {
    std::cerr << prefix << e.what_without_backtrace() << std::endl;
    return moh::kExitRuntime;
  } catch (const std::exception& e) {
    std::cerr << prefix << e.what() << std::endl;
    return moh::kExitRuntime;
  }
}

}  // namespace moh::apps

#pragma once
// The `moh` subcommands: each is a thin layer over the libraries (parse flags, build objects, call, report).
// Each takes the arguments after the subcommand name (argv[0] = "moh <cmd>") and returns the exit code; user
// mistakes are thrown as moh::UserError and turned into exit code 2 by main().
#include <string>
#include <vector>

#include "apps/cli.h"
#include "experiments/evaluation_run.h"

namespace moh::apps {

/// One registered subcommand.
struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

/// Every subcommand, in help order.
const std::vector<Command>& commands();

/// The `moh` program: flags, dispatch to a command, and the documented exit codes (0 ok, 1 runtime, 2 input).
int program_main(int argc, char** argv);

/// The program as the user typed it (argv[0] of `moh`, e.g. build/moh), for commands printed to be run again.
const std::string& invoked_as();

int cmd_info(int argc, char** argv);
int cmd_config(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_train(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_fid(int argc, char** argv);
int cmd_sample(int argc, char** argv);
int cmd_export_images(int argc, char** argv);
int cmd_ref_stats(int argc, char** argv);
int cmd_convert(int argc, char** argv);
int cmd_forward(int argc, char** argv);
int cmd_extract_latents(int argc, char** argv);
int cmd_launch(int argc, char** argv);
int cmd_compare(int argc, char** argv);
int cmd_plot(int argc, char** argv);
int cmd_ema(int argc, char** argv);

// The flags of the measurements `moh ema sweep` makes at each point (those of moh sample, fid and eval), and the
// requests they parse into.
cxxopts::Options sample_options(const std::string& prog);
cxxopts::Options fid_options(const std::string& prog);
cxxopts::Options eval_options(const std::string& prog);
experiments::SamplingRequest sampling_request(const cxxopts::ParseResult& args);
eval::GenerativeEvalOptions fid_request(const cxxopts::ParseResult& args);
experiments::ClassifierEvalRequest eval_request(const cxxopts::ParseResult& args, const std::string& program);

}  // namespace moh::apps

#pragma once
// Shared cxxopts helpers for the subcommands: parsing with user-facing errors.
// Repeated flags (--set) are lists of whole values: a comma belongs to the value (--set optim.betas=[0.9,0.95]),
// so cxxopts must not split at it.
#define CXXOPTS_VECTOR_DELIMITER '\0'
#include <cxxopts.hpp>

#include <string>
#include <vector>

#include "core/experiment_config.h"
#include "diffusion/model_registry.h"

namespace moh::apps {

/// Parses argv with cxxopts; unknown flags and bad values become UserError (exit 2) naming the flag.
cxxopts::ParseResult parse_or_throw(cxxopts::Options& options, int argc, char** argv);

/// Adds the positional CONFIG.yaml and the repeatable `--set key=value` shared by the experiment subcommands.
void add_config_args(cxxopts::Options& options);

/// Prints the help and returns true when --help was given.
bool print_help_if_asked(const cxxopts::Options& options, const cxxopts::ParseResult& args);

/// The --set overrides plus those implied by --weights / --weights-key / --allow-missing.
std::vector<std::string> config_overrides(const cxxopts::ParseResult& args);

/// Starts `nproc` copies of this binary with `args` (args[0] = the subcommand) and the torchrun variables set
/// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT = `port`, 0 = a free one; OMP_NUM_THREADS =
/// cores / nproc unless set); children die with the launcher. Waits; the first failure stops the others. Returns the
/// exit code (0, or the first failing rank's). SIGINT/SIGTERM reach the launcher only (the ranks run in their own
/// process group) and are forwarded to every rank once per signal, so a Ctrl-C stops training with one checkpoint and
/// a second one exits. `resume_prefix` (e.g. "moh launch --nproc_per_node 2 --") is what a rank prints before the
/// `train ...` of its resume command (MOH_RESUME_PREFIX); "" = the plain command.
/// `place`: this machine among several (torchrun's --nnodes / --node_rank / --master_addr): its ranks are
/// node_rank · nproc + LOCAL_RANK of nnodes · nproc, and every rank meets at master_addr:port.
struct NodePlace {
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
};
/// `max_restarts`: when a rank fails (not an input error, not a forwarded Ctrl-C), every rank of this machine is
/// stopped and started again, at most that many times, with TORCHELASTIC_RESTART_COUNT set; a training command
/// restarts with `--resume auto`.
int launch_local(int nproc, int port, const std::vector<std::string>& args, const std::string& resume_prefix = "",
                 const NodePlace& place = {}, int max_restarts = 0);

/// The command line that resumes this training run after a stop on a signal: the program, `train` and the original
/// arguments with `--resume auto` (and `--run-dir` when it was implicit), shell-quoted.
std::string resume_command(int argc, char** argv, const std::string& run_dir);

/// Loads, overrides and validates the experiment named on the command line (UserError if it is missing): the
/// schema, the cross-field rules and every rule of its model family (validate_experiment).
ExperimentConfig config_from_args(const cxxopts::ParseResult& args, const std::string& program,
                                  ExperimentUse use = ExperimentUse::train);

}  // namespace moh::apps

#pragma once
// Shared cxxopts helpers for the subcommands: parsing with user-facing errors.
// Repeated flags (--set) are lists of whole values: a comma belongs to the value (--set optim.betas=[0.9,0.95]),
// so cxxopts must not split at it.
#define CXXOPTS_VECTOR_DELIMITER '\0'
#include <cxxopts.hpp>

#include <string>
#include <vector>

#include "experiments/experiment_config.h"
#include "experiments/registry.h"

namespace moh::apps {

/// Parses argv with cxxopts; unknown flags and bad values become UserError (exit 2) naming the flag.
cxxopts::ParseResult parse_or_throw(cxxopts::Options& options, int argc, char** argv);

/// Adds the positional CONFIG.yaml and the repeatable `--set key=value` shared by the experiment subcommands.
void add_config_args(cxxopts::Options& options);

/// Prints the help and returns true when --help was given.
bool print_help_if_asked(const cxxopts::Options& options, const cxxopts::ParseResult& args);

/// The --set overrides plus those implied by --weights / --weights-key / --allow-missing.
std::vector<std::string> config_overrides(const cxxopts::ParseResult& args);

/// Loads, overrides and validates the experiment named on the command line (UserError if it is missing): the
/// schema, the cross-field rules and every rule of its model family (validate_experiment).
experiments::ExperimentConfig config_from_args(const cxxopts::ParseResult& args, const std::string& program,
                                               experiments::ExperimentUse use = experiments::ExperimentUse::train);

}  // namespace moh::apps

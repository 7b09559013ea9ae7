#pragma once
// Shared cxxopts helpers for the subcommands: parsing with user-facing errors.
#include <cxxopts.hpp>

#include <string>

namespace moh::apps {

/// Parses argv with cxxopts; unknown flags and bad values become UserError (exit 2) naming the flag.
cxxopts::ParseResult parse_or_throw(cxxopts::Options& options, int argc, char** argv);

}  // namespace moh::apps

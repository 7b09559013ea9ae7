#pragma once
// Flag parsing shared by the benchmarks: a bad flag is a UserError (exit 2) naming it; --help prints the help.
#include <cxxopts.hpp>

namespace moh::bench {

/// Parses argv into `out`; returns false when --help was asked for (the help is printed, nothing else to do).
bool parse_bench_flags(cxxopts::Options& options, int argc, char** argv, cxxopts::ParseResult& out);

}  // namespace moh::bench

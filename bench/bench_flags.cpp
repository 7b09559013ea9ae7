#include "bench/bench_flags.h"

#include <iostream>

#include "core/error.h"

namespace moh::bench {

bool parse_bench_flags(cxxopts::Options& options, int argc, char** argv, cxxopts::ParseResult& out) {
  try {
    out = options.parse(argc, argv);
  } catch (const std::exception& e) {
    throw UserError(argv[0], e.what(), "see --help");
  }
  if (!out.count("help")) return true;
  std::cout << options.help() << std::endl;
  return false;
}

}  // namespace moh::bench

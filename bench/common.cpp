#include "bench/common.h"

#include <ATen/Parallel.h>

#include <iostream>
#include <thread>

#include "core/error.h"
#include "core/run_context.h"

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

nlohmann::json machine_record() {
  return {{"cpu", cpu_model_name()},
          {"cores", std::max(1u, std::thread::hardware_concurrency())},
          {"threads", at::get_num_threads()},
          {"libtorch", libtorch_version()},
          {"blas", detect_blas().name}};
}

}  // namespace moh::bench

// bench/moh_attention: standalone driver of the attention benchmark (same flags as `moh bench attention`).
#include <iostream>

#include "bench/attention_bench.h"
#include "core/error.h"

int main(int argc, char** argv) {
  try {
    return moh::bench::attention_bench_main(argc, argv);
  } catch (const moh::UserError& e) {
    std::cerr << e.what() << std::endl;
    return moh::kExitUserError;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return moh::kExitRuntime;
  }
}

// bench/moh_attention: standalone driver of the attention benchmark (same flags as `moh bench attention`).
#include <iostream>

#include "bench/attention_bench.h"
#include "core/error.h"
#include "core/platform/memory_preflight.h"
#include "core/platform/run_context.h"

int main(int argc, char** argv) {
  try {
    moh::configure_cpu_threads();
    moh::keep_freed_heap();  // as in moh
    return moh::bench::attention_bench_main(argc, argv);
  } catch (const moh::UserError& e) {
    std::cerr << e.what() << std::endl;
    return moh::kExitUserError;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return moh::kExitRuntime;
  }
}

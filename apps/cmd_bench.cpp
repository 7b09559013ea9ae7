// `moh bench <what>`: the benchmarks of bench/ from the main binary (attention, vit-attention, kernels, eval, train,
// sample, data).
#include <cstring>
#include <iostream>

#include "apps/commands.h"
#include "bench/attention_bench.h"
#include "bench/data_bench.h"
#include "bench/eval_bench.h"
#include "bench/kernel_bench.h"
#include "bench/train_bench.h"
#include "bench/vit_attention_bench.h"
#include "core/error.h"

namespace moh::apps {

int cmd_bench(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::cout << "usage: moh bench attention|vit-attention|kernels|eval|train|sample|data [--json] ...   (moh bench "
                 "<what> --help)\n";
    if (argc < 2)
      throw UserError("moh bench", "no benchmark given",
                      "attention, vit-attention, kernels, eval, train, sample or data");
    return kExitOk;
  }
  std::string what = argv[1];
  std::string prog = std::string(argv[0]) + " " + what;
  std::vector<char*> args(argv + 1, argv + argc);
  args[0] = prog.data();
  if (what == "attention") return bench::attention_bench_main(static_cast<int>(args.size()), args.data());
  if (what == "eval") return bench::eval_bench_main(static_cast<int>(args.size()), args.data());
  if (what == "train") return bench::train_bench_main(static_cast<int>(args.size()), args.data());
  if (what == "sample") return bench::sample_bench_main(static_cast<int>(args.size()), args.data());
  if (what == "vit-attention") return bench::vit_attention_bench_main(static_cast<int>(args.size()), args.data());
  if (what == "kernels") return bench::kernel_bench_main(static_cast<int>(args.size()), args.data());
  if (what == "data") return bench::data_bench_main(static_cast<int>(args.size()), args.data());
  throw UserError("moh bench", "unknown benchmark '" + what + "'",
                  "available: attention, vit-attention, kernels, eval, train, sample, data");
}

}  // namespace moh::apps

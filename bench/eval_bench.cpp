#include "bench/eval_bench.h"

#include "bench/common.h"

#include <torch/torch.h>

#include <chrono>
#include <cxxopts.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/platform/run_context.h"
#include "eval/frechet.h"
#include "eval/inception.h"
#include "eval/metrics.h"

namespace moh::bench {

namespace {

template <class F>
double median_seconds(int runs, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto s = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// ReLU-like activations with correlated dimensions (what pool_3 features look like to the eigensolver).
at::Tensor synthetic_features(int64_t n, int64_t d, double shift) {
  const at::Tensor mix = torch::randn({d, d}) / std::sqrt(static_cast<double>(d));
  return at::relu(at::matmul(torch::randn({n, d}), mix) + shift);
}

}  // namespace

int eval_bench_main(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Evaluator timings: statistics, Fréchet distance, precision/recall, Inception img/s");
  auto flag = opts.add_options();
  flag("json", "print one JSON object");
  flag("dim", "feature dimension", cxxopts::value<int64_t>()->default_value("2048"));
  flag("n", "feature rows for the statistics", cxxopts::value<int64_t>()->default_value("10000"));
  flag("pr-n", "rows of each set for precision/recall (0 = skip)", cxxopts::value<int64_t>()->default_value("5000"));
  flag("images", "images through the Inception network (0 = skip)", cxxopts::value<int64_t>()->default_value("32"));
  flag("batch", "Inception batch size", cxxopts::value<int64_t>()->default_value("16"));
  flag("runs", "timed repetitions of the distance (median)", cxxopts::value<int>()->default_value("3"));
  flag("device", "auto, cpu or cuda", cxxopts::value<std::string>()->default_value("auto"));
  flag("h,help", "show this help");
  cxxopts::ParseResult args;
  if (!parse_bench_flags(opts, argc, argv, args)) return 0;
  const int64_t d = args["dim"].as<int64_t>(), n = args["n"].as<int64_t>(), prn = args["pr-n"].as<int64_t>();
  const int64_t images = args["images"].as<int64_t>(), batch = args["batch"].as<int64_t>();
  const int runs = args["runs"].as<int>();
  if (d < 2 || n < 2 || batch < 1 || runs < 1 || prn < 0 || images < 0)
    throw UserError(argv[0], "sizes must be positive", "see --help");
  RunContext ctx = RunContext::create(args["device"].as<std::string>(), Precision::fp32, 0);
  torch::manual_seed(0);
  nlohmann::json out{{"machine", machine_record()},
                     {"threads", at::get_num_threads()},
                     {"dim", d},
                     {"n", n},
                     {"device", ctx.device.str()}};

  const at::Tensor fa = synthetic_features(n, d, 0.0), fb = synthetic_features(n, d, 0.1);
  eval::GaussianStats a, b;
  out["stats_s"] = median_seconds(1, [&] { a = eval::compute_stats(fa); });
  b = eval::compute_stats(fb);
  double fd = 0;
  out["frechet_s"] = median_seconds(runs, [&] { fd = eval::frechet_distance(a, b); });
  out["frechet_value"] = fd;
  if (prn > 0) {
    const at::Tensor pa = fa.narrow(0, 0, std::min(prn, n)), pb = fb.narrow(0, 0, std::min(prn, n));
    eval::PRResult pr;
    out["pr_n"] = pa.size(0);
    out["pr_s"] = median_seconds(1, [&] { pr = eval::precision_recall(pa, pb); });
  }
  if (images > 0) {
    eval::FIDInceptionV3 net;
    net->eval();
    net->to(ctx.device);
    const at::Tensor u8 = torch::randint(0, 256, {batch, 256, 256, 3}).to(at::kByte);
    torch::NoGradGuard ng;
    auto step = [&] {
      auto f = net->forward(eval::inception_preprocess(u8.to(ctx.device), eval::InceptionResize::tf1));
      (void)f.pool.sum().item<float>();  // synchronise
    };
    step();  // warm-up (allocations, cuDNN algorithm choice)
    const int64_t iters = std::max<int64_t>(1, images / batch);
    const double s = median_seconds(1, [&] {
      for (int64_t i = 0; i < iters; ++i) step();
    });
    out["inception_batch"] = batch;
    out["inception_images"] = iters * batch;
    out["inception_img_per_s"] = static_cast<double>(iters * batch) / s;
  }
  if (args.count("json")) {
    std::cout << out.dump(1) << std::endl;
  } else {
    std::cout << "statistics " << n << "x" << d << ": " << out["stats_s"].get<double>() << " s\n"
              << "Fréchet distance (" << d << "-d, median of " << runs << "): " << out["frechet_s"].get<double>()
              << " s\n";
    if (out.contains("pr_s"))
      std::cout << "precision/recall " << prn << " vs " << prn << ": " << out["pr_s"].get<double>() << " s\n";
    if (out.contains("inception_img_per_s"))
      std::cout << "Inception forward (256² uint8 → 299, batch " << batch
                << "): " << out["inception_img_per_s"].get<double>() << " img/s\n";
  }
  return 0;
}

}  // namespace moh::bench

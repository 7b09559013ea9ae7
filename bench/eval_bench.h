#pragma once
// Benchmark of the evaluator's costly parts on this machine: feature statistics (float64 covariance), the Fréchet
// distance of two D-dimensional Gaussians (target: ≤ 1 s at D = 2048 on 2 CPU cores; scipy's sqrtm takes 8.4 s),
// precision/recall on N×N feature sets, and FID-Inception throughput (images/s, uint8 → resize → features).
namespace moh::bench {

/// `moh bench eval [--json] [--dim 2048] [--n 10000] [--pr-n 5000] [--images 32] [--batch 16] [--runs 3]`.
int eval_bench_main(int argc, char** argv);

}  // namespace moh::bench

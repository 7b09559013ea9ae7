#pragma once
// Benchmark of MHA vs MoH dense vs MoH sparse attention (issue: "real compute savings, measured"). Two scopes:
//   core   — given q, k, v (and the router's gates/selection): QKᵀ, softmax, AV plus MoH's gating/gather/scatter;
//   module — the whole layer: router, projections, core, output projection.
// All cases of one (scope, seq, dim) are timed round-robin (each repetition runs every case once) so machine drift
// hits them alike; each time is the median of `runs` repetitions after `warmup` untimed ones, and every MoH time is
// also given as a ratio to MHA measured in the same run. The dense MoH path does the same work for every split (all
// heads, then gates), so it is timed once per configuration and reported on each requested fraction's row.
#include <cstdint>
#include <string>
#include <vector>

namespace moh::bench {

/// One measured configuration.
struct AttentionBenchRow {
  std::string scope, mode;  ///< core|module ; mha|dense|sparse
  int64_t seq = 0, dim = 0, heads = 0, batch = 0, shared = 0, topk = 0;
  double active = 1.0;         ///< requested active-head fraction (0.5, 0.75, 0.9; 1 for mha)
  double active_actual = 1.0;  ///< (h_s + K) / h actually used
  double fwd_ms = 0, fwdbwd_ms = 0, fwd_ratio = 1, fwdbwd_ratio = 1;
};

/// What to measure.
struct AttentionBenchOptions {
  std::vector<int64_t> seqs{196, 256, 1024, 4096};
  std::vector<std::pair<int64_t, int64_t>> dims{{384, 6}, {768, 12}};  ///< (dim, heads)
  std::vector<double> actives{0.5, 0.75, 0.9};
  std::vector<std::string> scopes{"core", "module"};
  int warmup = 0, runs = 10;  ///< the median of 10 already ignores a slow first (page-faulting) run
  int64_t batch = 8;          ///< batch at seq ≤ 256; divided by 4 per 4x longer sequence (8, 2, 1), at least 1
  uint64_t seed = 0;
  bool fused = false;  ///< attention through scaled_dot_product_attention (LibTorch ≥ 2.1) instead of the plain path
  std::string device = "cpu";  ///< cpu, cuda, cuda:N
  std::string dtype = "fp32";  ///< fp32, bf16, fp16 (CUDA): the layers' weights and inputs
};

/// (h_s, K) for a requested active fraction of h heads: a = round-half-up(active·h) active heads,
/// h_s = max(1, a / 2) shared, K = a − h_s routed from the pool h − h_s.
std::pair<int64_t, int64_t> moh_split(int64_t heads, double active);

/// Batch used at a sequence length (see AttentionBenchOptions::batch).
int64_t batch_for_seq(int64_t base_batch, int64_t seq);

/// Runs every configuration; `log` gets one human-readable line per row as it is measured.
std::vector<AttentionBenchRow> run_attention_bench(const AttentionBenchOptions& options, bool log = true);

/// Entry point shared by `bench/moh_attention` and `moh bench attention`: flags --json, --seqs, --runs, ...
int attention_bench_main(int argc, char** argv);

}  // namespace moh::bench

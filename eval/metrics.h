#pragma once
// Inception Score and improved precision/recall exactly as OpenAI's ADM evaluator (guided-diffusion
// evaluations/evaluator.py) computes them, plus torch-fidelity's IS convention. FID/sFID are in frechet.h.
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace moh::eval {

/// How the Inception Score splits the samples.
enum class ISMode {
  adm,       ///< consecutive splits of 5000 (partial last split kept), mean only (ADM / DiT papers)
  fidelity,  ///< torch-fidelity: rows permuted by numpy RandomState(2020), 10 splits [i·N/10, (i+1)·N/10), mean ± std
};

/// ADM's split size.
constexpr int64_t kAdmISSplitSize = 5000;
/// torch-fidelity's defaults.
constexpr int64_t kFidelityISSplits = 10;
constexpr uint32_t kFidelityISSeed = 2020;

/// Inception Score result (std = 0 in ADM mode, which reports none).
struct ISResult {
  double mean = 0, std = 0;
  int64_t splits = 0;
};

/// IS from unnormalised logits (N, classes); softmax/log-softmax are taken in float64, which equals ADM's
/// float32 log(softmax) wherever that is finite and stays finite where it underflows.
ISResult inception_score(const at::Tensor& logits, ISMode mode);

/// numpy.random.RandomState(seed).permutation(n): MT19937 (init_genrand) + numpy's legacy Fisher–Yates with masked
/// rejection sampling. Used to reproduce torch-fidelity's shuffled IS splits.
std::vector<int64_t> numpy_legacy_permutation(int64_t n, uint32_t seed);

/// Neighbourhood size of the manifold estimator (radius = distance to the k-th nearest other point).
constexpr int64_t kPRNeighbourhood = 3;

/// Improved precision and recall (Kynkäänniemi et al. 2019) as ADM's ManifoldEstimator: squared L2 distances,
/// radius = (k+1)-th smallest squared distance within a set counting self, ties inside (≤).
struct PRResult {
  double precision = 0;  ///< fraction of samples inside at least one reference ball
  double recall = 0;     ///< fraction of references inside at least one sample ball
};

/// k-NN radii of a feature set (N, D): the (k+1)-th smallest squared distance of each row to all rows.
/// Computed in row blocks so that memory stays ~`block_bytes` regardless of N.
at::Tensor manifold_radii(const at::Tensor& features, int64_t k = kPRNeighbourhood, int64_t block_bytes = 256 << 20);

/// Precision and recall of `samples` against `reference` (both (N, D), float32 distances as ADM's fp32 fallback).
PRResult precision_recall(const at::Tensor& reference, const at::Tensor& samples, int64_t k = kPRNeighbourhood,
                          int64_t block_bytes = 256 << 20);

}  // namespace moh::eval

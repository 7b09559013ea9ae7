#pragma once
// Inception Score and improved precision/recall exactly as OpenAI's ADM evaluator (guided-diffusion
// evaluations/evaluator.py) computes them, plus torch-fidelity's IS convention. FID/sFID are in frechet.h.
#include <ATen/ATen.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/config_schema.h"

namespace moh::eval {

/// How the Inception Score splits the samples.
enum class ISMode {
  adm,       ///< consecutive splits of 5000 (partial last split kept), mean only (ADM / DiT papers)
  fidelity,  ///< torch-fidelity: rows permuted by numpy RandomState(2020), 10 splits [i·N/10, (i+1)·N/10), mean ± std
};

const config::EnumTable<ISMode>& enum_table(ISMode);

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

/// numpy.random.RandomState(seed) for the draws torch-fidelity makes: MT19937 (init_genrand, as std::mt19937(seed))
/// and numpy's legacy Fisher–Yates with masked rejection sampling. The state carries over between calls, as numpy's.
class NumpyLegacyRandom {
 public:
  explicit NumpyLegacyRandom(uint32_t seed) : mt_(seed) {}
  /// RandomState.permutation(n).
  std::vector<int64_t> permutation(int64_t n);
  /// RandomState.choice(n, k, replace=False): the first k of permutation(n).
  std::vector<int64_t> choice(int64_t n, int64_t k);

 private:
  uint64_t interval(uint64_t max);  // numpy's random_interval: uniform in [0, max]
  std::mt19937 mt_;
};

/// numpy.random.RandomState(seed).permutation(n). Used to reproduce torch-fidelity's shuffled IS splits.
std::vector<int64_t> numpy_legacy_permutation(int64_t n, uint32_t seed);

/// torch-fidelity's KID defaults (kid_subsets, kid_subset_size, rng_seed).
constexpr int64_t kFidelityKIDSubsets = 100;
constexpr int64_t kFidelityKIDSubsetSize = 1000;

/// Kernel Inception Distance (Bińkowski et al. 2018) as torch-fidelity's metric_kid computes it.
struct KIDResult {
  double mean = 0, std = 0;  ///< over subsets; std with ddof 0 (np.std)
  int64_t subsets = 0, subset_size = 0;
};

/// KID of feature sets a (N₁, D) and b (N₂, D): for each of `subsets` draws (a's rows, then b's, each
/// RandomState(seed).choice without replacement from one generator), the unbiased MMD² under the kernel
/// (x·y / D + 1)³; mean and std over draws, in float64. The subset size is min(subset_size, N₁, N₂) (clean-fid's
/// rule; torch-fidelity refuses smaller sets).
KIDResult kernel_inception_distance(const at::Tensor& a, const at::Tensor& b, int64_t subsets = kFidelityKIDSubsets,
                                    int64_t subset_size = kFidelityKIDSubsetSize, uint32_t seed = kFidelityISSeed);

/// Neighbourhood size of the manifold estimator (radius = distance to the k-th nearest other point).
constexpr int64_t kPRNeighbourhood = 3;

/// Improved precision and recall (Kynkäänniemi et al. 2019) as ADM's ManifoldEstimator: squared L2 distances,
/// radius = (k+1)-th smallest squared distance within a set counting self, ties inside (≤).
struct PRResult {
  double precision = 0;  ///< fraction of samples inside at least one reference ball
  double recall = 0;     ///< fraction of references inside at least one sample ball
};

/// Bytes of one block of squared distances in the precision/recall pass.
constexpr int64_t kPRBlockBytes = 256 << 20;

/// k-NN radii of a feature set (N, D): the (k+1)-th smallest squared distance of each row to all rows.
/// Computed in row blocks so that memory stays ~`block_bytes` regardless of N.
at::Tensor manifold_radii(const at::Tensor& features, int64_t k = kPRNeighbourhood,
                          int64_t block_bytes = kPRBlockBytes);

/// Precision and recall of `samples` against `reference` (both (N, D), float32 distances as ADM's fp32 fallback).
PRResult precision_recall(const at::Tensor& reference, const at::Tensor& samples, int64_t k = kPRNeighbourhood,
                          int64_t block_bytes = kPRBlockBytes);

}  // namespace moh::eval

#pragma once
// Batches for image classification from an in-memory ImageSet: deterministic shuffling per (seed, epoch, rank),
// per-sample augmentation seeded by (seed, epoch, index) so results do not depend on thread scheduling or on where a
// run was resumed, and a background thread that prepares the next batches while the model trains.
#include <ATen/ATen.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/batch_stream.h"
#include "datasets/fashion_mnist.h"

namespace moh::datasets {

/// Fashion-MNIST training-set statistics (pixels scaled to [0, 1]).
constexpr double kFashionMnistMean = 0.2860;
constexpr double kFashionMnistStd = 0.3530;

using moh::BatchStream;  // core/batch_stream.h: what the training loop reads

/// How images become model inputs (classifiers and pixel-space DiTs alike).
struct ImageTransform {
  int64_t size = 32;      ///< output side; smaller images are zero-padded (centred) to it
  int64_t shift = 0;      ///< training: random translation of up to ±shift pixels (zero fill)
  bool hflip = false;     ///< training: horizontal flip with probability 0.5
  double erase_prob = 0;  ///< training: random erasing (timm, mode pixel) after normalisation
  double mean = kFashionMnistMean, std = kFashionMnistStd;
};

/// splitmix64: a well-mixed 64-bit hash used to derive per-sample seeds.
uint64_t mix_seed(uint64_t a, uint64_t b);

/// The sample order of an epoch (Fisher–Yates with a seeded splitmix generator), this rank's share.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle, int rank = 0, int world = 1);

/// The first `limit` items of a seeded permutation of n, ascending (data.limit_train / limit_val: a random subset that
/// does not depend on the epoch, so a class-sorted source keeps every class); all n items when limit is 0 or ≥ n.
std::vector<int64_t> limited_subset(int64_t n, int64_t limit, uint64_t seed);

/// Builds a float batch (B, C, S, S) and labels (B) from the given sample indices. `train` enables the random
/// shift/flip, seeded per sample from (seed, epoch, index).
std::pair<at::Tensor, at::Tensor> make_batch(const ImageSet& set, const std::vector<int64_t>& indices,
                                             const ImageTransform& tf, bool train, uint64_t seed, int64_t epoch);

/// Iterates one epoch in batches, preparing up to `prefetch` batches ahead on a background thread.
class EpochLoader : public BatchStream {
 public:
  EpochLoader(const ImageSet& set, ImageTransform tf, int64_t batch_size, bool train, uint64_t seed, int64_t epoch,
              int64_t start_batch = 0, bool drop_last = true, int prefetch = 2, int rank = 0, int world = 1);
  ~EpochLoader();
  /// Batches in the epoch (after drop_last).
  int64_t num_batches() const override { return num_batches_; }
  /// Next batch; false at the end of the epoch.
  bool next(at::Tensor& x, at::Tensor& y) override;

 private:
  void produce();
  const ImageSet& set_;
  ImageTransform tf_;
  int64_t batch_size_, epoch_, next_batch_, num_batches_;
  bool train_;
  uint64_t seed_;
  size_t prefetch_;
  std::vector<int64_t> order_;
  std::deque<std::pair<at::Tensor, at::Tensor>> ready_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, done_ = false;
  std::thread worker_;
};

}  // namespace moh::datasets

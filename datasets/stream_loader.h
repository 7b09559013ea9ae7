#pragma once
// Streaming ImageFolder loader for ImageNet-scale training: files are decoded and augmented on `workers` threads
// while the model trains, batches come out in a fixed order whatever the threads do (each batch is built by one
// worker, every sample's random draws are seeded by (seed, epoch, position in the epoch)), so a run resumed at
// batch k sees exactly the batches an uninterrupted run saw. Unreadable or damaged files (datasets/image_decode.h)
// are replaced by the next readable sample of the same epoch order and counted; more than max_bad_fraction of the
// epoch's samples is a UserError, and an epoch that replaced any says so on stderr at its end.
#include <ATen/ATen.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "datasets/augment.h"
#include "datasets/image_folder.h"
#include "datasets/loader.h"

namespace moh::datasets {

/// DeiT's RASampler: a shuffled permutation with every index repeated `repeats` times back to back, padded to a
/// multiple of the world size, this rank's stride, cut to ⌊n / 256⌋ · 256 / world samples (n when smaller than 256).
/// repeats = 1 is a plain shuffled (or, unshuffled, sequential) rank share without the cut.
std::vector<int64_t> repeated_order(int64_t n, int64_t repeats, uint64_t seed, int64_t epoch, bool shuffle, int rank,
                                    int world);

/// How a StreamLoader runs.
struct StreamOptions {
  int64_t batch_size = 128;
  bool train = true;  ///< train transform + shuffling; false = eval transform, sequential
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t start_batch = 0;  ///< resume inside an epoch
  bool drop_last = true;
  int workers = 2;       ///< decoding/augmentation threads
  int prefetch = 2;      ///< batches ready ahead of the consumer (beyond one per worker)
  int64_t repeats = 1;   ///< repeated augmentation (RASampler); 1 = off
  int64_t channels = 3;  ///< 1 = grey, 3 = RGB
  int rank = 0, world = 1;
  double max_bad_fraction = 0.01;  ///< data.max_bad_fraction: tolerated share of unreadable files in an epoch
  std::string root;                ///< for messages
};

/// Iterates one epoch of an ImageFolder split.
class StreamLoader : public BatchStream {
 public:
  StreamLoader(const ImageFolderIndex& index, SampleTransformOptions transform, StreamOptions options);
  ~StreamLoader();
  StreamLoader(const StreamLoader&) = delete;
  StreamLoader& operator=(const StreamLoader&) = delete;
  int64_t num_batches() const override { return num_batches_; }
  /// Next batch x (B, C, S, S) float, y (B) int64; false at the end of the epoch. A worker's failure is rethrown here.
  bool next(at::Tensor& x, at::Tensor& y) override;
  /// Files that could not be decoded so far (each replaced by another sample).
  int64_t bad_files() const { return bad_.load(); }

 private:
  void work(int w);
  std::pair<at::Tensor, at::Tensor> build(int64_t batch);
  at::Tensor batch_tensor(at::IntArrayRef sizes);
  const ImageFolderIndex& index_;
  SampleTransformOptions tf_;
  StreamOptions o_;
  std::vector<int64_t> order_;
  int64_t num_batches_ = 0, next_ = 0;
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> ready_;
  std::exception_ptr error_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int64_t> bad_{0};
  int64_t bad_budget_ = 0;
  std::string first_bad_;  ///< "file: why" of the first unreadable file (under mu_)
  bool reported_ = false;
  std::vector<std::thread> threads_;
  std::vector<at::Tensor>
      pool_;  ///< batch tensors handed out before, reused once nothing else refers to them (under mu_)
};

}  // namespace moh::datasets

#pragma once
// Pre-extracted VAE latents (written by `moh extract-latents`, read by the DiT trainer with data.dataset: latents).
// Layout of DIR:
//   meta.json                {"format": "moh-latents", "version": 1, "count": N, "shards": [n0, n1, ...], "channels": C,
//                             "size": H, "scale": 0.18215, "image_size": P, "classes": [...], "vae": "<file name>",
//                             "vae_sha256": "...", "source": "<data spec>"}
//   shard_00000.safetensors  mean, std, mean_flip, std_flip (n, C, H, W) F16 — the VAE posterior of each image and of
//                            its horizontal mirror — and labels (n) I64; shard i holds n_i images (images that could
//                            not be decoded are left out, so n_i may be below the extraction's shard size).
// Storing the posterior moments (not one frozen sample, as fast-DiT does) keeps DiT's augmentation: each use draws
// a fresh z = scale · (mean + std · ε) from a randomly mirrored copy, the distribution of DiT's train.py.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/batch_stream.h"

namespace moh::datasets {

/// meta.json of a latent directory.
struct LatentMeta {
  int64_t count = 0, channels = 0, size = 0, image_size = 0;
  std::vector<int64_t> shards;  ///< images per shard
  double scale = 0.0;
  std::vector<std::string> classes;
  std::string vae, vae_sha256, source;

  int64_t num_shards() const { return static_cast<int64_t>(shards.size()); }
};

/// Path of shard i.
std::string latent_shard_path(const std::string& dir, int64_t i);
void write_latent_meta(const std::string& dir, const LatentMeta& meta);
/// Reads and checks meta.json; a missing or malformed directory is a UserError pointing at `moh extract-latents`.
LatentMeta read_latent_meta(const std::string& dir);

/// One shard in memory.
struct LatentShard {
  at::Tensor mean, std, mean_flip, std_flip;  ///< (n, C, H, W) float16
  at::Tensor labels;                          ///< (n) int64
};
/// Reads shard i, checking names, dtypes and shapes against the metadata.
LatentShard read_latent_shard(const std::string& dir, const LatentMeta& meta, int64_t i);

/// Shuffled batches of latents for one epoch, streamed shard by shard: the shard order is a permutation drawn from
/// (seed, epoch), `window` shards at a time are pooled and shuffled, and leftovers carry over so every batch is
/// full (the last incomplete batch of the epoch is dropped). Each item becomes z = scale · (m + s · ε), with (m, s)
/// the moments of the image or, with probability ½, of its mirror; ε and the mirror choice come from the global
/// generator, so a resumed run (which restores it) draws the same latents.
/// Data parallel (world > 1): every rank streams the same global batches of `batch_size` and serves its rows
/// rank, rank + world, ... (the draws are those of one process; all ranks share one generator).
class LatentLoader : public BatchStream {
 public:
  /// `start_batch` > 0 (a run resumed inside an epoch) skips the epoch's first batches without drawing from the
  /// global generator: the resumed run's restored generator then draws what the uninterrupted epoch drew.
  LatentLoader(std::string dir, const LatentMeta& meta, int64_t batch_size, uint64_t seed, int64_t epoch, int64_t limit,
               int64_t window = 4, int rank = 0, int world = 1, int64_t start_batch = 0);
  int64_t num_batches() const override { return count_ / batch_; }
  /// Images used per epoch (the first `limit` of the directory, or all).
  int64_t count() const { return count_; }
  /// The next batch: z (B, C, H, W) float32 and labels (B) int64 (B = batch_size / world); false at the end.
  bool next(at::Tensor& z, at::Tensor& labels) override;

 private:
  bool refill();
  bool ensure_batch();  // pools shards until a batch is available; false at the end of the epoch

  std::string dir_;
  LatentMeta meta_;
  int64_t batch_, count_, served_ = 0;
  std::vector<int64_t> order_;    // shard order
  std::vector<int64_t> offsets_;  // index of each used shard's first image
  size_t next_shard_ = 0;
  uint64_t seed_;
  int64_t epoch_;
  int64_t window_;
  int rank_, world_;
  // pooled, shuffled items not yet served
  at::Tensor mean_, std_, mean_flip_, std_flip_, labels_;
  int64_t pos_ = 0;
};

}  // namespace moh::datasets

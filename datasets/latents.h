#pragma once
// Pre-extracted VAE latents (written by `moh extract-latents`, read by the DiT trainer with data.dataset: latents).
// Layout of DIR:
//   meta.json                {"format": "moh-latents", "version": 1, "count": N, "shards": [n0, n1, ...], "channels":
//   C,
//                             "size": H, "scale": 0.18215, "image_size": P, "classes": [...], "vae": "<file name>",
//                             "vae_sha256": "...", "source": "<data spec>"[, "channel_mean": [...],
//                             "channel_std": [...]]}  (the channel statistics: VA-VAE latents, LightningDiT's
//                             latent_norm)
//   shard_00000.safetensors  mean, std, mean_flip, std_flip (n, C, H, W) F16 — the VAE posterior of each image and of
//                            its horizontal mirror — and labels (n) I64; shard i holds n_i images (images that could
//                            not be decoded are left out, so n_i may be below the extraction's shard size); with
//                            "images": true (extract-latents --keep-images) also images (n, P, P, 3) U8, the
//                            center-cropped image the VAE encoded, for REPA's encoder.
// Storing the posterior moments (not one frozen sample, as fast-DiT does) keeps DiT's augmentation: each use draws
// a fresh z = scale · (mean + std · ε) from a randomly mirrored copy, the distribution of DiT's train.py.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/batch_stream.h"

namespace moh::datasets {

/// The map between a VAE's latents z and the space a DiT is trained in: x = scale · (z − mean_c) / std_c. The SD VAE
/// (DiT) only scales (0.18215); VA-VAE latents (LightningDiT's latent_norm) are standardised per channel with the
/// training latents' statistics and scale (latent_multiplier) 1.
struct LatentNorm {
  double scale = 1.0;
  std::vector<double> mean, std;  ///< per channel; empty: 0 and 1

  /// z (B, C, H, W) → x.
  at::Tensor to_model(const at::Tensor& z) const;
  /// x (B, C, H, W) → z, what the VAE decodes.
  at::Tensor to_vae(const at::Tensor& x) const;
};

/// meta.json of a latent directory.
struct LatentMeta {
  int64_t count = 0, channels = 0, size = 0, image_size = 0;
  std::vector<int64_t> shards;  ///< images per shard
  double scale = 0.0;
  std::vector<double> channel_mean, channel_std;  ///< per-channel statistics of the latents (VA-VAE), or empty
  std::vector<std::string> classes;
  std::string vae, vae_sha256, source;
  bool images = false;  ///< shards hold the encoded images too (REPA on latents)

  int64_t num_shards() const { return static_cast<int64_t>(shards.size()); }
  /// How the trainer maps these latents: scale and, when present, the channel statistics.
  LatentNorm norm() const { return {scale, channel_mean, channel_std}; }
};

/// Per-channel mean and standard deviation of the latents z = mean + std · ε of every image of `dir` (not the
/// mirrors), from their moments: E[z] = avg(mean), Var[z] = avg(mean²) + avg(std²) − E[z]² (in double).
void latent_channel_stats(const std::string& dir, LatentMeta& meta);

/// Path of shard i.
std::string latent_shard_path(const std::string& dir, int64_t i);
void write_latent_meta(const std::string& dir, const LatentMeta& meta);
/// Reads and checks meta.json; a missing or malformed directory is a UserError pointing at `moh extract-latents`.
LatentMeta read_latent_meta(const std::string& dir);

/// A latent directory opened for random access: the labels of every image in memory (8 bytes each), the shards'
/// headers checked once, and their moments read row by row on demand (pread), so memory does not grow with the
/// dataset. Shared by the epochs of a run.
class LatentStore {
 public:
  LatentStore(std::string dir, const LatentMeta& meta);
  ~LatentStore();
  const LatentMeta& meta() const { return meta_; }
  int64_t count() const { return meta_.count; }
  /// Label of image i (0 ≤ i < count, in directory order).
  int64_t label(int64_t i) const { return labels_[static_cast<size_t>(i)]; }
  /// Copies the moments of images `index` into rows of mean, std, mean_flip, std_flip (each (n, C, H, W) float16).
  void read(const std::vector<int64_t>& index, at::Tensor& mean, at::Tensor& std, at::Tensor& mean_flip,
            at::Tensor& std_flip) const;
  /// The images of `index` ((n, P, P, 3) uint8) of a store with meta().images.
  at::Tensor read_images(const std::vector<int64_t>& index) const;

 private:
  struct Shard;
  const Shard& shard(int64_t s) const;
  // Rows `index` of the shards' entries `entries` (0..3 the moments, 4 the images) into out[k], row_bytes each.
  void read_entries(const std::vector<int64_t>& index, const std::vector<int>& entries,
                    const std::vector<at::Tensor*>& out, int64_t row_bytes) const;
  std::string dir_;
  LatentMeta meta_;
  std::vector<int64_t> first_;   // index of each shard's first image, plus count at the end
  std::vector<int64_t> labels_;  // (count)
  std::vector<std::unique_ptr<Shard>> shards_;
};

/// Batches of latents for one epoch with DiT's statistics (train.py: DistributedSampler(shuffle=True), a fresh
/// permutation of the whole set every epoch): epoch e serves a permutation of the training images drawn from
/// (seed, e), in global batches of `batch_size` (the last incomplete one dropped), read image by image from the
/// shards, so a class-sorted directory (an ImageFolder tree extracted in order) still gives batches of every class
/// and only one batch is ever in memory. `limit` > 0 trains on limited_subset(count, limit, seed).
/// Each item becomes z = meta.norm().to_model(m + s · ε), with (m, s) the moments of the image or, with probability ½,
/// of its mirror; the mirror choices and ε are drawn for the whole global batch from the global CPU generator, so a
/// resumed run (which restores it) and any number of ranks draw what one process draws. Data parallel (world > 1): rank
/// r serves rows r, r + world, ... of every global batch and reads only those.
class LatentLoader : public BatchStream {
 public:
  /// `start_batch` > 0 (a run resumed inside an epoch) skips the epoch's first batches without drawing from the
  /// global generator: the resumed run's restored generator then draws what the uninterrupted epoch drew.
  /// `with_images`: each batch's images, mirrored with their latents, as side() (the store must hold them).
  LatentLoader(std::shared_ptr<const LatentStore> store, int64_t batch_size, uint64_t seed, int64_t epoch,
               int64_t limit, int rank = 0, int world = 1, int64_t start_batch = 0, bool with_images = false);
  int64_t num_batches() const override { return static_cast<int64_t>(order_.size()) / batch_; }
  /// Images used per epoch (the subset when limited, or all).
  int64_t count() const { return static_cast<int64_t>(order_.size()); }
  /// The next batch: z (B, C, H, W) float32 and labels (B) int64 (B = batch_size / world); false at the end.
  bool next(at::Tensor& z, at::Tensor& labels) override;
  /// With images: the batch's images (B, 3, P, P) float32 in [-1, 1], each mirrored when its latent is.
  at::Tensor side() const override { return images_; }

 private:
  std::shared_ptr<const LatentStore> store_;
  int64_t batch_, next_batch_;
  bool with_images_;
  at::Tensor images_;
  std::vector<int64_t> order_;  // the epoch's image indices (directory order), in serving order
  int rank_, world_;
};

}  // namespace moh::datasets

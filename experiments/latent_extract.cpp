#include "experiments/latent_extract.h"

#include <torch/utils.h>

#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "core/io/progress.h"
#include "core/io/safetensors.h"
#include "core/io/sha256.h"
#include "datasets/fashion_mnist.h"
#include "datasets/image_folder.h"
#include "datasets/loader.h"

namespace moh::experiments {

namespace fs = std::filesystem;

namespace {

/// Images of the split, decoded and cropped on demand: (n, S, S, 3) uint8 blocks + labels.
class SplitReader {
 public:
  SplitReader(const ExperimentConfig& cfg, const std::string& split, int64_t size) : size_(size) {
    if (cfg.data.dataset == DatasetKind::fashion_mnist) {
      set_ = datasets::load_fashion_mnist(split == "train" ? "train" : "test",
                                          cfg.data.root.empty() ? datasets::kFashionMnistDir : cfg.data.root);
      classes_ = datasets::fashion_mnist_classes();
      count_ = set_.size();
    } else if (cfg.data.dataset == DatasetKind::image_folder) {
      if (cfg.data.root.empty())
        throw UserError("config: data.root", "image_folder needs a root", "<root>/{train,val}/<class>/*");
      index_ = datasets::scan_image_folder(cfg.data.root, split);
      classes_ = index_.classes;
      count_ = static_cast<int64_t>(index_.files.size());
    } else {
      throw UserError("config: data.dataset", "latents are extracted from images", "use fashion_mnist or image_folder");
    }
    const int64_t limit = split == "train" ? cfg.data.limit_train : cfg.data.limit_val;
    pick_ = datasets::limited_subset(count_, limit, static_cast<uint64_t>(cfg.train.seed));  // a seeded subset, sorted
    count_ = static_cast<int64_t>(pick_.size());
  }
  int64_t size() const { return count_; }
  const std::vector<std::string>& classes() const { return classes_; }

  /// Images [begin, end) of the (limited) split: (n, S, S, 3) uint8 and labels; undecodable files are left out and
  /// counted.
  void read(int64_t begin, int64_t end, at::Tensor& images, at::Tensor& labels, int64_t& bad) {
    if (set_.images.defined()) {  // in-memory grey images: replicate to RGB, bicubic resize to S
      const at::Tensor rows = at::tensor(std::vector<int64_t>(pick_.begin() + begin, pick_.begin() + end), at::kLong);
      at::Tensor x = set_.images.index_select(0, rows).to(at::kFloat);  // (n, H, W)
      x = x.unsqueeze(1).expand({-1, 3, -1, -1});
      if (x.size(2) != size_) x = at::upsample_bicubic2d(x, {size_, size_}, false).clamp(0, 255);
      images = x.round().to(at::kByte).permute({0, 2, 3, 1}).contiguous();
      labels = set_.labels.index_select(0, rows);
      return;
    }
    std::vector<at::Tensor> im;
    std::vector<int64_t> lab;
    for (int64_t j = begin; j < end; ++j) {
      const int64_t i = pick_[static_cast<size_t>(j)];
      at::Tensor t = datasets::decode_center_crop(index_.files[static_cast<size_t>(i)], size_);
      if (!t.defined()) {
        if (bad++ < 5) std::cerr << "warning: cannot decode " << index_.files[static_cast<size_t>(i)] << ", skipped\n";
        continue;
      }
      im.push_back(t);
      lab.push_back(index_.labels[static_cast<size_t>(i)]);
    }
    images = im.empty() ? at::empty({0, size_, size_, 3}, at::kByte) : at::stack(im);
    labels = at::tensor(lab, at::kLong);
  }

 private:
  int64_t size_, count_ = 0;
  std::vector<int64_t> pick_;  // source index of each image read
  datasets::ImageSet set_;
  datasets::ImageFolderIndex index_;
  std::vector<std::string> classes_;
};

}  // namespace

datasets::LatentMeta extract_latents(const ExperimentConfig& cfg, diffusion::AutoencoderKL& vae,
                                     const std::string& vae_file, const ExtractOptions& o, const RunContext& ctx) {
  const int64_t size = cfg.model.img_size;
  if (size <= 0 || size % vae->options.factor() != 0)
    throw UserError("config: model.img_size", "must be a positive multiple of " + std::to_string(vae->options.factor()),
                    "e.g. 256 for 32×32 latents");
  if (o.shard_size <= 0 || o.batch_size <= 0)
    throw UserError("extract-latents", "shard and batch sizes must be positive", "");
  SplitReader reader(cfg, o.split, size);
  fs::create_directories(o.out);
  datasets::LatentMeta meta;
  meta.channels = vae->options.latent_channels;
  meta.size = size / vae->options.factor();
  meta.image_size = size;
  meta.scale = vae->latents.scale;
  meta.classes = reader.classes();
  meta.vae = fs::path(vae_file).filename().string();
  meta.vae_sha256 = vae_file.empty() ? "" : sha256_file(vae_file);
  meta.images = o.keep_images;
  meta.source = (cfg.data.dataset == DatasetKind::fashion_mnist ? "fashion_mnist:" : cfg.data.root + ":") + o.split;

  torch::NoGradGuard ng;
  vae->eval();
  vae->to(ctx.device);
  const int64_t n = reader.size(), shards = (n + o.shard_size - 1) / o.shard_size;
  Progress progress("extract " + o.split, n, "img");
  int64_t bad = 0;
  for (int64_t k = 0; k < shards; ++k) {
    const int64_t begin = k * o.shard_size, end = std::min(n, begin + o.shard_size);
    const std::string path = datasets::latent_shard_path(o.out, k);
    if (fs::exists(path)) {  // left by an interrupted run (shards are written atomically)
      const SafetensorsReader kept(path);
      const SafetensorsEntry* labels = kept.find("labels");
      if (!labels || labels->shape.size() != 1)
        throw UserError("extract-latents --out " + o.out, path + " has no labels", "remove it and extract again");
      if (o.keep_images && !kept.find("images"))
        throw UserError("extract-latents --keep-images", path + " was extracted without images",
                        "remove the shards and extract again");
      meta.shards.push_back(labels->shape[0]);
      progress.advance(end - begin, "kept");
      continue;
    }
    std::vector<at::Tensor> mean, std, mean_f, std_f, labels, kept_images;
    for (int64_t b = begin; b < end; b += o.batch_size) {
      at::Tensor images, lab;
      reader.read(b, std::min(end, b + o.batch_size), images, lab, bad);
      if (images.size(0) > 0) {
        const at::Tensor x = images.permute({0, 3, 1, 2}).to(ctx.device).to(at::kFloat) / 127.5 - 1.0;  // (n, 3, S, S)
        const diffusion::LatentPosterior p = vae->encode(x), pf = vae->encode(x.flip({3}));
        mean.push_back(p.mean.to(at::kCPU).to(at::kHalf)),
            std.push_back((0.5 * p.logvar).exp().to(at::kCPU).to(at::kHalf));
        mean_f.push_back(pf.mean.to(at::kCPU).to(at::kHalf)),
            std_f.push_back((0.5 * pf.logvar).exp().to(at::kCPU).to(at::kHalf));
        labels.push_back(lab);
        if (o.keep_images) kept_images.push_back(images);  // (n, S, S, 3) uint8, as encoded
      }
      progress.advance(std::min(end, b + o.batch_size) - b, "");
    }
    if (labels.empty())
      throw UserError("extract-latents", "no image of shard " + std::to_string(k) + " could be decoded", "");
    TensorMap t{{"mean", at::cat(mean)},
                {"std", at::cat(std)},
                {"mean_flip", at::cat(mean_f)},
                {"std_flip", at::cat(std_f)},
                {"labels", at::cat(labels)}};
    if (o.keep_images) t["images"] = at::cat(kept_images);
    meta.shards.push_back(t["labels"].size(0));
    save_safetensors(path, t, {{"format", "moh-latents"}});
  }
  progress.finish();
  if (n > 0 && static_cast<double>(bad) / static_cast<double>(n) > cfg.data.max_bad_fraction)
    throw UserError("data " + cfg.data.root,
                    std::to_string(bad) + " of " + std::to_string(n) + " images cannot be decoded",
                    "raise data.max_bad_fraction or fix the files");
  for (int64_t c : meta.shards) meta.count += c;
  if (o.channel_stats) datasets::latent_channel_stats(o.out, meta);  // every shard's, kept ones included
  datasets::write_latent_meta(o.out, meta);
  return meta;
}

}  // namespace moh::experiments

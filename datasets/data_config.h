#pragma once
// The data sections of an experiment file (`data:`, `augment:`) and their choices, declared by the datasets library
// that reads them (experiments/experiment_config.h holds the whole file).
#include <cstdint>
#include <string>
#include <vector>

#include "core/config_schema.h"

namespace moh {

/// Built-in dataset readers.
enum class DatasetKind { fashion_mnist, image_folder, latents };
const config::EnumTable<DatasetKind>& enum_table(DatasetKind);

/// How classification images reach the model: decoded once into memory (small sets) or streamed (ImageNet).
enum class LoaderKind { memory, stream };
const config::EnumTable<LoaderKind>& enum_table(LoaderKind);

/// The data: keys a resumed run changes only when asked (another data stream or batch is another run).
const std::vector<std::string>& data_keys_guarded_on_resume();

/// `data:` — where images come from and how many per step.
struct DataConfig {
  DatasetKind dataset = DatasetKind::fashion_mnist;
  LoaderKind loader = LoaderKind::memory;
  std::string root;          ///< "" = dataset default (/usr/share/datasets/fashion-mnist)
  int64_t batch_size = 128;  ///< global batch (summed over ranks and accumulation steps)
  int64_t num_workers = 2;
  double max_bad_fraction = 0.01;
  int64_t limit_train = 0;  ///< use a seeded random subset of N training images (0 = all)
  int64_t limit_val = 0;
  int64_t eval_batch_size = 256;
  int64_t shift = 0;   ///< small-image augmentation: random translation of up to ±shift pixels
  bool hflip = false;  ///< small-image augmentation: random horizontal flip

  template <class V>
  void visit(V& v) {
    v.field("dataset", dataset,
            "reader: fashion_mnist (IDX gz), image_folder (<root>/{train,val}/<class>/*) or latents "
            "(shards of moh extract-latents in <root>, DiT training)");
    v.field("loader", loader,
            "classification input: memory (decode the split once; small sets, data.shift/hflip "
            "augmentation) or stream (image_folder decoded per batch with the augment: section)");
    v.field("root", root, "dataset directory; empty = the reader's default");
    v.field("batch_size", batch_size, "global batch size per optimizer step", config::Range{1, 1e6});
    v.field("num_workers", num_workers, "decoding/augmentation threads", config::Range{0, 256});
    v.field("max_bad_fraction", max_bad_fraction, "fraction of unreadable images tolerated before it is an error",
            config::Range{0, 1});
    v.field("limit_train", limit_train, "use a seeded random subset of N training images (0 = all)",
            config::Range{0, 1e12});
    v.field("limit_val", limit_val, "use a seeded random subset of N validation images (0 = all)",
            config::Range{0, 1e12});
    v.field("eval_batch_size", eval_batch_size, "batch size for evaluation", config::Range{1, 1e6});
    v.field("shift", shift, "training augmentation for small images: random translation of up to ±N pixels",
            config::Range{0, 4096});
    v.field("hflip", hflip, "training augmentation for small images: random horizontal flip (p = 0.5)");
  }
  /// Rules of data: alone.
  void validate(const config::RuleError& bad) const;
};

/// `augment:` — classification augmentation of the ImageNet recipe (timm create_transform + Mixup). The crop, flip,
/// RandAugment, repeated augmentation and eval crop apply to `data.loader: stream`; random erasing and
/// Mixup/CutMix apply to either loader.
struct AugmentConfig {
  bool random_resized_crop = true;
  std::vector<double> scale{0.08, 1.0};
  std::vector<double> ratio{0.75, 4.0 / 3.0};
  double hflip = 0.5;
  std::string rand_augment;  ///< timm spec, e.g. "rand-m9-mstd0.5-inc1"; "" = off
  double erase_prob = 0.0;
  double mixup = 0.0, cutmix = 0.0;
  double mixup_prob = 1.0, mixup_switch_prob = 0.5;
  int64_t repeated = 1;
  double eval_crop_pct = 0.875;

  template <class V>
  void visit(V& v) {
    v.field("random_resized_crop", random_resized_crop,
            "stream: RandomResizedCrop to the model size (bicubic); off = resize");
    v.field("scale", scale, "stream: RandomResizedCrop area range [min, max]", config::Range{0, 1});
    v.field("ratio", ratio, "stream: RandomResizedCrop aspect-ratio range [min, max]", config::Range{0, 1000});
    v.field("hflip", hflip, "stream: horizontal-flip probability", config::Range{0, 1});
    v.field("rand_augment", rand_augment, "stream: timm RandAugment spec (rand-m9-mstd0.5-inc1); empty = off");
    v.field("erase_prob", erase_prob, "random erasing probability (mode pixel, one box)", config::Range{0, 1});
    v.field("mixup", mixup, "Mixup alpha (0 = off)", config::Range{0, 1000});
    v.field("cutmix", cutmix, "CutMix alpha (0 = off)", config::Range{0, 1000});
    v.field("mixup_prob", mixup_prob, "probability of mixing a batch", config::Range{0, 1});
    v.field("mixup_switch_prob", mixup_switch_prob, "probability of CutMix instead of Mixup when both are on",
            config::Range{0, 1});
    v.field("repeated", repeated, "stream: repeated augmentation count (DeiT RASampler); 1 = off",
            config::Range{1, 1000});
    v.field("eval_crop_pct", eval_crop_pct,
            "stream: evaluation resizes the short side to size / crop_pct, then centre-crops", config::Range{0, 1});
  }
  /// Rules of augment: alone.
  void validate(const config::RuleError& bad) const;
};

}  // namespace moh

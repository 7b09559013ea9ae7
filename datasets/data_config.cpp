#include "datasets/data_config.h"

namespace moh {

const std::vector<std::string>& data_keys_guarded_on_resume() {
  static const std::vector<std::string> keys{"data.dataset", "data.root", "data.batch_size", "data.limit_train"};
  return keys;
}

const config::EnumTable<DatasetKind>& enum_table(DatasetKind) {
  static const config::EnumTable<DatasetKind> t{{DatasetKind::fashion_mnist, "fashion_mnist"},
                                                {DatasetKind::image_folder, "image_folder"},
                                                {DatasetKind::latents, "latents"}};
  return t;
}

const config::EnumTable<LoaderKind>& enum_table(LoaderKind) {
  static const config::EnumTable<LoaderKind> t{{LoaderKind::memory, "memory"}, {LoaderKind::stream, "stream"}};
  return t;
}

void DataConfig::validate(const config::RuleError& bad) const {
  if (batch_size <= 0) bad("data.batch_size", "must be > 0", "e.g. 128");
  if (num_workers < 0) bad("data.num_workers", "must be >= 0", "");
  if (!(max_bad_fraction >= 0 && max_bad_fraction <= 1)) bad("data.max_bad_fraction", "must be in [0, 1]", "");
  if (limit_train < 0 || limit_val < 0) bad("data.limit_train", "must be >= 0 (0 = all)", "");
  if (eval_batch_size <= 0) bad("data.eval_batch_size", "must be > 0", "");
  if (shift < 0) bad("data.shift", "must be >= 0", "");
  if (num_workers > 256) bad("data.num_workers", "must be <= 256, got " + std::to_string(num_workers), "");
  if (loader == LoaderKind::stream && dataset != DatasetKind::image_folder)
    bad("data.loader", "stream reads image_folder datasets",
        "use data.loader: memory for " + config::to_string(dataset));
}

void AugmentConfig::validate(const config::RuleError& bad) const {
  if (scale.size() != 2 || !(scale[0] > 0 && scale[0] <= scale[1] && scale[1] <= 1))
    bad("augment.scale", "expected [min, max] with 0 < min <= max <= 1", "e.g. [0.08, 1.0]");
  if (ratio.size() != 2 || !(ratio[0] > 0 && ratio[0] <= ratio[1]))
    bad("augment.ratio", "expected [min, max] with 0 < min <= max", "e.g. [0.75, 1.3333]");
  for (const auto& [key, p] : {std::pair<const char*, double>{"augment.hflip", hflip},
                               {"augment.erase_prob", erase_prob},
                               {"augment.mixup_prob", mixup_prob},
                               {"augment.mixup_switch_prob", mixup_switch_prob}})
    if (!(p >= 0 && p <= 1)) bad(key, "must be a probability in [0, 1]", "");
  if (mixup < 0 || cutmix < 0)
    bad(mixup < 0 ? "augment.mixup" : "augment.cutmix", "alpha must be >= 0 (0 = off)", "the recipe: 0.8 / 1.0");
  if (repeated < 1) bad("augment.repeated", "must be >= 1 (1 = off)", "the recipe uses 3");
  if (!(eval_crop_pct > 0 && eval_crop_pct <= 1)) bad("augment.eval_crop_pct", "must be in (0, 1]", "0.875");
}

}  // namespace moh

#include "experiments/experiment_data.h"

#include "core/error.h"
#include "datasets/image_folder.h"
#include "datasets/loader.h"

namespace moh::experiments {

datasets::ImageSet load_split(const ExperimentConfig& cfg, bool train, int64_t channels) {
  const int64_t limit = train ? cfg.data.limit_train : cfg.data.limit_val;
  const auto seed = static_cast<uint64_t>(cfg.train.seed);  // limits take a seeded subset (datasets/loader.h)
  if (cfg.data.dataset != DatasetKind::fashion_mnist) {
    if (cfg.data.root.empty())
      throw UserError("config: data.root", "image_folder needs a root", "<root>/{train,val}/<class>/*");
    return datasets::load_image_folder(cfg.data.root, train ? "train" : "val", channels, 0, cfg.data.max_bad_fraction,
                                       nullptr, limit, seed);
  }
  datasets::ImageSet set = datasets::load_fashion_mnist(
      train ? "train" : "test", cfg.data.root.empty() ? datasets::kFashionMnistDir : cfg.data.root);
  if (limit > 0 && limit < set.size()) {
    const at::Tensor rows = at::tensor(datasets::limited_subset(set.size(), limit, seed), at::kLong);
    set.images = set.images.index_select(0, rows);
    set.labels = set.labels.index_select(0, rows);
  }
  return set;
}

void check_data_shape(const ExperimentConfig& cfg, const PixelInput& model) {
  if (cfg.data.dataset != DatasetKind::fashion_mnist) return;
  const int64_t side = datasets::kFashionMnistSide, channels = datasets::kFashionMnistChannels;
  if (model.side > 0 && model.side != side)
    throw UserError("config: model",
                    cfg.model.name + " takes " + std::to_string(model.side) + " px images, the data is " +
                        std::to_string(side) + " px",
                    "choose a matching variant");
  if (model.channels != channels)
    throw UserError("config: model",
                    cfg.model.name + " takes " + std::to_string(model.channels) + " channels, the data has " +
                        std::to_string(channels),
                    "choose a matching variant");
}

}  // namespace moh::experiments

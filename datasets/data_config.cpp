#include "datasets/data_config.h"

namespace moh {

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

}  // namespace moh

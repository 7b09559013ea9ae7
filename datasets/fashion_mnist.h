#pragma once
// Fashion-MNIST (Xiao et al. 2017) in its IDX format, gzip-compressed, as shipped by Debian's
// `dataset-fashion-mnist` package under /usr/share/datasets/fashion-mnist: 60k train + 10k test 28×28 grey images,
// 10 classes. The embedded default dataset of the toolkit.
#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace moh::datasets {

/// Default location of the Debian package's files.
constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
/// Every image's side in pixels, and its channels (grey).
constexpr int64_t kFashionMnistSide = 28, kFashionMnistChannels = 1;
/// Class names in label order.
const std::vector<std::string>& fashion_mnist_classes();

/// A split held in memory: images (N, 28, 28) uint8, labels (N) int64.
struct ImageSet {
  at::Tensor images;
  at::Tensor labels;
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

/// Reads `train` or `test` from `dir`. Missing/corrupt files are UserErrors naming the apt package.
ImageSet load_fashion_mnist(const std::string& split, const std::string& dir = kFashionMnistDir);

/// Decodes an IDX file (optionally gzip-compressed) into a uint8 tensor of its stated shape.
at::Tensor read_idx(const std::string& path);

/// Inflates gzip bytes (multi-member aware); throws UserError(`origin`) on corrupt data.
std::string gunzip(const std::string& bytes, const std::string& origin);

}  // namespace moh::datasets

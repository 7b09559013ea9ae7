#include "datasets/image_source.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/parse.h"
#include "datasets/fashion_mnist.h"
#include "datasets/image_decode.h"
#include "datasets/npz.h"

#ifdef MOH_WITH_OPENCV
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace moh::datasets {

namespace {

constexpr const char* kSpecHint = "use PATH.npz, a folder of PNG/JPEG images, or fashion_mnist:train|test[:N]";

// `arr_0` (and `arr_1`) of an ADM batch, streamed.
class NpzImageSource : public ImageSource {
 public:
  explicit NpzImageSource(const std::string& path) : npz_(path) {
    spec_ = path;
    if (!npz_.has("arr_0"))
      throw UserError("npz " + path, "has no image array arr_0 (members: " + join(npz_.names()) + ")",
                      "sample/reference batches store uint8 NHWC images as arr_0");
    rows_ = npz_.rows("arr_0");
    const NpyHeader& h = rows_->header();
    if (h.dtype != at::kByte)
      throw UserError("npz " + path + " member arr_0",
                      std::string("dtype is ") + c10::toString(h.dtype) + ", expected uint8",
                      "images are stored as uint8 0..255");
    if (!(h.shape.size() == 4 && (h.shape[3] == 1 || h.shape[3] == 3)) && h.shape.size() != 3)
      throw UserError("npz " + path + " member arr_0",
                      "shape " + c10::str(at::IntArrayRef(h.shape)) + " is not (N, H, W, 3), (N, H, W, 1) or (N, H, W)",
                      "NHWC layout");
    if (npz_.has("arr_1")) {
      labels_ = npz_.read("arr_1");
      if (labels_.dim() != 1 || labels_.size(0) != h.shape[0] || !at::isIntegralType(labels_.scalar_type(), false))
        throw UserError("npz " + path + " member arr_1", "labels must be N integers", "one class index per image");
      labels_ = labels_.to(at::kLong);
    }
  }
  int64_t size() const override { return rows_->rows(); }
  bool has_labels() const override { return labels_.defined(); }
  at::Tensor labels() const override { return labels_; }
  bool next(int64_t n, ImageBlock& block) override {
    const int64_t start = rows_->rows() - rows_->rows_left();
    at::Tensor x = rows_->next(n);
    if (x.size(0) == 0) return false;
    if (x.dim() == 3) x = x.unsqueeze(-1);
    block.images = x;
    block.labels = labels_.defined() ? labels_.narrow(0, start, x.size(0)) : at::Tensor();
    return true;
  }

 private:
  NpzReader npz_;
  std::unique_ptr<NpyRowReader> rows_;
  at::Tensor labels_;
};

// The embedded dataset, optionally its first N images.
class FashionMnistSource : public ImageSource {
 public:
  FashionMnistSource(const std::string& spec, const std::string& split, int64_t limit) {
    spec_ = spec;
    set_ = load_fashion_mnist(split);
    if (limit > 0 && limit < set_.size()) {
      set_.images = set_.images.narrow(0, 0, limit);
      set_.labels = set_.labels.narrow(0, 0, limit);
    }
  }
  int64_t size() const override { return set_.size(); }
  bool has_labels() const override { return true; }
  at::Tensor labels() const override { return set_.labels; }
  bool next(int64_t n, ImageBlock& block) override {
    if (pos_ >= size()) return false;
    const int64_t k = std::min(n, size() - pos_);
    block.images = set_.images.narrow(0, pos_, k).unsqueeze(-1);  // (k, 28, 28, 1)
    block.labels = set_.labels.narrow(0, pos_, k);
    pos_ += k;
    return true;
  }

 private:
  ImageSet set_;
  int64_t pos_ = 0;
};

#ifdef MOH_WITH_OPENCV
// Sorted PNG/JPEG files of a folder (not recursive), decoded to RGB.
class FolderSource : public ImageSource {
 public:
  explicit FolderSource(const std::string& dir) {
    spec_ = dir;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      std::string ext = e.path().extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
      if (e.is_regular_file() && (ext == ".png" || ext == ".jpg" || ext == ".jpeg"))
        files_.push_back(e.path().string());
    }
    std::sort(files_.begin(), files_.end());
    if (files_.empty()) throw UserError("images " + dir, "no .png/.jpg/.jpeg files in the folder", kSpecHint);
  }
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  bool has_labels() const override { return false; }
  at::Tensor labels() const override { return {}; }
  bool next(int64_t n, ImageBlock& block) override {
    if (pos_ >= size()) return false;
    const int64_t k = std::min(n, size() - pos_);
    std::vector<at::Tensor> imgs;
    for (int64_t i = 0; i < k; ++i) {
      const std::string& f = files_[static_cast<size_t>(pos_ + i)];
      DecodedImage d = read_image(f, 3);
      if (!d.ok()) throw UserError("image " + f, d.problem, "remove or replace the file");
      const int64_t rows = d.pixels.size(0), cols = d.pixels.size(1);
      if (height_ == 0) {
        height_ = rows;
        width_ = cols;
      }
      if (rows != height_ || cols != width_)
        throw UserError("image " + f,
                        "is " + std::to_string(cols) + "x" + std::to_string(rows) + ", the first image is " +
                            std::to_string(width_) + "x" + std::to_string(height_),
                        "all images of a folder must have the same size");
      imgs.push_back(d.pixels);
    }
    block.images = at::stack(imgs);
    block.labels = at::Tensor();
    pos_ += k;
    return true;
  }

 private:
  std::vector<std::string> files_;
  int64_t pos_ = 0;
  int64_t height_ = 0, width_ = 0;
};
#endif

}  // namespace

bool is_npz_spec(const std::string& spec) {
  return spec.size() > 4 && spec.compare(spec.size() - 4, 4, ".npz") == 0;
}

// Images a caller holds in memory (moh_torch.metrics.fid_report on an array): blocks are views of its tensor.
class TensorImageSource : public ImageSource {
 public:
  TensorImageSource(const at::Tensor& images, const std::string& spec) {
    spec_ = spec;
    const bool nhwc = images.dim() == 4 && (images.size(3) == 1 || images.size(3) == 3);
    if (images.scalar_type() != at::kByte || !(nhwc || images.dim() == 3))
      throw UserError("images " + spec,
                      std::string("are ") + c10::toString(images.scalar_type()) + " " + c10::str(images.sizes()) +
                          ", not uint8 (N, H, W, 3), (N, H, W, 1) or (N, H, W)",
                      "NHWC uint8 images, as ADM's .npz batches store them");
    images_ = images.dim() == 3 ? images.unsqueeze(-1) : images;
  }
  std::unique_ptr<ImageSource> fresh() const override { return std::make_unique<TensorImageSource>(images_, spec_); }
  int64_t size() const override { return images_.size(0); }
  bool has_labels() const override { return false; }
  at::Tensor labels() const override { return at::Tensor(); }
  bool next(int64_t n, ImageBlock& block) override {
    const int64_t take = std::min(n, size() - start_);
    if (take <= 0) return false;
    block.images = images_.narrow(0, start_, take).to(at::kCPU).contiguous();  // one block at a time
    block.labels = at::Tensor();
    start_ += take;
    return true;
  }

 private:
  at::Tensor images_;
  int64_t start_ = 0;
};

std::unique_ptr<ImageSource> ImageSource::fresh() const {
  return open_image_source(spec_);
}

std::unique_ptr<ImageSource> tensor_image_source(const at::Tensor& images, const std::string& spec) {
  return std::make_unique<TensorImageSource>(images, spec);
}

std::unique_ptr<ImageSource> open_image_source(const std::string& spec) {
  const std::string prefix = "fashion_mnist:";
  if (spec.rfind(prefix, 0) == 0) {
    std::string rest = spec.substr(prefix.size());
    int64_t limit = 0;
    const size_t colon = rest.find(':');
    if (colon != std::string::npos) {
      const std::string n = rest.substr(colon + 1);
      const std::optional<int64_t> count = parse_int(n);
      if (!count || *count < 0) throw UserError("images " + spec, "'" + n + "' is not an image count", kSpecHint);
      limit = *count;
      rest = rest.substr(0, colon);
    }
    if (rest != "train" && rest != "test") throw UserError("images " + spec, "unknown split '" + rest + "'", kSpecHint);
    return std::make_unique<FashionMnistSource>(spec, rest, limit);
  }
  if (is_npz_spec(spec)) return std::make_unique<NpzImageSource>(spec);
  if (std::filesystem::is_directory(spec)) {
#ifdef MOH_WITH_OPENCV
    return std::make_unique<FolderSource>(spec);
#else
    throw UserError("images " + spec, "image folders need OpenCV, which this build was configured without",
                    "rebuild with -DMOH_WITH_OPENCV=ON or pass an .npz");
#endif
  }
  throw UserError("images " + spec,
                  std::filesystem::exists(spec) ? "not an .npz file or a folder" : "no such file or folder", kSpecHint);
}

}  // namespace moh::datasets

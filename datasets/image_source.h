#pragma once
// Streams of uint8 images for evaluation and sampling tools, whatever they are stored in:
//   PATH.npz              an ADM sample / reference batch: `arr_0` (N, H, W, C) or (N, H, W) uint8, optional `arr_1`
//   labels DIR/                  a folder of PNG/JPEG files (sorted by name, decoded with OpenCV to RGB; all the same
//   size) fashion_mnist:SPLIT   the embedded dataset (SPLIT = train|test, optionally `:N` for the first N images)
// Every source yields (n, H, W, C) uint8 blocks in a fixed order, so features and reports are reproducible.
#include <ATen/ATen.h>

#include <memory>
#include <string>

namespace moh::datasets {

/// A block of images (n, H, W, C) uint8 and their labels (n) int64 when the source has them.
struct ImageBlock {
  at::Tensor images;
  at::Tensor labels;
};

/// A sequential reader of images.
class ImageSource {
 public:
  virtual ~ImageSource() = default;
  /// Number of images.
  virtual int64_t size() const = 0;
  /// Whether blocks carry class labels.
  virtual bool has_labels() const = 0;
  /// Every label (N) int64, read without decoding an image; undefined when the source has none.
  virtual at::Tensor labels() const = 0;
  /// The next up to `n` images; false once exhausted.
  virtual bool next(int64_t n, ImageBlock& block) = 0;
  /// The spec it was opened from.
  const std::string& spec() const { return spec_; }
  /// A new reader of the same images from the first (a probe that must not consume this one's).
  virtual std::unique_ptr<ImageSource> fresh() const;

 protected:
  std::string spec_;
};

/// Opens a source from its spec (see the file comment). Unknown specs, missing files and bad arrays are UserErrors.
std::unique_ptr<ImageSource> open_image_source(const std::string& spec);

/// Images already in memory, (N, H, W, C) uint8 with C 1 or 3 (or (N, H, W)), read block by block as views of the
/// caller's tensor (no copy of the whole set); `spec` names them in reports. A bad tensor is a UserError.
std::unique_ptr<ImageSource> tensor_image_source(const at::Tensor& images, const std::string& spec);

/// Whether a spec names an .npz file.
bool is_npz_spec(const std::string& spec);

}  // namespace moh::datasets

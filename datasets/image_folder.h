#pragma once
// ImageFolder datasets (torchvision layout, as ImageNet is distributed): <root>/<split>/<class>/<image>, classes in
// sorted folder-name order (the label of a class = its index in that order, empty class folders included so labels
// stay aligned with the folder list). Images are decoded with OpenCV; unreadable files are skipped and counted, with
// a summary line, and more than `max_bad_fraction` of them is an error. This reader holds the decoded split in
// memory (small datasets: Fashion-MNIST-sized trees, tests); ImageNet-scale trees stream through StreamLoader
// (datasets/stream_loader.h).
#include <string>
#include <vector>

#include "datasets/fashion_mnist.h"

namespace moh::datasets {

/// The files of one split.
struct ImageFolderIndex {
  std::vector<std::string> classes;  ///< sorted class folder names
  std::vector<std::string> files;    ///< every image file, class by class, sorted by name within a class
  std::vector<int64_t> labels;       ///< class index of each file
  std::vector<std::string> empty_classes;
};

/// Lists <root>/<split>/<class>/*.{jpg,jpeg,png,bmp,JPEG,...}. A missing split folder or a split without any image is a
/// UserError.
ImageFolderIndex scan_image_folder(const std::string& root, const std::string& split);

/// Keeps limited_subset(files, limit, seed) of an index (data.limit_train / limit_val: a seeded subset of a
/// class-sorted tree, not its first classes); nothing changes when limit is 0 or covers every file.
void limit_image_folder(ImageFolderIndex& index, int64_t limit, uint64_t seed);

/// The sorted class folder names of <root>/<split> (labels are their indices); a missing split folder is a UserError.
std::vector<std::string> class_folders(const std::string& root, const std::string& split);

/// Train and val must label alike: the same class folders in the same order (an empty folder present in one split
/// only would shift every later label). UserError naming the first difference otherwise; a tree without one of the
/// two splits passes (an evaluation tree may hold val only).
void check_same_classes(const std::string& root);

/// What happened while decoding.
struct DecodeReport {
  int64_t decoded = 0, bad = 0;
  std::vector<std::string> bad_files;  ///< the first few unreadable files
};

/// Decodes a split into memory: grey (N, S, S) when channels == 1, else RGB (N, S, S, 3). Images whose size differs
/// from `size` are resized with area interpolation (size = 0: the first image's size, which all must share).
/// Throws UserError when the unreadable fraction exceeds max_bad_fraction. `limit` > 0 decodes a seeded subset
/// (limit_image_folder).
ImageSet load_image_folder(const std::string& root, const std::string& split, int64_t channels, int64_t size,
                           double max_bad_fraction, DecodeReport* report = nullptr, int64_t limit = 0,
                           uint64_t seed = 0);

/// ADM's center_crop_arr (DiT's training transform) of a uint8 (H, W, C) image: halve (W // 2, H // 2) with Pillow's
/// BOX filter while the short side is ≥ 2·size, resize with BICUBIC so the short side is size (Python's round of
/// the scaled sides), crop the centre ((H − size) // 2, (W − size) // 2). Returns (size, size, C) uint8, Pillow's
/// bytes bit for bit (datasets/resample.h); only the crop window of the last resize is computed.
at::Tensor center_crop_arr(const at::Tensor& hwc, int64_t size);

/// Decodes one image to RGB and applies center_crop_arr; an undefined tensor when the file cannot be decoded.
at::Tensor decode_center_crop(const std::string& path, int64_t size);

/// Writes a labelled image set as an ImageFolder split: <dir>/<class name>/<index:06d>.<format> (class names given per
/// label; format "png" or "jpg" at JPEG quality 95). Used to turn the embedded dataset into a tree (`moh
/// export-images`).
void write_image_folder(const std::string& dir, const ImageSet& set, const std::vector<std::string>& class_names,
                        const std::string& format = "png");

}  // namespace moh::datasets

#include "datasets/image_folder.h"

#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/progress.h"
#include "core/platform/run_context.h"
#include "datasets/image_decode.h"
#include "datasets/loader.h"
#include "datasets/resample.h"

#ifdef MOH_WITH_OPENCV
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace moh::datasets {

namespace fs = std::filesystem;

namespace {

constexpr size_t kBadFilesListed = 5;

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".bmp" || ext == ".webp" || ext == ".tif" ||
         ext == ".tiff";
}

}  // namespace

std::vector<std::string> class_folders(const std::string& root, const std::string& split) {
  const fs::path dir = fs::path(root) / split;
  if (!fs::is_directory(dir))
    throw UserError("data.root " + root, "has no '" + split + "' folder",
                    "expected <root>/{train,val}/<class>/<image>");
  std::vector<std::string> classes;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) classes.push_back(e.path().filename().string());
  std::sort(classes.begin(), classes.end());
  return classes;
}

void check_same_classes(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(fs::path(root) / "train", ec) || !fs::is_directory(fs::path(root) / "val", ec)) return;
  const std::vector<std::string> train = class_folders(root, "train"), val = class_folders(root, "val");
  if (train == val) return;
  size_t i = 0;
  while (i < train.size() && i < val.size() && train[i] == val[i]) ++i;
  const std::string t = i < train.size() ? "'" + train[i] + "'" : "nothing",
                    v = i < val.size() ? "'" + val[i] + "'" : "nothing";
  throw UserError("data.root " + root,
                  "train and val have different class folders (" + std::to_string(train.size()) + " vs " +
                      std::to_string(val.size()) + "; label " + std::to_string(i) + " is " + t + " in train, " + v +
                      " in val)",
                  "both splits need the same class folders, empty ones included");
}

ImageFolderIndex scan_image_folder(const std::string& root, const std::string& split) {
  const fs::path dir = fs::path(root) / split;
  ImageFolderIndex idx;
  idx.classes = class_folders(root, split);
  for (size_t c = 0; c < idx.classes.size(); ++c) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir / idx.classes[c]))
      if (e.is_regular_file() && is_image_file(e.path())) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty()) idx.empty_classes.push_back(idx.classes[c]);
    for (auto& f : files) idx.files.push_back(std::move(f)), idx.labels.push_back(static_cast<int64_t>(c));
  }
  if (idx.files.empty())
    throw UserError("data.root " + root, "no images under " + dir.string(),
                    "expected <root>/" + split + "/<class>/<image>");
  return idx;
}

void limit_image_folder(ImageFolderIndex& index, int64_t limit, uint64_t seed) {
  const auto n = static_cast<int64_t>(index.files.size());
  if (limit <= 0 || limit >= n) return;
  ImageFolderIndex kept;
  for (int64_t i : limited_subset(n, limit, seed))
    kept.files.push_back(index.files[static_cast<size_t>(i)]),
        kept.labels.push_back(index.labels[static_cast<size_t>(i)]);
  index.files = std::move(kept.files);
  index.labels = std::move(kept.labels);
}

ImageSet load_image_folder(const std::string& root, const std::string& split, int64_t channels, int64_t size,
                           double max_bad_fraction, DecodeReport* report, int64_t limit, uint64_t seed) {
#ifndef MOH_WITH_OPENCV
  (void)root, (void)split, (void)channels, (void)size, (void)max_bad_fraction, (void)report, (void)limit, (void)seed;
  throw UserError("data.dataset image_folder", "needs OpenCV, which this build was configured without",
                  "rebuild with -DMOH_WITH_OPENCV=ON");
#else
  ImageFolderIndex idx = scan_image_folder(root, split);
  if (!idx.empty_classes.empty())
    note_later("warning: " + root + "/" + split + ": " + std::to_string(idx.empty_classes.size()) +
               " class folder(s) without images (kept as labels): " + join(idx.empty_classes));
  limit_image_folder(idx, limit, seed);
  const auto n = static_cast<int64_t>(idx.files.size());
  std::vector<DecodedImage> decoded(static_cast<size_t>(n));
  at::parallel_for(0, n, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      decoded[static_cast<size_t>(i)] = read_image(idx.files[static_cast<size_t>(i)], channels);
  });
  DecodeReport r;
  for (int64_t i = 0; i < n; ++i) {
    const DecodedImage& d = decoded[static_cast<size_t>(i)];
    if (d.ok()) {
      ++r.decoded;
      if (size == 0) size = d.pixels.size(0);
    } else {
      ++r.bad;
      if (r.bad_files.size() < kBadFilesListed)
        r.bad_files.push_back(fs::path(idx.files[static_cast<size_t>(i)]).filename().string() + ": " + d.problem);
    }
  }
  if (report) *report = r;
  const double frac = n ? static_cast<double>(r.bad) / static_cast<double>(n) : 0.0;
  if (frac > max_bad_fraction || r.decoded == 0)
    throw UserError(
        "data.root " + root,
        std::to_string(r.bad) + " of " + std::to_string(n) + " images are unreadable (" + join(r.bad_files) + ")",
        "above data.max_bad_fraction; fix or remove them");
  note_later(root + "/" + split + ": " + std::to_string(r.decoded) + " images decoded, " + std::to_string(r.bad) +
             " unreadable skipped" + (r.bad ? " (first: " + r.bad_files.front() + ")" : std::string()));
  // The decoded split lives in memory: refuse what cannot fit rather than fail half-way.
  const double bytes = static_cast<double>(r.decoded) * static_cast<double>(size) * static_cast<double>(size) *
                       static_cast<double>(channels == 1 ? 1 : 3);
  if (bytes > 0.5 * static_cast<double>(physical_memory_bytes()))
    throw UserError("data.root " + root,
                    std::to_string(r.decoded) + " images of " + std::to_string(size) + "x" + std::to_string(size) +
                        " px need " + std::to_string(static_cast<int64_t>(bytes / (1 << 20))) +
                        " MiB in memory, more than half of this machine's",
                    "use data.loader: stream (decodes per batch)");
  ImageSet set;
  std::vector<int64_t> shape{r.decoded, size, size};
  if (channels != 1) shape.push_back(3);
  set.images = at::empty(shape, at::kByte);
  set.labels = at::empty({r.decoded}, at::kLong);
  int64_t j = 0;
  for (int64_t i = 0; i < n; ++i) {
    const DecodedImage& d = decoded[static_cast<size_t>(i)];
    if (!d.ok()) continue;
    cv::Mat m(static_cast<int>(d.pixels.size(0)), static_cast<int>(d.pixels.size(1)), channels == 1 ? CV_8UC1 : CV_8UC3,
              d.pixels.data_ptr());
    if (m.rows != size || m.cols != size)
      cv::resize(m, m, cv::Size(static_cast<int>(size), static_cast<int>(size)), 0, 0, cv::INTER_AREA);
    if (!m.isContinuous()) m = m.clone();
    std::memcpy(set.images[j].data_ptr(), m.data, m.total() * m.elemSize());
    set.labels[j] = idx.labels[static_cast<size_t>(i)];
    ++j;
  }
  return set;
#endif
}

void write_image_folder(const std::string& dir, const ImageSet& set, const std::vector<std::string>& class_names,
                        const std::string& format) {
  if (format != "png" && format != "jpg") throw UserError("image format " + format, "unknown", "png or jpg");
#ifndef MOH_WITH_OPENCV
  (void)dir, (void)set, (void)class_names;
  throw UserError("export", "writing PNG needs OpenCV, which this build was configured without", "");
#else
  const at::Tensor images = set.images.contiguous(), labels = set.labels.to(at::kLong).contiguous();
  const int64_t* lab = labels.data_ptr<int64_t>();
  const int64_t n = set.size();
  for (const auto& c : class_names) fs::create_directories(fs::path(dir) / c);
  at::parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const at::Tensor img = images[i].contiguous();
      const int type = img.dim() == 3 && img.size(2) == 3 ? CV_8UC3 : CV_8UC1;
      cv::Mat m(static_cast<int>(img.size(0)), static_cast<int>(img.size(1)), type, img.data_ptr());
      if (type == CV_8UC3) cv::cvtColor(m, m, cv::COLOR_RGB2BGR);
      std::vector<uchar> bytes;
      cv::imencode("." + format, m, bytes, {cv::IMWRITE_JPEG_QUALITY, 95});
      char name[32];
      std::snprintf(name, sizeof name, "%06lld.%s", static_cast<long long>(i), format.c_str());
      const int64_t label = lab[i];
      write_file_atomic((fs::path(dir) / class_names.at(static_cast<size_t>(label)) / name).string(),
                        std::string(bytes.begin(), bytes.end()));
    }
  });
#endif
}

at::Tensor center_crop_arr(const at::Tensor& hwc, int64_t size) {
  TORCH_CHECK(size > 0 && hwc.dim() == 3, "center_crop_arr: expected an (H, W, C) image and a positive size");
  at::Tensor img = hwc;
  while (std::min(img.size(0), img.size(1)) >= 2 * size)
    img = resize_pillow(img, img.size(0) / 2, img.size(1) / 2, PillowFilter::kBox);
  const int64_t H = img.size(0), W = img.size(1);
  const double scale = static_cast<double>(size) / static_cast<double>(std::min(H, W));
  const auto nh = static_cast<int64_t>(std::nearbyint(static_cast<double>(H) * scale));  // round half to even
  const auto nw = static_cast<int64_t>(std::nearbyint(static_cast<double>(W) * scale));
  return resize_bicubic(img, nh, nw, {(nh - size) / 2, (nw - size) / 2, size, size});
}

at::Tensor decode_center_crop(const std::string& path, int64_t size) {
#ifndef MOH_WITH_OPENCV
  (void)path, (void)size;
  throw UserError("image decoding", "needs OpenCV, which this build was configured without",
                  "rebuild with -DMOH_WITH_OPENCV=ON");
#else
  DecodedImage d = read_image(path, 3);
  if (!d.ok()) return {};
  return center_crop_arr(d.pixels, size);
#endif
}

}  // namespace moh::datasets

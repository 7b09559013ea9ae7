#include "datasets/image_grid.h"

#include "core/io/atomic_io.h"

#include <algorithm>

#ifdef MOH_WITH_OPENCV
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace moh::datasets {

bool write_grid(const std::string& path, const at::Tensor& images, int64_t cols, int scale,
                const std::vector<std::string>& row_labels, const std::vector<std::string>& tile_labels) {
#ifdef MOH_WITH_OPENCV
  at::Tensor imgs = images;
  if (imgs.size(3) == 3 && imgs.select(3, 0).equal(imgs.select(3, 1)) && imgs.select(3, 0).equal(imgs.select(3, 2)))
    imgs = imgs.narrow(3, 0, 1).contiguous();  // grey replicated to RGB: a 1-channel PNG is a third of the size
  const int64_t H = imgs.size(1), W = imgs.size(2), C = imgs.size(3), pad = 2;
  const int64_t rows = (imgs.size(0) + cols - 1) / cols;
  at::Tensor canvas = at::full({rows * (H + pad) + pad, cols * (W + pad) + pad, C}, 255, at::kByte);
  for (int64_t i = 0; i < imgs.size(0); ++i) {
    const int64_t r = i / cols, c = i % cols;
    canvas.narrow(0, pad + r * (H + pad), H).narrow(1, pad + c * (W + pad), W).copy_(imgs[i]);
  }
  cv::Mat m(static_cast<int>(canvas.size(0)), static_cast<int>(canvas.size(1)), C == 3 ? CV_8UC3 : CV_8UC1,
            canvas.data_ptr());
  cv::Mat out;
  cv::resize(m, out, cv::Size(), scale, scale, cv::INTER_NEAREST);
  if (C == 3) cv::cvtColor(out, out, cv::COLOR_RGB2BGR);
  // Tile captions: a white band under every row of tiles, one label per tile.
  const int row_px = static_cast<int>((H + pad) * scale), col_px = static_cast<int>((W + pad) * scale);
  const int pad_px = static_cast<int>(pad) * scale, band = tile_labels.empty() ? 0 : 14;
  if (band > 0) {
    cv::Mat with(out.rows + static_cast<int>(rows) * band, out.cols, out.type(), cv::Scalar::all(255));
    for (int r = 0; r < static_cast<int>(rows); ++r) {  // row r (with the pad above it) moves down by r bands
      const int len = row_px + pad_px;
      out.rowRange(r * row_px, r * row_px + len).copyTo(with.rowRange(r * (row_px + band), r * (row_px + band) + len));
    }
    for (size_t i = 0; i < tile_labels.size() && static_cast<int64_t>(i) < imgs.size(0); ++i) {
      const int r = static_cast<int>(static_cast<int64_t>(i) / cols),
                c = static_cast<int>(static_cast<int64_t>(i) % cols);
      cv::putText(with, tile_labels[i],
                  cv::Point(pad_px + c * col_px, r * (row_px + band) + row_px + pad_px + band - 6),
                  cv::FONT_HERSHEY_SIMPLEX, 0.33, cv::Scalar::all(0), 1, cv::LINE_AA);
    }
    out = with;
  }
  if (!row_labels.empty()) {
    constexpr int kMargin = 110;
    cv::copyMakeBorder(out, out, 0, 0, kMargin, 0, cv::BORDER_CONSTANT, cv::Scalar(255, 255, 255));
    const double row_h = static_cast<double>(row_px + band);
    for (size_t r = 0; r < row_labels.size() && static_cast<int64_t>(r) < rows; ++r)
      cv::putText(out, row_labels[r], cv::Point(4, static_cast<int>((r + 0.5) * row_h + pad * scale + 4)),
                  cv::FONT_HERSHEY_SIMPLEX, 0.45, cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
  }
  std::vector<uchar> png;
  cv::imencode(".png", out, png);
  write_file_atomic(path, std::string(png.begin(), png.end()));
  return true;
#else
  (void)path, (void)images, (void)cols, (void)scale, (void)row_labels;
  return false;
#endif
}

}  // namespace moh::datasets

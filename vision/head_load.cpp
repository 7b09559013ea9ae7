#include "vision/head_load.h"

#include <algorithm>

#include "core/atomic_io.h"

#ifdef MOH_WITH_OPENCV
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace moh::vision {

namespace {

// Rows of a (classes, E) count matrix as shares summing to 1 (all-zero rows stay zero).
at::Tensor row_shares(const at::Tensor& counts) {
  return counts / counts.sum(-1, true).clamp_min(1.0);
}

std::vector<double> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

}  // namespace

HeadLoadStats::HeadLoadStats(const TransNeXtOptions& model, int64_t num_classes) : classes_(num_classes) {
  for (int64_t s = 0; s < 4; ++s) {
    const nn::MoHAttentionOptions a = model.stage_attention(s);
    for (int64_t j = 0; j < model.depths[s]; ++j) {
      Layer l;
      l.name = "stage" + std::to_string(s + 1) + ".block" + std::to_string(j);
      l.stage = s + 1;
      l.block = j;
      l.shared = a.shared_heads;
      l.topk = a.topk;
      l.pool = a.topk > 0 ? a.routed_pool() : 0;
      if (l.pool > 0) l.counts = at::zeros({num_classes, l.pool}, at::kDouble);
      layers_.push_back(l);
    }
  }
}

void HeadLoadStats::add(const std::vector<at::Tensor>& routed, const at::Tensor& labels) {
  const at::Tensor y = labels.to(at::kCPU, at::kLong);
  const int64_t B = y.size(0);
  for (size_t i = 0; i < layers_.size() && i < routed.size(); ++i) {
    Layer& l = layers_[i];
    if (l.pool == 0 || !routed[i].defined()) continue;
    const at::Tensor sel = routed[i].to(at::kCPU, at::kLong);  // (B·N, K)
    const int64_t per_image = sel.size(0) / B;
    // Flat index class·E + head for every selection; tokens of image b belong to class y[b].
    const at::Tensor cls = y.repeat_interleave(per_image).unsqueeze(1).expand_as(sel);
    const at::Tensor flat = (cls * l.pool + sel).reshape({-1});
    l.counts.view({-1}).index_add_(0, flat, at::ones({flat.size(0)}, at::kDouble));
  }
}

void HeadLoadStats::reduce(dist::Group& group) {
  std::vector<at::Tensor> counts;
  for (auto& l : layers_)
    if (l.counts.defined()) counts.push_back(l.counts);
  group.allreduce_sum_(counts);  // in place: the tensors are the layers' own
}

nlohmann::json HeadLoadStats::to_json() const {
  nlohmann::json layers = nlohmann::json::array();
  for (const Layer& l : layers_) {
    if (l.pool == 0) continue;
    nlohmann::json per_class = nlohmann::json::array();
    const at::Tensor shares = row_shares(l.counts);
    for (int64_t c = 0; c < classes_; ++c) per_class.push_back(to_vector(shares[c]));
    layers.push_back({{"name", l.name},
                      {"stage", l.stage},
                      {"block", l.block},
                      {"shared", l.shared},
                      {"routed_pool", l.pool},
                      {"topk", l.topk},
                      {"selections", l.counts.sum().item<double>()},
                      {"overall", to_vector(row_shares(l.counts.sum(0)))},
                      {"per_class", per_class}});
  }
  return {{"layers", layers},
          {"note", "shares of the routed heads' selections (each row sums to 1); shared heads are always on"}};
}

bool HeadLoadStats::write_png(const std::string& path, const std::vector<std::string>& class_names) const {
#ifdef MOH_WITH_OPENCV
  constexpr int kCell = 18, kTitle = 18, kLabel = 92, kGap = 12, kMinPanelWidth = 230, kAxis = 16;
  std::vector<cv::Mat> panels;
  for (const Layer& l : layers_) {
    if (l.pool == 0) continue;
    const at::Tensor shares = row_shares(l.counts);
    // Colour scale per panel: 0 .. 2/E (twice the uniform share) so balanced layers look even.
    const double top = 2.0 / static_cast<double>(l.pool);
    cv::Mat grey(static_cast<int>(classes_), static_cast<int>(l.pool), CV_8UC1);
    for (int64_t c = 0; c < classes_; ++c)
      for (int64_t e = 0; e < l.pool; ++e)
        grey.at<uchar>(static_cast<int>(c), static_cast<int>(e)) =
            static_cast<uchar>(std::clamp(shares[c][e].item<double>() / top, 0.0, 1.0) * 255.0);
    cv::Mat big, colour;
    cv::resize(grey, big, cv::Size(), kCell, kCell, cv::INTER_NEAREST);
    cv::applyColorMap(big, colour, cv::COLORMAP_VIRIDIS);
    cv::Mat panel(colour.rows + kTitle + kAxis, std::max(colour.cols + kLabel, kMinPanelWidth), CV_8UC3,
                  cv::Scalar(255, 255, 255));
    colour.copyTo(panel(cv::Rect(kLabel, kTitle, colour.cols, colour.rows)));
    // Head-index axis: the routed head e (0-based within the layer's routed pool), every head or every 2nd/4th.
    const int64_t every = l.pool <= 12 ? 1 : l.pool <= 24 ? 2 : 4;
    for (int64_t e = 0; e < l.pool; e += every)
      cv::putText(panel, std::to_string(e),
                  cv::Point(kLabel + static_cast<int>(e) * kCell + 3, kTitle + colour.rows + kAxis - 4),
                  cv::FONT_HERSHEY_SIMPLEX, 0.3, cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
    cv::putText(panel, "head", cv::Point(2, kTitle + colour.rows + kAxis - 4), cv::FONT_HERSHEY_SIMPLEX, 0.33,
                cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
    cv::putText(panel, l.name + " (top-" + std::to_string(l.topk) + " of " + std::to_string(l.pool) + ")",
                cv::Point(2, kTitle - 5), cv::FONT_HERSHEY_SIMPLEX, 0.4, cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
    for (int64_t c = 0; c < classes_; ++c) {
      const std::string name =
          static_cast<size_t>(c) < class_names.size() ? class_names[static_cast<size_t>(c)] : std::to_string(c);
      cv::putText(panel, name.substr(0, 13), cv::Point(2, kTitle + static_cast<int>(c) * kCell + kCell - 5),
                  cv::FONT_HERSHEY_SIMPLEX, 0.33, cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
    }
    panels.push_back(panel);
  }
  if (panels.empty()) return false;
  // Colour bar on top: one scale for every panel, in multiples of the uniform share 1/E of a layer's routed pool.
  constexpr int kBarW = 200, kBarH = 10, kBarBlock = 68, kBarY = kGap + 28;
  int width = kBarW + 40, height = kGap + kBarBlock;
  for (const auto& p : panels) {
    width = std::max(width, p.cols);
    height += p.rows + kGap;
  }
  cv::Mat canvas(height, width + 2 * kGap, CV_8UC3, cv::Scalar(255, 255, 255));
  cv::putText(canvas, "share of a class's routed picks per head,", cv::Point(kGap, kGap + 8), cv::FONT_HERSHEY_SIMPLEX,
              0.36, cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
  cv::putText(canvas, "relative to uniform 1/E (one scale for all)", cv::Point(kGap, kGap + 22),
              cv::FONT_HERSHEY_SIMPLEX, 0.36, cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
  cv::Mat ramp(1, kBarW, CV_8UC1);
  for (int i = 0; i < kBarW; ++i) ramp.at<uchar>(0, i) = static_cast<uchar>(i * 255 / (kBarW - 1));
  cv::Mat ramp_big, ramp_colour;
  cv::resize(ramp, ramp_big, cv::Size(kBarW, kBarH), 0, 0, cv::INTER_NEAREST);
  cv::applyColorMap(ramp_big, ramp_colour, cv::COLORMAP_VIRIDIS);
  ramp_colour.copyTo(canvas(cv::Rect(kGap, kBarY, kBarW, kBarH)));
  for (const auto& [frac, text] :
       std::vector<std::pair<double, std::string>>{{0.0, "0"}, {0.5, "1x (uniform)"}, {1.0, ">=2x"}})
    cv::putText(canvas, text,
                cv::Point(kGap + static_cast<int>(frac * (kBarW - 1)) -
                              (frac > 0.9   ? 14
                               : frac > 0.4 ? 20
                                            : 0),
                          kBarY + kBarH + 13),
                cv::FONT_HERSHEY_SIMPLEX, 0.33, cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
  int y = kGap + kBarBlock;
  for (const auto& p : panels) {
    p.copyTo(canvas(cv::Rect(kGap, y, p.cols, p.rows)));
    y += p.rows + kGap;
  }
  std::vector<uchar> png;
  cv::imencode(".png", canvas, png);
  write_file_atomic(path, std::string(png.begin(), png.end()));
  return true;
#else
  (void)path, (void)class_names;
  return false;
#endif
}

}  // namespace moh::vision

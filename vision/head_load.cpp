#include "vision/head_load.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "core/io/atomic_io.h"

#ifdef MOH_WITH_OPENCV
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace moh::vision {

at::Tensor row_shares(const at::Tensor& counts) {
  return counts / counts.sum(-1, true).clamp_min(1.0);
}

std::vector<double> to_doubles(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

double load_entropy(const at::Tensor& shares) {
  double h = 0;
  for (double p : to_doubles(shares))
    if (p > 0) h -= p * std::log(p);
  return h;
}

nlohmann::json routed_layer_json(const std::string& name, int64_t block, int64_t shared, int64_t pool, int64_t topk,
                                 const at::Tensor& counts) {
  const at::Tensor overall = row_shares(counts.sum(0));
  const double h = load_entropy(overall);
  return {{"name", name},
          {"block", block},
          {"shared", shared},
          {"routed_pool", pool},
          {"topk", topk},
          {"selections", counts.sum().item<double>()},
          {"overall", to_doubles(overall)},
          {"entropy", h},
          {"entropy_share", pool > 1 ? h / std::log(static_cast<double>(pool)) : 1.0}};
}

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
    for (int64_t c = 0; c < classes_; ++c) per_class.push_back(to_doubles(shares[c]));
    nlohmann::json layer = routed_layer_json(l.name, l.block, l.shared, l.pool, l.topk, l.counts);
    layer["stage"] = l.stage;
    layer["per_class"] = per_class;
    layers.push_back(layer);
  }
  return {{"layers", layers},
          {"note",
           "shares of the routed heads' selections (each row sums to 1); shared heads are always on; "
           "entropy of the overall load in nats, entropy_share = entropy / ln E"}};
}

bool HeadLoadStats::write_png(const std::string& path, const std::vector<std::string>& class_names) const {
  std::vector<HeadLoadPanel> panels;
  for (const Layer& l : layers_) {
    if (l.pool == 0) continue;
    HeadLoadPanel p{
        l.name + " (top-" + std::to_string(l.topk) + " of " + std::to_string(l.pool) + ")", {}, row_shares(l.counts)};
    for (int64_t c = 0; c < classes_; ++c)
      p.row_labels.push_back(static_cast<size_t>(c) < class_names.size() ? class_names[static_cast<size_t>(c)]
                                                                         : std::to_string(c));
    panels.push_back(std::move(p));
  }
  return write_head_load_png(path, "share of a class's routed picks per head,", panels);
}

#ifdef MOH_WITH_OPENCV
namespace {

void text(cv::Mat& img, const std::string& s, int x, int y, double size = 0.33) {
  cv::putText(img, s, cv::Point(x, y), cv::FONT_HERSHEY_SIMPLEX, size, cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
}

// One panel: labelled rows × routed heads, colour 0 … 2/E (twice the uniform share) so balanced layers look even.
cv::Mat draw_panel(const HeadLoadPanel& p) {
  constexpr int kCell = 18, kTitle = 18, kLabel = 92, kMinPanelWidth = 230, kAxis = 16;
  const auto rows = static_cast<int>(p.shares.size(0)), pool = static_cast<int>(p.shares.size(1));
  const at::Tensor scaled = (p.shares.to(at::kDouble) * (pool / 2.0)).clamp(0.0, 1.0).contiguous();
  const at::Tensor empty = (p.shares.sum(1) == 0).contiguous();  // rows without selections: grey, not "0"
  cv::Mat grey(rows, pool, CV_8UC1);
  for (int r = 0; r < rows; ++r)
    for (int e = 0; e < pool; ++e)
      grey.at<uchar>(r, e) = static_cast<uchar>(scaled.data_ptr<double>()[r * pool + e] * 255.0);
  cv::Mat big, colour;
  cv::resize(grey, big, cv::Size(), kCell, kCell, cv::INTER_NEAREST);
  cv::applyColorMap(big, colour, cv::COLORMAP_VIRIDIS);
  for (int r = 0; r < rows; ++r)
    if (empty.data_ptr<bool>()[r]) colour(cv::Rect(0, r * kCell, colour.cols, kCell)).setTo(cv::Scalar(215, 215, 215));
  cv::Mat panel(colour.rows + kTitle + kAxis, std::max(colour.cols + kLabel, kMinPanelWidth), CV_8UC3,
                cv::Scalar(255, 255, 255));
  colour.copyTo(panel(cv::Rect(kLabel, kTitle, colour.cols, colour.rows)));
  // Head-index axis: the routed head e (0-based within the layer's routed pool), every head or every 2nd/4th.
  const int every = pool <= 12 ? 1 : pool <= 24 ? 2 : 4;
  for (int e = 0; e < pool; e += every)
    text(panel, std::to_string(e), kLabel + e * kCell + 3, kTitle + colour.rows + kAxis - 4, 0.3);
  text(panel, "head", 2, kTitle + colour.rows + kAxis - 4);
  text(panel, p.title, 2, kTitle - 5, 0.4);
  for (int r = 0; r < rows && static_cast<size_t>(r) < p.row_labels.size(); ++r)
    text(panel, p.row_labels[static_cast<size_t>(r)].substr(0, 13), 2, kTitle + r * kCell + kCell - 5);
  return panel;
}

}  // namespace
#endif

bool write_head_load_png(const std::string& path, const std::string& caption,
                         const std::vector<HeadLoadPanel>& panels) {
#ifdef MOH_WITH_OPENCV
  if (panels.empty()) return false;
  // Colour bar on top: one scale for every panel, in multiples of the uniform share 1/E of a layer's routed pool.
  // Panels in a grid of up to 4 columns (a DiT-XL has 28 layers).
  constexpr int kGap = 12, kBarW = 200, kBarH = 10, kBarBlock = 68, kBarY = kGap + 28, kColumns = 4;
  std::vector<cv::Mat> drawn;
  int cell_w = 0, cell_h = 0;
  for (const auto& p : panels) {
    drawn.push_back(draw_panel(p));
    cell_w = std::max(cell_w, drawn.back().cols), cell_h = std::max(cell_h, drawn.back().rows);
  }
  const int cols = std::min<int>(kColumns, static_cast<int>(drawn.size()));
  const int grid_rows = (static_cast<int>(drawn.size()) + cols - 1) / cols;
  const int width = std::max(320, cols * (cell_w + kGap)), height = kGap + kBarBlock + grid_rows * (cell_h + kGap);
  cv::Mat canvas(height, width + kGap, CV_8UC3, cv::Scalar(255, 255, 255));
  text(canvas, caption, kGap, kGap + 8, 0.36);
  text(canvas, "relative to uniform 1/E (one scale for all)", kGap, kGap + 22, 0.36);
  cv::Mat ramp(1, kBarW, CV_8UC1);
  for (int i = 0; i < kBarW; ++i) ramp.at<uchar>(0, i) = static_cast<uchar>(i * 255 / (kBarW - 1));
  cv::Mat ramp_big, ramp_colour;
  cv::resize(ramp, ramp_big, cv::Size(kBarW, kBarH), 0, 0, cv::INTER_NEAREST);
  cv::applyColorMap(ramp_big, ramp_colour, cv::COLORMAP_VIRIDIS);
  ramp_colour.copyTo(canvas(cv::Rect(kGap, kBarY, kBarW, kBarH)));
  text(canvas, "0", kGap, kBarY + kBarH + 13);
  text(canvas, "1x (uniform)", kGap + kBarW / 2 - 20, kBarY + kBarH + 13);
  text(canvas, ">=2x", kGap + kBarW - 15, kBarY + kBarH + 13);
  text(canvas, "grey: no selections", kGap + kBarW + 40, kBarY + kBarH + 13);
  for (size_t i = 0; i < drawn.size(); ++i) {
    const int x = kGap + static_cast<int>(i % static_cast<size_t>(cols)) * (cell_w + kGap);
    const int y = kGap + kBarBlock + static_cast<int>(i / static_cast<size_t>(cols)) * (cell_h + kGap);
    drawn[i].copyTo(canvas(cv::Rect(x, y, drawn[i].cols, drawn[i].rows)));
  }
  std::vector<uchar> png;
  cv::imencode(".png", canvas, png);
  write_file_atomic(path, std::string(png.begin(), png.end()));
  return true;
#else
  (void)path, (void)caption, (void)panels;
  return false;
#endif
}

namespace {

// (name, overall shares) of every layer of one head_load.json; UserError when it has none.
std::vector<std::pair<std::string, std::vector<double>>> layer_loads(const std::string& label,
                                                                     const nlohmann::json& j) {
  std::vector<std::pair<std::string, std::vector<double>>> out;
  if (j.is_object() && j.contains("layers") && j["layers"].is_array())
    for (const auto& l : j["layers"])
      if (l.is_object() && l.contains("overall") && l["overall"].is_array() && !l["overall"].empty())
        out.emplace_back(l.value("name", std::string("layer")), l["overall"].get<std::vector<double>>());
  if (out.empty())
    throw UserError("head load " + label, "has no layer with an \"overall\" load",
                    "give the head_load.json of moh eval --out or moh sample --head-load");
  return out;
}

}  // namespace

HeadLoadComparison compare_head_loads(const std::vector<std::pair<std::string, nlohmann::json>>& inputs) {
  std::vector<std::vector<std::pair<std::string, std::vector<double>>>> loads;
  for (const auto& [label, j] : inputs) loads.push_back(layer_loads(label, j));
  HeadLoadComparison c;
  std::ostringstream md;
  md << "| layer |";
  for (const auto& in : inputs) md << " " << in.first << ": entropy / ln E | weakest head × E |";
  md << "\n|---|";
  for (size_t i = 0; i < inputs.size() * 2; ++i) md << "---:|";
  md << "\n";
  for (size_t l = 0; l < loads[0].size(); ++l) {
    const auto& [name, first] = loads[0][l];
    HeadLoadPanel panel{
        name, {}, at::zeros({static_cast<int64_t>(inputs.size()), static_cast<int64_t>(first.size())}, at::kDouble)};
    md << "| " << name << " |";
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (loads[i].size() != loads[0].size() || loads[i][l].first != name || loads[i][l].second.size() != first.size())
        throw UserError("head load " + inputs[i].first,
                        "layer " + std::to_string(l) + " differs from " + inputs[0].first + "'s (" + name + ", " +
                            std::to_string(first.size()) + " routed heads)",
                        "compare evaluations of the same model");
      const at::Tensor shares = at::tensor(loads[i][l].second, at::kDouble);
      panel.row_labels.push_back(inputs[i].first);
      panel.shares[static_cast<int64_t>(i)].copy_(shares);
      const double E = static_cast<double>(first.size());
      char cell[64];
      std::snprintf(cell, sizeof cell, " %.4f | %.2f |", E > 1 ? load_entropy(shares) / std::log(E) : 1.0,
                    shares.min().item<double>() * E);
      md << cell;
    }
    md << "\n";
    c.panels.push_back(std::move(panel));
  }
  c.markdown = md.str();
  return c;
}

}  // namespace moh::vision

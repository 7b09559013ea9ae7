#include "eval/line_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/atomic_io.h"

#ifdef MOH_WITH_OPENCV
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace moh::eval {

std::vector<double> nice_ticks(double lo, double hi, int count) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, count - 1), mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag, step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return t;
}

#ifdef MOH_WITH_OPENCV
namespace {

// Tableau-like colours (BGR), distinguishable on white.
const std::vector<cv::Scalar>& palette() {
  static const std::vector<cv::Scalar> p{{180, 119, 31},  {14, 127, 255}, {44, 160, 44},   {40, 39, 214},
                                         {189, 103, 148}, {75, 86, 140},  {194, 119, 227}, {127, 127, 127}};
  return p;
}

std::string tick_text(double v) {
  char buf[32];
  const double a = std::fabs(v);
  if (a != 0 && (a < 1e-3 || a >= 1e5))
    std::snprintf(buf, sizeof buf, "%.0e", v);
  else
    std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void text(cv::Mat& m, const std::string& s, int x, int y, double scale = 0.4) {
  cv::putText(m, s, cv::Point(x, y), cv::FONT_HERSHEY_SIMPLEX, scale, cv::Scalar::all(0), 1, cv::LINE_AA);
}

cv::Mat draw_panel(const ChartPanel& p) {
  constexpr int kW = 720, kH = 300, kLeft = 78, kRight = 170, kTop = 28, kBottom = 46;
  cv::Mat m(kH, kW, CV_8UC3, cv::Scalar::all(255));
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  auto ty = [&](double v) { return p.log_y ? std::log10(std::max(v, 1e-30)) : v; };
  for (const auto& s : p.series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i]) || (p.log_y && s.y[i] <= 0)) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, ty(s.y[i]));
      y1 = std::max(y1, ty(s.y[i]));
    }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + (y0 == 0 ? 1 : std::fabs(y0) * 0.1);
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad;
  y1 += pad;
  const int pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto px = [&](double x) { return kLeft + static_cast<int>(std::lround((x - x0) / (x1 - x0) * pw)); };
  auto py = [&](double y) { return kTop + ph - static_cast<int>(std::lround((ty(y) - y0) / (y1 - y0) * ph)); };
  text(m, p.title, kLeft, 18, 0.5);
  // Axes, grid and ticks.
  for (double v : nice_ticks(x0, x1, 6)) {
    const int x = px(v);
    cv::line(m, {x, kTop}, {x, kTop + ph}, cv::Scalar::all(235));
    text(m, tick_text(v), x - 10, kTop + ph + 16, 0.35);
  }
  const std::vector<double> yt = p.log_y ? [&] {
    std::vector<double> t;
    for (double e = std::ceil(y0); e <= y1; e += 1) t.push_back(std::pow(10.0, e));
    return t;
  }() : nice_ticks(y0, y1, 5);
  for (double v : yt) {
    const int y = py(v);
    if (y < kTop || y > kTop + ph) continue;
    cv::line(m, {kLeft, y}, {kLeft + pw, y}, cv::Scalar::all(235));
    text(m, tick_text(v), 6, y + 4, 0.35);
  }
  cv::rectangle(m, {kLeft, kTop}, {kLeft + pw, kTop + ph}, cv::Scalar::all(0));
  text(m, p.x_label, kLeft + pw / 2 - 20, kH - 10);
  cv::Mat ylab(20, 160, CV_8UC3, cv::Scalar::all(255));
  text(ylab, p.y_label, 2, 14);
  cv::rotate(ylab, ylab, cv::ROTATE_90_COUNTERCLOCKWISE);
  if (ylab.rows <= kH)
    ylab(cv::Rect(0, 0, 20, std::min(ylab.rows, ph)))
        .copyTo(m(cv::Rect(kLeft - 72 + 50, kTop, 20, std::min(ylab.rows, ph))));
  // Series and legend.
  for (size_t k = 0; k < p.series.size(); ++k) {
    const Series& s = p.series[k];
    const cv::Scalar c = palette()[k % palette().size()];
    std::vector<cv::Point> pts;
    for (size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.y[i]) && !(p.log_y && s.y[i] <= 0)) pts.emplace_back(px(s.x[i]), py(s.y[i]));
    if (pts.size() == 1) cv::circle(m, pts[0], 3, c, cv::FILLED, cv::LINE_AA);
    if (pts.size() > 1) cv::polylines(m, pts, false, c, 2, cv::LINE_AA);
    const int ly = kTop + 12 + static_cast<int>(k) * 18;
    cv::line(m, {kLeft + pw + 10, ly - 4}, {kLeft + pw + 30, ly - 4}, c, 2, cv::LINE_AA);
    text(m, s.name.substr(0, 22), kLeft + pw + 34, ly, 0.38);
  }
  return m;
}

}  // namespace
#endif

bool write_line_chart(const std::string& path, const std::vector<ChartPanel>& panels) {
#ifdef MOH_WITH_OPENCV
  std::vector<cv::Mat> drawn;
  for (const auto& p : panels) {
    bool any = false;
    for (const auto& s : p.series) any = any || !s.x.empty();
    if (any) drawn.push_back(draw_panel(p));
  }
  if (drawn.empty()) return false;
  cv::Mat all;
  cv::vconcat(drawn, all);
  std::vector<uchar> png;
  cv::imencode(".png", all, png);
  write_file_atomic(path, std::string(png.begin(), png.end()));
  return true;
#else
  (void)path, (void)panels;
  return false;
#endif
}

}  // namespace moh::eval

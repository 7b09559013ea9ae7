#include "eval/line_chart.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/io/atomic_io.h"

#ifdef MOH_WITH_OPENCV
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace moh::eval {

std::vector<double> nice_ticks(double lo, double hi, int count, double min_step) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, count - 1), mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = std::max((norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag, min_step);
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return t;
}

std::string tick_text(double v) {
  char buf[32];
  const double a = std::fabs(v);
  std::snprintf(buf, sizeof buf, a != 0 && (a < 1e-3 || a >= 1e5) ? "%.2g" : "%g", v);
  return buf;
}

namespace {

Axis linear_axis(double lo, double hi, bool integer, double pad) {
  Axis a;
  if (hi == lo) {  // one point or a constant series: in the middle of the frame, ticks around it
    const double d = integer ? 1 : lo == 0 ? 1 : std::fabs(lo) * 0.1;
    a.lo = lo - d, a.hi = hi + d;
  } else {
    a.lo = lo - (hi - lo) * pad, a.hi = hi + (hi - lo) * pad;
  }
  a.ticks = nice_ticks(a.lo, a.hi, 6, integer ? 1 : 0);
  return a;
}

double two_digits(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2g", v);
  return std::stod(b);
}

// Decades; 2 and 5 times them too when the data span one to two decades (one decade tick alone says little);
// the data's ends (two significant digits) when they span under one decade.
Axis log_axis(double lo, double hi, double pad) {
  Axis a;
  a.log = true;
  const double l0 = std::log10(lo), l1 = std::log10(hi), p = l1 > l0 ? (l1 - l0) * pad : 0.25;
  a.lo = l0 - p, a.hi = l1 + p;
  for (double e = std::ceil(a.lo - 1e-9); e <= a.hi + 1e-9; e += 1) a.ticks.push_back(std::pow(10.0, e));
  if (l1 - l0 >= 1 && a.ticks.size() < 2)
    for (double e = std::floor(a.lo); e <= a.hi; e += 1)
      for (double m : {2.0, 5.0})
        if (const double lv = e + std::log10(m); lv >= a.lo - 1e-9 && lv <= a.hi + 1e-9)
          a.ticks.push_back(m * std::pow(10.0, e));
  if (l1 - l0 < 1)
    for (double v : {lo, hi}) {
      const double r = two_digits(v), lr = std::log10(r);
      const bool near =
          std::any_of(a.ticks.begin(), a.ticks.end(), [&](double t) { return std::fabs(std::log10(t) - lr) < 0.04; });
      if (!near && lr >= a.lo && lr <= a.hi) a.ticks.push_back(r);
    }
  std::sort(a.ticks.begin(), a.ticks.end());
  return a;
}

}  // namespace

Axis make_axis(const std::vector<double>& values, bool log, bool integer, double pad, const std::string& what) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    if (log && v <= 0)
      throw UserError(what, "holds " + tick_text(v) + ", which a logarithmic axis cannot show",
                      "draw it on a linear axis or leave out the values <= 0");
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  if (lo > hi) throw UserError(what, "has no finite value to draw", "give at least one finite point");
  return log ? log_axis(lo, hi, pad) : linear_axis(lo, hi, integer, pad);
}

namespace {

struct Rgb {
  int r, g, b;
};
const Rgb kBlack{0, 0, 0}, kGrid{225, 225, 225};
// Tableau colours, distinguishable on white.
const std::array<Rgb, 8> kPalette{{{31, 119, 180},
                                   {255, 127, 14},
                                   {44, 160, 44},
                                   {214, 39, 40},
                                   {148, 103, 189},
                                   {140, 86, 75},
                                   {227, 119, 194},
                                   {127, 127, 127}}};

enum class Anchor { start, middle, end };

// Drawing in the layout's pixels; each backend renders them its way (vector, or raster at a scale).
class Canvas {
 public:
  virtual ~Canvas() = default;
  virtual void line(double x0, double y0, double x1, double y1, Rgb c, double width) = 0;
  /// `dash`: dash_pattern's on/off lengths; empty: solid.
  virtual void polyline(const std::vector<std::array<double, 2>>& pts, Rgb c, double width,
                        const std::vector<double>& dash) = 0;
  virtual void dot(double x, double y, double r, Rgb c) = 0;
  /// `size` in the units of OpenCV's Hershey simplex font scale; (x, y) is the baseline's anchor point; `vertical`
  /// text reads bottom to top.
  virtual void text(const std::string& s, double x, double y, double size, Anchor a, bool vertical = false) = 0;
};

std::string svg_escape(const std::string& s) {
  std::string o;
  for (char c : s)
    o += c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&quot;" : std::string(1, c);
  return o;
}

class SvgCanvas : public Canvas {
 public:
  SvgCanvas(int w, int h) {
    out_ << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h << "\" viewBox=\"0 0 " << w
         << ' ' << h << "\" font-family=\"Helvetica, Arial, sans-serif\">\n<rect width=\"100%\" height=\"100%\" "
         << "fill=\"white\"/>\n";
  }
  void line(double x0, double y0, double x1, double y1, Rgb c, double width) override {
    out_ << "<line x1=\"" << n(x0) << "\" y1=\"" << n(y0) << "\" x2=\"" << n(x1) << "\" y2=\"" << n(y1) << "\""
         << stroke(c, width) << "/>\n";
  }
  void polyline(const std::vector<std::array<double, 2>>& pts, Rgb c, double width,
                const std::vector<double>& dash) override {
    out_ << "<polyline fill=\"none\" stroke-linejoin=\"round\"" << stroke(c, width);
    for (size_t i = 0; i < dash.size(); ++i) out_ << (i == 0 ? " stroke-dasharray=\"" : ",") << n(dash[i]);
    out_ << (dash.empty() ? "" : "\"") << " points=\"";
    for (const auto& p : pts) out_ << n(p[0]) << ',' << n(p[1]) << ' ';
    out_ << "\"/>\n";
  }
  void dot(double x, double y, double r, Rgb c) override {
    out_ << "<circle cx=\"" << n(x) << "\" cy=\"" << n(y) << "\" r=\"" << n(r) << "\" fill=\"" << hex(c) << "\"/>\n";
  }
  void text(const std::string& s, double x, double y, double size, Anchor a, bool vertical) override {
    out_ << "<text x=\"" << n(x) << "\" y=\"" << n(y) << "\" font-size=\"" << n(size * 30) << "\"";
    if (a != Anchor::start) out_ << " text-anchor=\"" << (a == Anchor::middle ? "middle" : "end") << "\"";
    if (vertical) out_ << " transform=\"rotate(-90 " << n(x) << ' ' << n(y) << ")\"";
    out_ << '>' << svg_escape(s) << "</text>\n";
  }
  std::string finish() { return out_.str() + "</svg>\n"; }

 private:
  static std::string n(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f", v);
    return b;
  }
  static std::string hex(Rgb c) {
    char b[8];
    std::snprintf(b, sizeof b, "#%02x%02x%02x", c.r, c.g, c.b);
    return b;
  }
  static std::string stroke(Rgb c, double w) { return " stroke=\"" + hex(c) + "\" stroke-width=\"" + n(w) + "\""; }
  std::ostringstream out_;
};

#ifdef MOH_WITH_OPENCV
class RasterCanvas : public Canvas {
 public:
  RasterCanvas(int w, int h, double scale)
      : m_(static_cast<int>(std::lround(h * scale)), static_cast<int>(std::lround(w * scale)), CV_8UC3,
           cv::Scalar::all(255)),
        s_(scale) {}
  void line(double x0, double y0, double x1, double y1, Rgb c, double width) override {
    cv::line(m_, pt(x0, y0), pt(x1, y1), bgr(c), thick(width), cv::LINE_AA);
  }
  void polyline(const std::vector<std::array<double, 2>>& pts, Rgb c, double width,
                const std::vector<double>& dash) override {
    for (const auto& piece : dash_pieces(pts, dash)) {
      std::vector<cv::Point> p;
      for (const auto& q : piece) p.push_back(pt(q[0], q[1]));
      cv::polylines(m_, p, false, bgr(c), thick(width), cv::LINE_AA);
    }
  }
  void dot(double x, double y, double r, Rgb c) override {
    cv::circle(m_, pt(x, y), thick(r), bgr(c), cv::FILLED, cv::LINE_AA);
  }
  void text(const std::string& s, double x, double y, double size, Anchor a, bool vertical) override;
  std::string png() const {
    std::vector<uchar> buf;
    cv::imencode(".png", m_, buf);
    return std::string(buf.begin(), buf.end());
  }

 private:
  cv::Point pt(double x, double y) const {
    return {static_cast<int>(std::lround(x * s_)), static_cast<int>(std::lround(y * s_))};
  }
  int thick(double w) const { return std::max(1, static_cast<int>(std::lround(w * s_))); }
  static cv::Scalar bgr(Rgb c) { return cv::Scalar(c.b, c.g, c.r); }
  cv::Mat m_;
  double s_;
};

void RasterCanvas::text(const std::string& utf8, double x, double y, double size, Anchor a, bool vertical) {
  const std::string s = raster_text(utf8);
  const int font = cv::FONT_HERSHEY_SIMPLEX, th = thick(size > 0.45 ? 1.0 : 0.6);
  int base = 0;
  const cv::Size ts = cv::getTextSize(s, font, size * s_, th, &base);
  const int shift = a == Anchor::start ? 0 : a == Anchor::middle ? ts.width / 2 : ts.width;
  const cv::Point p = pt(x, y);
  if (!vertical) {
    cv::putText(m_, s, {p.x - shift, p.y}, font, size * s_, cv::Scalar::all(0), th, cv::LINE_AA);
    return;
  }
  cv::Mat t(ts.height + base + 2, ts.width + 2, CV_8UC3, cv::Scalar::all(255));
  cv::putText(t, s, {1, ts.height + 1}, font, size * s_, cv::Scalar::all(0), th, cv::LINE_AA);
  cv::rotate(t, t, cv::ROTATE_90_COUNTERCLOCKWISE);  // the baseline becomes column ts.height + 1, text upwards
  cv::Rect dst(p.x - ts.height - 1, p.y - t.rows + shift, t.cols, t.rows);
  const cv::Rect inside = dst & cv::Rect(0, 0, m_.cols, m_.rows);
  if (inside.area() > 0) t(inside - dst.tl()).copyTo(m_(inside));
}
#endif

// Layout in pixels (the SVG's size; the PNG is kPngScale times larger).
constexpr int kW = 760, kHeader = 34, kPanelH = 300, kLeft = 84, kRight = 180, kTop = 30, kBottom = 46;
constexpr double kPngScale = 2.0;

bool has_point(const ChartPanel& p) {
  for (const auto& s : p.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) return true;
  return false;
}

// The finite points of a series ((x, y) pairs; on a log axis those with y <= 0 too, so that the axis refuses them).
std::vector<std::array<double, 2>> finite_points(const Series& s) {
  std::vector<std::array<double, 2>> pts;
  for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
    if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) pts.push_back({s.x[i], s.y[i]});
  return pts;
}

void draw_axes(Canvas& c, const ChartPanel& p, const Axis& ax, const Axis& ay, double top) {
  const double pw = kW - kLeft - kRight, ph = kPanelH - kTop - kBottom, y_end = top + kTop + ph;
  for (double v : ax.ticks) {
    const double x = kLeft + ((ax.log ? std::log10(v) : v) - ax.lo) / (ax.hi - ax.lo) * pw;
    c.line(x, top + kTop, x, y_end, kGrid, 0.6);
    c.text(tick_text(v), x, y_end + 16, 0.36, Anchor::middle);
  }
  for (double v : ay.ticks) {
    const double y = y_end - ((ay.log ? std::log10(v) : v) - ay.lo) / (ay.hi - ay.lo) * ph;
    c.line(kLeft, y, kLeft + pw, y, kGrid, 0.6);
    c.text(tick_text(v), kLeft - 6, y + 4, 0.36, Anchor::end);
  }
  for (const auto& [x0, y0, x1, y1] : std::vector<std::array<double, 4>>{{kLeft, top + kTop, kLeft + pw, top + kTop},
                                                                         {kLeft, y_end, kLeft + pw, y_end},
                                                                         {kLeft, top + kTop, kLeft, y_end},
                                                                         {kLeft + pw, top + kTop, kLeft + pw, y_end}})
    c.line(x0, y0, x1, y1, kBlack, 1);
  c.text(p.title, kLeft, top + 20, 0.46, Anchor::start);
  c.text(p.x_label, kLeft + pw / 2, top + kPanelH - 10, 0.4, Anchor::middle);
  c.text(p.y_label, 20, top + kTop + ph / 2, 0.4, Anchor::middle, true);
}

// A series that holds one value (a constant learning rate) gets a labelled tick at its level, unless one is near.
void mark_constant_levels(Axis& a, const ChartPanel& p) {
  const auto pos = [&](double v) { return a.log ? std::log10(v) : v; };
  for (const auto& s : p.series) {
    const auto pts = finite_points(s);
    if (pts.size() < 2 || std::any_of(pts.begin(), pts.end(), [&](const auto& q) { return q[1] != pts[0][1]; }))
      continue;
    const double v = pts[0][1];
    const bool near = std::any_of(a.ticks.begin(), a.ticks.end(),
                                  [&](double t) { return std::fabs(pos(t) - pos(v)) < 0.04 * (a.hi - a.lo); });
    if (!near) a.ticks.push_back(v);
  }
  std::sort(a.ticks.begin(), a.ticks.end());
}

void draw_panel(Canvas& c, const ChartPanel& p, double top) {
  std::vector<double> xs, ys;
  for (const auto& s : p.series)
    for (const auto& q : finite_points(s)) xs.push_back(q[0]), ys.push_back(q[1]);
  const Axis ax = make_axis(xs, p.log_x, p.integer_x, 0, "x axis of panel '" + p.title + "'");
  Axis ay = make_axis(ys, p.log_y, false, 0.05, "y axis of panel '" + p.title + "'");
  mark_constant_levels(ay, p);
  draw_axes(c, p, ax, ay, top);
  const double pw = kW - kLeft - kRight, ph = kPanelH - kTop - kBottom, y_end = top + kTop + ph;
  size_t legend_row = 0;
  for (size_t k = 0; k < p.series.size(); ++k) {
    const Series& s = p.series[k];
    const size_t index = s.colour >= 0 ? static_cast<size_t>(s.colour) : k;
    const Rgb col = kPalette[index % kPalette.size()];
    const std::vector<double> dash = dash_pattern(s.style >= 0 ? s.style : static_cast<int>(index / kPalette.size()));
    std::vector<std::array<double, 2>> pts = finite_points(s);
    for (auto& q : pts)
      q = {kLeft + ((ax.log ? std::log10(q[0]) : q[0]) - ax.lo) / (ax.hi - ax.lo) * pw,
           y_end - ((ay.log ? std::log10(q[1]) : q[1]) - ay.lo) / (ay.hi - ay.lo) * ph};
    if (pts.size() > 1 && !s.dots_only) c.polyline(pts, col, 1.6, dash);
    if (pts.size() <= 12 || s.dots_only)  // few points (evaluations) or a cloud: each one visible
      for (const auto& q : pts) c.dot(q[0], q[1], 2.6, col);
    if (s.name.empty()) continue;  // drawn without a legend row (the points of a line already named)
    const double ly = top + kTop + 12 + static_cast<double>(legend_row++) * 18;
    if (s.dots_only)
      c.dot(kLeft + pw + 20, ly - 4, 2.6, col);
    else
      c.polyline({{kLeft + pw + 8, ly - 4}, {kLeft + pw + 30, ly - 4}}, col, 2, dash);
    c.text(s.name.substr(0, 24), kLeft + pw + 34, ly, 0.36, Anchor::start);
  }
}

void draw_figure(Canvas& c, const std::string& title, const std::vector<const ChartPanel*>& panels) {
  c.text(title, kLeft, 23, 0.55, Anchor::start);
  for (size_t i = 0; i < panels.size(); ++i) draw_panel(c, *panels[i], kHeader + static_cast<double>(i) * kPanelH);
}

}  // namespace

std::vector<double> dash_pattern(int style) {
  if (style % 3 == 1) return {7, 4};
  if (style % 3 == 2) return {2, 3};
  return {};
}

std::vector<std::vector<std::array<double, 2>>> dash_pieces(const std::vector<std::array<double, 2>>& pts,
                                                            const std::vector<double>& pattern) {
  if (pattern.empty() || pts.size() < 2) return {pts};
  std::vector<std::vector<std::array<double, 2>>> out;
  std::vector<std::array<double, 2>> cur{pts[0]};
  size_t k = 0;
  double left = pattern[0];  // length left in the pattern's current entry
  for (size_t i = 1; i < pts.size(); ++i) {
    const auto &a = pts[i - 1], &b = pts[i];
    const double len = std::hypot(b[0] - a[0], b[1] - a[1]);
    double done = 0;
    while (len - done > left) {  // the entry ends inside this segment
      done += left;
      const std::array<double, 2> p{a[0] + (b[0] - a[0]) * done / len, a[1] + (b[1] - a[1]) * done / len};
      if (k % 2 == 0)
        cur.push_back(p), out.push_back(cur), cur.clear();
      else
        cur = {p};
      k = (k + 1) % pattern.size(), left = pattern[k];
    }
    left -= len - done;
    if (k % 2 == 0) cur.push_back(b);
  }
  if (k % 2 == 0 && cur.size() > 1) out.push_back(cur);
  return out;
}

Series running_best(const std::string& name, std::vector<double> x, std::vector<double> y) {
  std::vector<std::pair<double, double>> pts;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i)
    if (std::isfinite(x[i]) && std::isfinite(y[i])) pts.emplace_back(x[i], y[i]);
  std::sort(pts.begin(), pts.end());  // equal x: the lower y first, so it is the one kept
  Series best{name, {}, {}};
  for (const auto& [px, py] : pts)
    if (best.y.empty() || py < best.y.back()) best.x.push_back(px), best.y.push_back(py);
  return best;
}

std::string raster_text(const std::string& text) {
  static const std::pair<const char*, const char*> kAscii[] = {
      {"\u00d7", "x"},  {"\u03c3", "sigma"}, {"\u03b3", "gamma"}, {"\u03b2", "beta"}, {"\u2013", "-"},
      {"\u2014", "-"},  {"\u2212", "-"},     {"\u2264", "<="},    {"\u2265", ">="},   {"\u00b1", "+/-"},
      {"\u2192", "->"}, {"\u2026", "..."},   {"\u00b2", "^2"},    {"\u00b5", "u"},    {"\u2248", "~"}};
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out += text[i++];
      continue;
    }
    size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;  // one UTF-8 character
    len = std::min(len, text.size() - i);
    const std::string ch = text.substr(i, len);
    const auto* hit = std::find_if(std::begin(kAscii), std::end(kAscii), [&](const auto& p) { return ch == p.first; });
    out += hit != std::end(kAscii) ? hit->second : "?";
    i += len;
  }
  return out;
}

ChartFiles write_line_chart(const std::string& base, const std::string& title, const std::vector<ChartPanel>& panels) {
  std::vector<const ChartPanel*> drawn;
  for (const auto& p : panels)
    if (has_point(p)) drawn.push_back(&p);
  ChartFiles files;
  if (drawn.empty()) return files;
  const int h = kHeader + kPanelH * static_cast<int>(drawn.size());
  SvgCanvas svg(kW, h);
  draw_figure(svg, title, drawn);  // throws for a log axis with a value <= 0, before any file is written
#ifdef MOH_WITH_OPENCV
  RasterCanvas png(kW, h, kPngScale);
  draw_figure(png, title, drawn);
  files.png = base + ".png";
  write_file_atomic(files.png, png.png());
#endif
  files.svg = base + ".svg";
  write_file_atomic(files.svg, svg.finish());
  return files;
}

}  // namespace moh::eval

#pragma once
// Line charts for papers: a figure title naming what is drawn, then one or more panels stacked vertically, each with a
// title, labelled axes and several named series in distinct colours with a legend. Written twice from one layout: an
// SVG (vector, any build) and a PNG at twice the layout's pixel size (OpenCV builds only). Used by `moh plot`.
#include <array>
#include <string>
#include <vector>

namespace moh::eval {

/// One curve, or a cloud of points.
struct Series {
  std::string name;  ///< legend text (e.g. the run's directory name); empty: no legend row
  std::vector<double> x, y;
  bool dots_only = false;  ///< points without a connecting line (settings that are not a sequence)
  int colour = -1;         ///< palette index; -1: the series' position (pin it to pair a line with its points)
  int style = -1;          ///< line style (0 solid, 1 dashed, 2 dotted); -1: from the palette index (see dash_pattern)
};

/// The 8 palette colours repeat beyond 8 series: palette index k draws colour k % 8 with line style k / 8 (unless the
/// series pins its style), so a chart of up to 24 series keeps every line distinct. The dash pattern of line style
/// `style` (mod 3: solid, dashed, dotted) in layout pixels (on, off, on, off, …); empty: solid.
std::vector<double> dash_pattern(int style);

/// `pts` (a polyline) cut into its drawn pieces under `pattern` (dash_pattern): the pattern runs along the arc
/// length across vertices, as an SVG stroke-dasharray does. An empty pattern gives the polyline itself.
std::vector<std::vector<std::array<double, 2>>> dash_pieces(const std::vector<std::array<double, 2>>& pts,
                                                            const std::vector<double>& pattern);

/// One panel of a chart.
struct ChartPanel {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool log_y = false;      ///< logarithmic y axis (learning rates); every y value must then be > 0
  bool integer_x = false;  ///< x counts something (optimizer steps, evaluations): integer ticks only
  bool log_x = false;      ///< logarithmic x axis (network evaluations from 10 to 500); every x must then be > 0
};

/// The best y reached at each x or less: the points of (x, y) in x order whose y is below every earlier one (FID
/// against cost: the cheapest setting for each level of quality). A line named `name`.
Series running_best(const std::string& name, std::vector<double> x, std::vector<double> y);

/// A value axis: the drawn range [lo, hi] (log10 of the values on a log axis) and the values that get a labelled tick.
struct Axis {
  double lo = 0, hi = 1;
  std::vector<double> ticks;  ///< values (not their logarithms), inside the range
  bool log = false;
};

/// The axis for the finite `values` of one panel direction (at least one):
///  - linear: round ticks (1, 2 or 5 × 10^k; whole numbers only when `integer`), the data padded by `pad` of its span;
///    a single value (one point, a constant series) sits in the middle of the frame with ticks around it;
///  - log: a labelled tick at every decade inside the range, and at the data's ends when they span under a decade;
///    a value <= 0 is a UserError naming `what` (a log scale has no place for it).
Axis make_axis(const std::vector<double>& values, bool log, bool integer, double pad, const std::string& what);

/// Round tick values covering [lo, hi] (about `count` of them: steps of 1, 2 or 5 × 10^k, at least `min_step`).
std::vector<double> nice_ticks(double lo, double hi, int count = 5, double min_step = 0);

/// The text of a tick label ("0.001", "2.5e-05", "1200").
std::string tick_text(double v);

/// `text` as the raster (PNG) font can draw it: its Hershey glyphs cover ASCII only, so the symbols the charts'
/// titles use become ASCII ("×" → "x", "σ" → "sigma", "–" → "-", "≤" → "<=", …) and any other non-ASCII character
/// "?" once (not one "?" per byte). The SVG keeps the text as written.
std::string raster_text(const std::string& text);

/// What write_line_chart wrote.
struct ChartFiles {
  std::string svg, png;  ///< paths; png empty when built without OpenCV; both empty when no panel had a point
};

/// Writes the panels that have at least one point under `title` as `base`.svg and `base`.png (`base` without an
/// extension; files replaced atomically). Throws UserError for a log panel with a value <= 0.
ChartFiles write_line_chart(const std::string& base, const std::string& title, const std::vector<ChartPanel>& panels);

}  // namespace moh::eval

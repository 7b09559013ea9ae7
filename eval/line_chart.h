#pragma once
// Line charts as PNG (OpenCV drawing): one or more panels stacked vertically, each with a title, labelled axes with
// round-number ticks, and several named series in distinct colours with a legend. Used by `moh plot` for loss / lr /
// accuracy curves of one or several runs.
#include <string>
#include <vector>

namespace moh::eval {

/// One curve.
struct Series {
  std::string name;  ///< legend text (e.g. the run's directory name)
  std::vector<double> x, y;
};

/// One panel of a chart.
struct ChartPanel {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool log_y = false;  ///< logarithmic y axis (learning rates)
};

/// Writes the panels (those with at least one point) as one PNG; false when built without OpenCV or nothing to draw.
bool write_line_chart(const std::string& path, const std::vector<ChartPanel>& panels);

/// Round tick values covering [lo, hi] (about `count` of them: steps of 1, 2 or 5 × 10^k).
std::vector<double> nice_ticks(double lo, double hi, int count = 5);

}  // namespace moh::eval

// The axis rules of the charts `moh plot` draws (one point, constant series, decades on log axes, integer steps,
// zeros refused on log axes) and what write_line_chart writes (SVG always, PNG at twice the layout in OpenCV builds).
#include "core/error.h"
#include "eval/line_chart.h"
#include "tests/test_util.h"

namespace moh::eval {
namespace {

bool inside_frame(const Axis& a, double v) {
  const double t = a.log ? std::log10(v) : v;
  return t > a.lo && t < a.hi;
}

TEST(ChartAxis, OnePointOnAStepAxisSitsInTheMiddleWithIntegerTicks) {
  const Axis a = make_axis({200}, false, true, 0, "x");
  EXPECT_DOUBLE_EQ(a.lo, 199);
  EXPECT_DOUBLE_EQ(a.hi, 201);
  EXPECT_EQ(a.ticks, (std::vector<double>{199, 200, 201}));
}

TEST(ChartAxis, OnePointOrConstantValueIsInsideTheFrameAmongTicks) {
  for (double v : {85.3, -2.0, 0.0, 1e-4}) {
    const Axis a = make_axis({v, v, v}, false, false, 0.05, "y");
    EXPECT_TRUE(inside_frame(a, v)) << v;
    EXPECT_NEAR((a.lo + a.hi) / 2, v, 1e-12) << v;
    ASSERT_GE(a.ticks.size(), 2u) << v;
    EXPECT_LE(a.ticks.front(), v) << v;  // a labelled tick on each side of the point
    EXPECT_GE(a.ticks.back(), v) << v;
  }
}

TEST(ChartAxis, WideStepAxesGetWholeNumberTicksAndPaddedDataStaysInside) {
  const Axis a = make_axis({0, 7}, false, true, 0, "x");
  for (double t : a.ticks) EXPECT_EQ(t, std::round(t)) << t;
  EXPECT_EQ(a.ticks.front(), 0);
  EXPECT_EQ(a.ticks.back(), 7);
  const Axis y = make_axis({0.31, 0.93, 0.5}, false, false, 0.05, "y");
  EXPECT_TRUE(inside_frame(y, 0.31) && inside_frame(y, 0.93));
  EXPECT_NEAR(y.hi - y.lo, 0.62 * 1.1, 1e-12);
}

TEST(ChartAxis, LogAxisLabelsEveryDecade) {
  const Axis a = make_axis({1e-5, 3e-4, 1e-3}, true, false, 0.05, "lr");
  ASSERT_EQ(a.ticks.size(), 3u);
  EXPECT_NEAR(a.ticks[0], 1e-5, 1e-20);
  EXPECT_NEAR(a.ticks[1], 1e-4, 1e-19);
  EXPECT_NEAR(a.ticks[2], 1e-3, 1e-18);
  EXPECT_EQ(tick_text(a.ticks[0]), "1e-05");
  EXPECT_EQ(tick_text(a.ticks[2]), "0.001");
}

TEST(ChartAxis, LogAxisUnderADecadeLabelsItsEnds) {
  const Axis a = make_axis({2.5e-4, 6e-4, 8e-4}, true, false, 0.05, "lr");  // no decade inside
  ASSERT_EQ(a.ticks.size(), 2u);
  EXPECT_NEAR(a.ticks[0], 2.5e-4, 1e-18);
  EXPECT_NEAR(a.ticks[1], 8e-4, 1e-18);
  const Axis c = make_axis({3e-4, 3e-4}, true, false, 0.05, "lr");  // a constant learning rate: labelled
  ASSERT_EQ(c.ticks.size(), 1u);
  EXPECT_NEAR(c.ticks[0], 3e-4, 1e-18);
  EXPECT_TRUE(inside_frame(c, 3e-4));
  const Axis d = make_axis({1e-3, 5e-4}, true, false, 0.05, "lr");  // one decade inside, one end added
  EXPECT_EQ(d.ticks.size(), 2u);
}

TEST(ChartAxis, LogAxisRefusesZeroAndNegativeValuesClearly) {
  try {
    make_axis({1e-3, 0.0}, true, false, 0.05, "y axis of panel 'learning rate'");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("learning rate"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("logarithmic axis cannot show"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_axis({-1.0}, true, false, 0.05, "y"), UserError);
  EXPECT_NO_THROW(make_axis({-1.0, 0.0}, false, false, 0.05, "y"));
  EXPECT_THROW(make_axis({std::nan("")}, false, false, 0.05, "y"), UserError);
}

TEST(LineChart, WritesTitledSvgAndTwiceSizedPngOrNothing) {
  test::TempDir dir;
  ChartPanel p{"loss", "optimizer step", "loss", {{"run <a>", {0, 1, 2}, {3, 2, 1}}}, false, true};
  const ChartFiles f = write_line_chart(dir.file("c"), "Training curves: run <a>", {p, ChartPanel{}});
  ASSERT_EQ(f.svg, dir.file("c.svg"));
  std::ifstream in(f.svg);
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(svg.find("Training curves: run &lt;a&gt;"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("height=\"334\""), std::string::npos);  // header + one panel: the empty one is left out
#ifdef MOH_WITH_OPENCV
  ASSERT_EQ(f.png, dir.file("c.png"));
  std::ifstream png(f.png, std::ios::binary);
  unsigned char h[24] = {};
  png.read(reinterpret_cast<char*>(h), 24);
  const uint32_t w = (h[16] << 24) | (h[17] << 16) | (h[18] << 8) | h[19];
  EXPECT_EQ(w, 1520u);  // 2 × the 760-pixel layout
#else
  EXPECT_TRUE(f.png.empty());
#endif
  EXPECT_TRUE(write_line_chart(dir.file("none"), "t", {ChartPanel{}}).svg.empty());
  p.log_y = true;
  p.series[0].y = {1, 0, 2};
  EXPECT_THROW(write_line_chart(dir.file("log"), "t", {p}), UserError);
  EXPECT_FALSE(std::filesystem::exists(dir.file("log.svg")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("log.png")));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(LineChart, ConstantSeriesGetsALabelledLevelOnALogAxis) {
  test::TempDir dir;
  ChartPanel lr{"learning rate", "optimizer step", "lr", {}, true, true};
  lr.series = {{"cosine", {0, 1, 2}, {2e-3, 1e-4, 1e-5}}, {"constant", {0, 1, 2}, {5e-4, 5e-4, 5e-4}}};
  const std::string svg = read_text(write_line_chart(dir.file("lr"), "lr", {lr}).svg);
  EXPECT_NE(svg.find(">1e-05<"), std::string::npos);  // the decades
  EXPECT_NE(svg.find(">0.001<"), std::string::npos);
  EXPECT_NE(svg.find(">0.0005<"), std::string::npos);  // the constant run's level
  lr.series.pop_back();
  EXPECT_EQ(read_text(write_line_chart(dir.file("lr2"), "lr", {lr}).svg).find(">0.0005<"), std::string::npos);
}

}  // namespace
}  // namespace moh::eval

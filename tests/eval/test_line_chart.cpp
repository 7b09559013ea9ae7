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

// The PNG's font draws ASCII only: the titles' symbols become ASCII, anything else one "?" per character (the
// "FID vs steps (×)" title once came out as "??").
TEST(ChartText, RasterTextIsAsciiWithTheTitlesSymbolsSpelledOut) {
  EXPECT_EQ(raster_text("FID \u00d7 steps, \u03c3_rel \u2264 0.2 \u2013 ok"), "FID x steps, sigma_rel <= 0.2 - ok");
  EXPECT_EQ(raster_text("plain ASCII 1.5e-3"), "plain ASCII 1.5e-3");
  EXPECT_EQ(raster_text("\u4e2d\u6587 \u00e9"), "?? ?");  // unknown characters: one "?" each, not one per byte
  EXPECT_EQ(raster_text("cut \xe2\x80"), "cut ?");        // a truncated sequence at the end
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

TEST(ChartAxis, LogAxisOverOneDecadeAddsTwoAndFiveTimesIt) {
  const Axis a = make_axis({17, 24, 500}, true, true, 0, "NFE");  // one decade tick (100) inside
  std::vector<double> want{20, 50, 100, 200, 500};
  ASSERT_EQ(a.ticks.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(a.ticks[i], want[i], 1e-9) << i;
  EXPECT_EQ(make_axis({1e-5, 1e-3}, true, false, 0.05, "lr").ticks.size(), 3u);  // two decades: decades only
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

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(LineChart, RunningBestKeepsTheCheapestPointOfEachLevel) {
  // (cost, fid): 24 → 50, 17 → 41, 500 → 48, 29 → 42, 22 → 42, 17 → 45 (a worse point at the same cost)
  const Series b = running_best("m", {24, 17, 500, 29, 22, 17}, {50, 41, 48, 42, 42, 45});
  EXPECT_EQ(b.name, "m");
  EXPECT_EQ(b.x, (std::vector<double>{17}));
  EXPECT_EQ(b.y, (std::vector<double>{41}));
  const Series c = running_best("m", {10, 20, 40, 80, 160}, {9, 7, 8, 5, std::nan("")});
  EXPECT_EQ(c.x, (std::vector<double>{10, 20, 80}));
  EXPECT_EQ(c.y, (std::vector<double>{9, 7, 5}));
}

TEST(LineChart, DotsOnlySeriesDrawNoLineAndUnnamedOnesNoLegendRow) {
  test::TempDir dir;
  ChartPanel p{"fid", "NFE", "FID", {}, false};  // (log x over 10 … 100: ticks 10, 20, 50, 100)
  p.log_x = true;
  p.series = {{"model a", {10, 100}, {5, 3}, false, 0}, {"", {10, 50, 100}, {5, 6, 3}, true, 0}};
  const std::string svg = read_text(write_line_chart(dir.file("f"), "t", {p}).svg);
  EXPECT_EQ(count(svg, "<polyline"), 2u);  // the named line and its legend row's stroke only
  EXPECT_EQ(count(svg, "<circle"), 5u);    // 2 points of the line + 3 of the cloud, no legend dot
  EXPECT_EQ(count(svg, ">model a<"), 1u);
  EXPECT_NE(svg.find(">10<"), std::string::npos);  // decades of the log x axis
  EXPECT_NE(svg.find(">100<"), std::string::npos);
  p.series[1].name = "cloud";
  const std::string named = read_text(write_line_chart(dir.file("g"), "t", {p}).svg);
  EXPECT_EQ(count(named, "<circle"), 6u);  // its legend row shows a dot, not a line
  p.series[1].x[0] = 0;                    // a log axis has no place for 0
  EXPECT_THROW(write_line_chart(dir.file("h"), "t", {p}), UserError);
}

// The 8 colours repeat from the 9th series on; its line style changes (dashed, then dotted from the 17th), so the
// 12-series recipe charts once drew two pairs of lines that could not be told apart.
TEST(LineChart, SeriesBeyondThePaletteKeepTheirColourButChangeTheirDash) {
  EXPECT_TRUE(dash_pattern(0).empty());
  EXPECT_EQ(dash_pattern(1), (std::vector<double>{7, 4}));
  EXPECT_EQ(dash_pattern(2), (std::vector<double>{2, 3}));
  test::TempDir dir;
  ChartPanel p{"fid", "step", "FID", {}, false, true};
  for (int k = 0; k < 8; ++k) p.series.push_back({"run " + std::to_string(k), {0, 1}, {1.0 + k, 2.0 + k}});
  EXPECT_EQ(count(read_text(write_line_chart(dir.file("a"), "t", {p}).svg), "stroke-dasharray"), 0u);
  p.series.push_back({"run 8", {0, 1}, {9, 10}});
  const std::string svg = read_text(write_line_chart(dir.file("b"), "t", {p}).svg);
  EXPECT_EQ(count(svg, "stroke-dasharray=\"7.0,4.0\""), 2u);  // its line and its legend row
  EXPECT_EQ(count(svg, "stroke=\"#1f77b4\""), 4u);            // the colour of run 0 again (2 lines, 2 legend rows)
  p.series.back().colour = 17;                                // a pinned colour index picks the style the same way
  EXPECT_EQ(count(read_text(write_line_chart(dir.file("c"), "t", {p}).svg), "stroke-dasharray=\"2.0,3.0\""), 2u);
  p.series.back().style = 0;  // a pinned style wins: solid again (a model's style beside a recipe's colour)
  EXPECT_EQ(count(read_text(write_line_chart(dir.file("d"), "t", {p}).svg), "stroke-dasharray"), 0u);
}

// The dash pattern runs along the arc length across vertices: a dash bends round a corner instead of restarting.
TEST(LineChart, DashPiecesFollowThePatternAlongTheWholePolyline) {
  using P = std::vector<std::array<double, 2>>;
  const P straight{{0, 0}, {22, 0}};
  EXPECT_EQ(dash_pieces(straight, {}), (std::vector<P>{straight}));
  EXPECT_EQ(dash_pieces(straight, {7, 4}), (std::vector<P>{{{0, 0}, {7, 0}}, {{11, 0}, {18, 0}}}));
  EXPECT_EQ(dash_pieces({{0, 0}, {5, 0}, {5, 5}}, {7, 4}), (std::vector<P>{{{0, 0}, {5, 0}, {5, 2}}}));
  EXPECT_EQ(dash_pieces({{0, 0}, {3, 0}, {3, 4}}, {2, 3}),  // 7 long: on 0-2, off 2-5, on 5-7
            (std::vector<P>{{{0, 0}, {2, 0}}, {{3, 2}, {3, 4}}}));
}

}  // namespace
}  // namespace moh::eval

// `moh ema sweep` as library code (eval/ema_sweep.h): the σ_rel ranges it accepts, that each point measures
// the reconstruction of its own σ_rel, that a second start measures only what is missing, and that the table picks
// the best point in the metric's own direction.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/safetensors.h"
#include "core/train/phema.h"
#include "core/train/phema_run.h"
#include "eval/ema_sweep.h"
#include "tests/test_util.h"

namespace moh::eval {
namespace {

namespace fs = std::filesystem;

// A run directory with post-hoc EMA snapshots (σ_rel 0.05 and 0.10 every 100 steps to 300) of weights following a
// known sequence: enough for reconstruct() and write_reconstruction().
std::string make_run(const test::TempDir& tmp) {
  const std::string run = tmp.file("run");
  tmp.write("run/config.resolved.yaml", "model:\n  name: test\n");
  phema::Tracker tracker({at::zeros({3})}, {phema::gamma_of(0.05), phema::gamma_of(0.10)});
  for (int64_t t = 1; t <= 300; ++t) {
    const double u = static_cast<double>(t) / 300;
    tracker.update({at::tensor({static_cast<float>(u), static_cast<float>(u * u), static_cast<float>(1 - u)})}, t);
    if (t % 100 == 0)
      phema::write_snapshot(run, t, {0.05, 0.10},
                            {{{"w", tracker.profile(0)[0].clone()}}, {{"w", tracker.profile(1)[0].clone()}}});
  }
  return run;
}

// The measure: the first weight of the checkpoint's EMA as "fid" (so a point's value says which weights it read),
// counting calls.
SweepMeasure probe(int& calls) {
  return [&calls](const std::string& ckpt, SweepWeights w, const std::string& dir) {
    ++calls;
    // the point's own directory, holding nothing but its reconstruction
    size_t entries = 0;
    for (const auto& e : fs::directory_iterator(dir)) entries += e.path().filename() == "ema" ? 0 : 1;
    EXPECT_EQ(entries, 0u) << dir;
    EXPECT_EQ(fs::exists(dir + "/ema"), w == SweepWeights::reconstructed) << dir;
    if (w != SweepWeights::reconstructed)
      return nlohmann::json{{"metrics", {{"fid", w == SweepWeights::raw ? 50.0 : 60.0}}}};
    const std::string step = read_file(ckpt + "/checkpoints/latest", "latest");
    const at::Tensor v =
        load_safetensors(ckpt + "/checkpoints/" + step.substr(0, 7) + "/ema.safetensors").tensors.at("w");
    return nlohmann::json{{"metrics", {{"fid", v[0].item<double>()}, {"kid_mean", 0.5}}}};
  };
}

TEST(EmaSweep, SigmaRangesAreEvenlySpacedAndInsideTheProfilesRange) {
  EXPECT_EQ(parse_sigma_rels("0.02:0.20:10", "s").size(), 10u);
  const auto v = parse_sigma_rels("0.02:0.20:10", "s");
  EXPECT_DOUBLE_EQ(v.front(), 0.02);
  EXPECT_DOUBLE_EQ(v.back(), 0.20);
  EXPECT_DOUBLE_EQ(v[1], 0.04);
  EXPECT_EQ(parse_sigma_rels("0.05,0.1", "s"), (std::vector<double>{0.05, 0.1}));
  EXPECT_EQ(parse_sigma_rels("0.07:0.3:1", "s"), (std::vector<double>{0.07}));
  for (const char* bad : {"0.02:0.5:4", "0:0.1:3", "0.02:0.2:0", "0.02:0.2:2.5", "0.05,x", "0.1,0.10", "1:2", ""})
    EXPECT_NE(test::user_error_of([&] { parse_sigma_rels(bad, "--sigma-rels"); }), "") << bad;
}

TEST(EmaSweep, EachPointMeasuresItsOwnReconstructionAndASecondStartOnlyTheRest) {
  test::TempDir tmp;
  EmaSweepRequest r;
  r.run = make_run(tmp);
  r.out = tmp.file("sweep");
  r.sigma_rels = {0.04, 0.12};
  r.baselines = {SweepWeights::raw, SweepWeights::fixed_ema};
  r.metric = "fid";
  r.measure = {{"fid", {"--ref", "x"}}};
  int calls = 0;
  auto res = run_ema_sweep(r, probe(calls), nullptr);
  ASSERT_EQ(calls, 4);
  ASSERT_EQ(res.rows.size(), 4u);
  EXPECT_EQ(res.step, 300);
  for (const auto& row : res.rows) {
    if (row["sigma_rel"].is_null()) continue;
    const double s = row["sigma_rel"].get<double>();
    const double direct = phema::reconstruct(r.run, s, 0).tensors.at("w")[0].item<double>();
    EXPECT_NEAR(row["metrics"]["fid"].get<double>(), direct, 1e-7) << s;
    const std::string dir = r.out + "/" + row["id"].get<std::string>() + "/ema";
    EXPECT_TRUE(fs::exists(dir + "/phema_reconstruction.json"));
    EXPECT_FALSE(fs::exists(dir + "/checkpoints"));  // model-sized: removed once measured
  }
  EXPECT_NE(res.rows[2]["metrics"]["fid"], res.rows[3]["metrics"]["fid"]);
  EXPECT_EQ(res.rows[0]["metrics"]["fid"], 50.0);  // baselines first, as measured
  EXPECT_EQ(res.rows[1]["metrics"]["fid"], 60.0);

  r.sigma_rels = {0.04, 0.08, 0.12};  // one point more: only it is measured; the rest come from sweep.json
  calls = 0;
  res = run_ema_sweep(r, probe(calls), nullptr);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(res.resumed, 4);
  EXPECT_EQ(res.rows.size(), 5u);
  r.sigma_rels = {0.08};  // fewer listed: the others stay in the record
  res = run_ema_sweep(r, probe(calls), nullptr);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(res.rows.size(), 5u);

  r.measure = {{"fid", {"--ref", "y"}}};  // another measure into the same directory
  EXPECT_NE(test::user_error_of([&] { run_ema_sweep(r, probe(calls), nullptr); }).find("another"), std::string::npos);
  r.measure = {{"fid", {"--ref", "x"}}};
  r.step = 150;  // the EMAs would end at step 100: another sweep
  EXPECT_NE(test::user_error_of([&] { run_ema_sweep(r, probe(calls), nullptr); }), "");
  r.out = tmp.file("sweep100");
  res = run_ema_sweep(r, probe(calls), nullptr);
  EXPECT_EQ(res.step, 100);
  r.step = 50;
  EXPECT_NE(test::user_error_of([&] { run_ema_sweep(r, probe(calls), nullptr); }), "");
}

TEST(EmaSweep, TheTablePicksTheBestPointInTheMetricsDirection) {
  auto row = [](const char* id, double s, double v) {
    return nlohmann::json{
        {"id", id}, {"weights", "post-hoc EMA"}, {"sigma_rel", s}, {"step", 9}, {"metrics", {{"fid", v}, {"top1", v}}}};
  };
  const std::vector<nlohmann::json> rows{row("a", 0.05, 30), row("b", 0.10, 20), row("c", 0.15, 25)};
  EXPECT_NE(sweep_table(rows, "fid").find("sigma_rel 0.1 (20.00)"), std::string::npos);
  EXPECT_NE(sweep_table(rows, "top1").find("sigma_rel 0.05 (30.00)"), std::string::npos);
  const std::string t = sweep_table(rows, "fid");
  EXPECT_LT(t.find("| 0.05 |"), t.find("| 0.1 |"));  // rows by σ_rel
  EXPECT_LT(t.find("| 0.1 |"), t.find("| 0.15 |"));
}

}  // namespace
}  // namespace moh::eval

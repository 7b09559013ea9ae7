// The one training loop (core/train/train_loop.h) with a toy task that knows nothing of either model family: exact
// resume, the EMA only when asked for, the best-checkpoint pointer, the metric lines and the schedule.
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <nlohmann/json.hpp>

#include <csignal>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/io/atomic_io.h"
#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "core/train/optimizer.h"
#include "core/train/retention.h"
#include "core/train/train_loop.h"
#include "tests/test_util.h"

namespace moh {
namespace {

// y = x · w* on 64 fixed samples, batches of `batch` in an order drawn from (epoch), from batch `start` on.
class Batches : public BatchStream {
 public:
  Batches(at::Tensor x, at::Tensor y, int64_t batch, int64_t epoch, int64_t start, int64_t drop = -1)
      : x_(std::move(x)), y_(std::move(y)), batch_(batch), served_(start), drop_(drop) {
    at::Generator g = at::detail::createCPUGenerator(100 + static_cast<uint64_t>(epoch));
    order_ = at::randperm(x_.size(0), g, at::kLong);
  }
  int64_t num_batches() const override { return x_.size(0) / batch_ - (drop_ >= 0 ? 1 : 0); }
  bool next(at::Tensor& x, at::Tensor& y) override {
    if (served_ >= num_batches()) return false;
    const int64_t b = drop_ >= 0 && served_ >= drop_ ? served_ + 1 : served_;  // the dropped batch is not served
    ++served_;
    const at::Tensor idx = order_.narrow(0, b * batch_, batch_);
    x = x_.index_select(0, idx);
    y = y_.index_select(0, idx);
    return true;
  }

 private:
  at::Tensor x_, y_, order_;
  int64_t batch_, served_ = 0, drop_ = -1;
};

class ToyTask : public TrainTask {
 public:
  ToyTask() {
    at::Generator g = at::detail::createCPUGenerator(7);
    x_ = at::randn({64, 4}, g);
    y_ = at::matmul(x_, at::randn({4, 2}, g));
  }
  std::shared_ptr<torch::nn::Module> build_model() override { return torch::nn::Linear(4, 2).ptr(); }
  std::string describe() const override { return "toy linear"; }
  bool per_rank_rng() const override { return true; }
  std::unique_ptr<BatchStream> train_batches(int64_t epoch, int, int, int64_t start) const override {
    return std::make_unique<Batches>(x_, y_, 16, epoch, start, epoch == drop_epoch ? drop_batch : -1);
  }
  int64_t train_examples() const override { return x_.size(0); }
  LossTensors backward(torch::nn::Module& model, at::Tensor x, at::Tensor y, const StepInfo& at,
                       const GradScaler& scaler) override {
    if (at.step == signal_at_step) std::raise(SIGINT);  // Ctrl-C during this step (the loop's handler takes it)
    if (tf32_steps) *tf32_steps += Tf32Scope::current().first ? 1 : 0;
    auto& lin = dynamic_cast<torch::nn::LinearImpl&>(model);
    x = x.to(lin.weight.device()), y = y.to(lin.weight.device());  // MOH_TEST_DEVICE: the model may be on a GPU
    if (at.epoch == nan_epoch && at.batch == nan_batch) x = x * std::numeric_limits<float>::quiet_NaN();
    // a draw from the generator the loop saves and restores (left out where runs must match batch for batch)
    const at::Tensor noise = noise_ ? 0.01 * at::randn_like(x) : at::zeros_like(x);
    at::Tensor loss = (lin.forward(x + noise) - y).pow(2).mean();
    scaler.scale(loss).backward();
    return {{"loss", loss.detach()}, {"half", loss.detach() / 2}};
  }
  Scalars evaluate(const std::shared_ptr<torch::nn::Module>& model, dist::Group&) override {
    torch::NoGradGuard ng;
    auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(model);
    const c10::Device dev = lin->weight.device();
    return {{"score", 1.0 / (1.0 + (lin->forward(x_.to(dev)) - y_.to(dev)).pow(2).mean().item<double>())}};
  }
  std::string eval_message(int64_t epoch, const Scalars& m, const Scalars&) const override {
    return "epoch " + std::to_string(epoch + 1) + ": " + std::to_string(m.front().second);
  }

  int64_t signal_at_step = -1;
  int64_t nan_epoch = -1, nan_batch = -1;    // this batch's input is NaN (a non-finite loss and gradients)
  int64_t drop_epoch = -1, drop_batch = -1;  // this batch is not in the data at all
  bool noise_ = true;
  int64_t* tf32_steps = nullptr;  // counts the steps that ran with TF32 allowed

 private:
  at::Tensor x_, y_;
};

// The toy experiment as the loop sees it (the experiments layer fills a LoopConfig from a whole file the same way).
LoopConfig toy_config(const test::TempDir& d, const std::string& train) {
  (void)d;
  const std::string yaml =
      "optim: {lr: 1.0e-2, weight_decay: 0.0}\n"
      "schedule: {kind: cosine, unit: step, warmup_epochs: 1, min_lr: 1.0e-4}\n"
      "train: {epochs: 3, log_every_steps: 3, seed: 11, " +
      test::train_device_keys() + ", " + train + "}\n";
  const YAML::Node root = YAML::Load(yaml);
  LoopConfig cfg;
  cfg.name = "toy";
  cfg.yaml = yaml;
  cfg.batch_size = 16;
  cfg.optim = config::read_struct<OptimConfig>(root["optim"], "toy optim");
  cfg.schedule = config::read_struct<ScheduleConfig>(root["schedule"], "toy schedule");
  cfg.train = config::read_struct<TrainConfig>(root["train"], "toy train");
  return cfg;
}

// A run of the toy task set up by `setup` (NaN or dropped batches, no noise).
LoopResult run_with(const LoopConfig& cfg, const std::string& dir, const std::function<void(ToyTask&)>& setup,
                    const std::string& resume = "") {
  return run_training(cfg, {dir, resume}, [&](const RunContext&) {
    auto task = std::make_unique<ToyTask>();
    setup(*task);
    return task;
  });
}

LoopResult run(const LoopConfig& cfg, const std::string& dir, const std::string& resume = "",
               int64_t signal_at_step = -1) {
  return run_training(cfg, {dir, resume}, [&](const RunContext&) {
    auto task = std::make_unique<ToyTask>();
    task->signal_at_step = signal_at_step;
    return task;
  });
}

// The lines of metrics.jsonl that hold evaluations (training-loss windows differ around a stop by design).
std::string eval_lines(const std::string& run) {
  std::istringstream in(read_file(run + "/metrics.jsonl"));
  std::string out;
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l);
    if (!j.contains("score")) continue;
    for (const char* k : {"time", "elapsed_s"}) j.erase(k);
    out += j.dump() + "\n";
  }
  return out;
}

std::string metrics_without_timing(const std::string& run) {
  std::istringstream in(read_file(run + "/metrics.jsonl"));
  std::string out;
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l);
    for (const char* k : {"img_per_s", "time", "elapsed_s"}) j.erase(k);  // wall-clock fields
    out += j.dump() + "\n";
  }
  return out;
}

TEST(TrainLoop, ResumeIsExactWithEmaAndNamedLosses) {
  test::TempDir d;
  const LoopConfig cfg = toy_config(d, "ema_decay: 0.9");
  const LoopResult full = run(cfg, d.file("full"));
  EXPECT_EQ(full.steps, 12);
  LoopConfig first = cfg;
  first.train.max_steps = 4;  // stop after epoch 1
  run(first, d.file("split"));
  const LoopResult resumed = run(cfg, d.file("split"), "auto");
  EXPECT_EQ(resumed.steps, 12);
  const Checkpoint a = load_checkpoint(d.file("full")), b = load_checkpoint(d.file("split"));
  ASSERT_FALSE(a.ema.empty());
  for (const auto& [k, v] : a.model) EXPECT_TRUE(torch::equal(v, b.model.at(k))) << k;
  for (const auto& [k, v] : a.ema) EXPECT_TRUE(torch::equal(v, b.ema.at(k))) << k;
  EXPECT_EQ(metrics_without_timing(d.file("full")), metrics_without_timing(d.file("split")));
  // every named loss of the task is logged (means over the window), evaluations with and without _ema
  const std::string m = read_file(d.file("full") + "/metrics.jsonl");
  EXPECT_NE(m.find("\"half\":"), std::string::npos);
  EXPECT_NE(m.find("\"score_ema\":"), std::string::npos);
  ASSERT_EQ(full.losses.size(), 2u);
  EXPECT_DOUBLE_EQ(full.losses[1].second, full.losses[0].second / 2);
  EXPECT_EQ(full.final_eval.front().first, "score");
  EXPECT_TRUE(std::filesystem::exists(d.file("full") + "/checkpoints/best"));
}

// Post-hoc EMA (train.phema): the tracked profiles resume exactly (checkpoint files phema_S) and the snapshots of a
// split run equal those of an uninterrupted one; the last snapshot is the checkpoint's profile.
TEST(TrainLoop, PostHocEmaProfilesResumeExactly) {
  test::TempDir d;
  const LoopConfig cfg = toy_config(d, "ema_decay: 0.9, phema: {sigma_rels: [0.05, 0.1], snapshot_every: 3}");
  run(cfg, d.file("full"));
  LoopConfig first = cfg;
  first.train.max_steps = 4;
  run(first, d.file("split"));
  EXPECT_FALSE(std::filesystem::exists(d.file("split") + "/phema/0000006"));
  run(cfg, d.file("split"), "auto");
  const std::string last = d.file("full") + "/checkpoints/0000012/phema_0.1.safetensors";
  for (const std::string f :
       {"phema/0000003/sigma_rel_0.05.safetensors", "phema/0000009/sigma_rel_0.1.safetensors",
        "phema/0000012/sigma_rel_0.1.safetensors", "checkpoints/0000012/phema_0.05.safetensors"}) {
    const TensorMap a = load_safetensors(d.file("full") + "/" + f).tensors,
                    b = load_safetensors(d.file("split") + "/" + f).tensors;
    ASSERT_FALSE(a.empty()) << f;
    for (const auto& [k, v] : a) EXPECT_TRUE(torch::equal(v, b.at(k))) << f << " " << k;
  }
  const TensorMap snap = load_safetensors(d.file("full") + "/phema/0000012/sigma_rel_0.1.safetensors").tensors,
                  ckpt = load_safetensors(last).tensors;
  for (const auto& [k, v] : ckpt) EXPECT_TRUE(torch::equal(v, snap.at(k))) << k;
  // the two profiles differ from each other and from the model (they are averages of different lengths)
  const TensorMap model = load_checkpoint(d.file("full")).model,
                  other = load_safetensors(d.file("full") + "/phema/0000012/sigma_rel_0.05.safetensors").tensors;
  bool differs = false;
  for (const auto& [k, v] : snap) differs |= !torch::equal(v, other.at(k)) && !torch::equal(v, model.at(k));
  EXPECT_TRUE(differs);
}

// Ctrl-C inside an epoch: the loop finishes the step, saves a checkpoint at (epoch, batch) and returns; --resume auto
// continues inside the epoch and ends with the weights, EMA and evaluations of an uninterrupted run. A signal during
// an epoch's last step leaves the end-of-epoch evaluation to the resumed run.
TEST(TrainLoop, SignalStopsAtAStepBoundaryAndResumesInsideTheEpoch) {
  test::TempDir d;
  const LoopConfig cfg = toy_config(d, "ema_decay: 0.9");  // 3 epochs × 4 steps
  run(cfg, d.file("full"));
  const Checkpoint a = load_checkpoint(d.file("full"));
  for (const int64_t at : {5, 7}) {  // epoch 2 batch 2 of 4; epoch 2's last batch
    const std::string dir = d.file("stop" + std::to_string(at));
    const LoopResult stopped = run(cfg, dir, "", at);
    EXPECT_EQ(stopped.stop_signal, SIGINT);
    EXPECT_EQ(stopped.steps, at + 1);
    const Checkpoint mid = load_checkpoint(dir);
    EXPECT_EQ(mid.dir, stopped.checkpoint);
    EXPECT_EQ(mid.state.step, at + 1);
    EXPECT_EQ(mid.state.epoch, 1);
    EXPECT_EQ(mid.state.batch, at + 1 - 4);
    EXPECT_EQ(StopOnSignal::requested(), SIGINT);
    const LoopResult resumed = run(cfg, dir, "auto");  // a new run clears the request
    EXPECT_EQ(resumed.stop_signal, 0);
    EXPECT_EQ(resumed.steps, 12);
    const Checkpoint b = load_checkpoint(dir);
    for (const auto& [k, v] : a.model) EXPECT_TRUE(torch::equal(v, b.model.at(k))) << at << " " << k;
    for (const auto& [k, v] : a.ema) EXPECT_TRUE(torch::equal(v, b.ema.at(k))) << at << " " << k;
    EXPECT_EQ(eval_lines(d.file("full")), eval_lines(dir)) << at;
  }
}

// A second signal exits at once with 128 + signal, whatever the loop is doing.
TEST(TrainLoopDeathTest, SecondSignalExitsAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StopOnSignal s;
        std::raise(SIGINT);
        std::raise(SIGINT);
        std::exit(0);
      },
      ::testing::ExitedWithCode(130), "interrupted again");
}

// train.ckpt_every_steps: checkpoints inside epochs (steps 3, 6, 9; 4 and 8 are epoch ends, saved anyway), the run
// unchanged by them, and a resume from one inside an epoch ends where the uninterrupted run does.
TEST(TrainLoop, StepCheckpointsInsideEpochsResumeExactly) {
  test::TempDir d;
  const LoopConfig cfg = toy_config(d, "ema_decay: 0.9");  // 3 epochs × 4 steps
  run(cfg, d.file("full"));
  LoopConfig every3 = cfg;
  every3.train.ckpt_every_steps = 3;
  run(every3, d.file("every3"));
  for (const char* step : {"0000003", "0000004", "0000006", "0000008", "0000009", "0000012"})
    EXPECT_TRUE(std::filesystem::exists(d.file("every3") + "/checkpoints/" + step)) << step;
  EXPECT_FALSE(std::filesystem::exists(d.file("every3") + "/checkpoints/0000005"));
  const Checkpoint mid = load_checkpoint(d.file("every3") + "/checkpoints/0000006");
  EXPECT_EQ(mid.state.epoch, 1);
  EXPECT_EQ(mid.state.batch, 2);
  const Checkpoint a = load_checkpoint(d.file("full")), b = load_checkpoint(d.file("every3"));
  for (const auto& [k, v] : a.model) EXPECT_TRUE(torch::equal(v, b.model.at(k))) << k;
  const LoopResult resumed = run(cfg, d.file("from6"), d.file("every3") + "/checkpoints/0000006");
  EXPECT_EQ(resumed.steps, 12);
  const Checkpoint c = load_checkpoint(d.file("from6"));
  for (const auto& [k, v] : a.model) EXPECT_TRUE(torch::equal(v, c.model.at(k))) << k;
  for (const auto& [k, v] : a.ema) EXPECT_TRUE(torch::equal(v, c.ema.at(k))) << k;
  EXPECT_EQ(eval_lines(d.file("full")), eval_lines(d.file("every3")));
}

// train.precision: tf32 allows TF32 for every step of the run and puts the process setting back after it; on a CPU
// the run is exactly the fp32 one.
TEST(TrainLoop, Tf32IsAllowedThroughTheRunAndIsFp32OnACpu) {
  test::TempDir d;
  const std::pair<bool, bool> before = Tf32Scope::current();
  at::globalContext().setAllowTF32CuBLAS(false);
  int64_t fp32_steps = 0, tf32_steps = 0;
  run_with(toy_config(d, "precision: fp32"), d.file("fp32"), [&](ToyTask& t) { t.tf32_steps = &fp32_steps; });
  run_with(toy_config(d, "precision: tf32"), d.file("tf32"), [&](ToyTask& t) { t.tf32_steps = &tf32_steps; });
  EXPECT_EQ(fp32_steps, 0);
  EXPECT_EQ(tf32_steps, 12);
  EXPECT_FALSE(Tf32Scope::current().first);
  at::globalContext().setAllowTF32CuBLAS(before.first);
  if (test::device_name() != "cpu") return;  // on a GPU TF32 rounds the products
  const Checkpoint a = load_checkpoint(d.file("fp32")), b = load_checkpoint(d.file("tf32"));
  for (const auto& [k, v] : a.model) EXPECT_TRUE(torch::equal(v, b.model.at(k))) << k;
}

TEST(TrainLoop, NoEmaUnlessAskedFor) {
  test::TempDir d;
  const LoopResult r = run(toy_config(d, "ema_decay: 0.0"), d.file("run"));
  const Checkpoint c = load_checkpoint(d.file("run"));
  EXPECT_TRUE(c.ema.empty());
  EXPECT_FALSE(std::filesystem::exists(c.dir + "/ema.safetensors"));
  EXPECT_TRUE(r.final_eval_ema.empty());
  EXPECT_EQ(read_file(d.file("run") + "/metrics.jsonl").find("_ema"), std::string::npos);
}

TEST(TrainLoop, RefusesToOverwriteARun) {
  test::TempDir d;
  const LoopConfig cfg = toy_config(d, "max_steps: 2");
  run(cfg, d.file("run"));
  EXPECT_THROW(run(cfg, d.file("run")), UserError);
}

// fp16 loss scaling on the CPU with an injected non-finite gradient: the skipped step leaves the weights, the EMA and
// the step counter as they were (the skip is counted), the learning rate of the next batch is that of the step not
// taken, and the next finite step advances all three.
TEST(TrainLoop, SkippedStepsAdvanceNeitherEmaNorScheduleNorCounter) {
  torch::manual_seed(3);
  torch::nn::Linear model(3, 2), copy(3, 2);
  ModelEma ema(copy.ptr(), 0.9, false);
  ema.copy_from(*model);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.1));
  GradScaler scaler(Precision::fp16);  // enabled: scale 2^16, skips inf/NaN steps
  TrainerState state;
  state.step = 7;
  auto snapshot = [](torch::nn::Module& m) { return module_tensors(m); };
  auto same = [](const TensorMap& a, const TensorMap& b) {
    for (const auto& [k, v] : a)
      if (!torch::equal(v, b.at(k))) return false;
    return true;
  };
  const TensorMap w0 = snapshot(*model), e0 = snapshot(ema.module());
  model->weight.mutable_grad() = at::full({2, 3}, std::numeric_limits<float>::quiet_NaN());
  model->bias.mutable_grad() = at::ones({2});
  EXPECT_FALSE(complete_optimizer_step(opt, *model, scaler, 1.0, OptimImpl::for_loop, &ema, state));
  EXPECT_TRUE(same(snapshot(*model), w0));
  EXPECT_TRUE(same(snapshot(ema.module()), e0));
  EXPECT_EQ(state.step, 7);
  EXPECT_EQ(state.skipped, 1);
  EXPECT_EQ(scaler.current_scale(), 32768.0);
  LoopConfig cfg;  // warm-up over the first epoch of 10 batches: the lr moves with every step taken
  cfg.optim.lr = 1e-3;
  cfg.schedule.kind = LrSchedule::cosine;
  cfg.schedule.unit = ScheduleUnit::step;
  cfg.schedule.warmup_epochs = 1;
  cfg.schedule.warmup_lr = 0;
  cfg.train.epochs = 3;
  EXPECT_DOUBLE_EQ(step_learning_rate(cfg, 0, 5, 1, 10), step_learning_rate(cfg, 0, 4, 0, 10));
  EXPECT_LT(step_learning_rate(cfg, 0, 5, 1, 10), step_learning_rate(cfg, 0, 5, 0, 10));
  model->weight.mutable_grad() = at::ones({2, 3}) * scaler.current_scale();
  model->bias.mutable_grad() = at::ones({2}) * scaler.current_scale();
  EXPECT_TRUE(complete_optimizer_step(opt, *model, scaler, 1.0, OptimImpl::for_loop, &ema, state));
  EXPECT_FALSE(same(snapshot(*model), w0));
  EXPECT_FALSE(same(snapshot(ema.module()), e0));
  EXPECT_EQ(state.step, 8);
  EXPECT_EQ(state.skipped, 1);
}

// The non-finite guard: a batch whose loss and gradients are NaN is skipped — the run ends with exactly the weights,
// EMA and evaluations of a run whose data never held that batch (constant learning rate, no noise draws: the two
// runs then see the same updates), in host mode (the flag read before the optimizer) and, where fused AdamW exists,
// in device mode (the skip made by the kernel, learned by the host a step later).
TEST(TrainLoop, ANonFiniteBatchIsSkippedAsIfItWereNotThere) {
  std::vector<std::string> impls{"foreach"};
  if (fused_adamw_available(test::device())) impls.push_back("fused");
  for (const std::string& impl : impls) {
    SCOPED_TRACE(impl);
    test::TempDir d;
    LoopConfig cfg = toy_config(d, "ema_decay: 0.9");
    cfg.train.epochs = 2;
    cfg.schedule.kind = LrSchedule::constant;
    cfg.optim.impl = config::enum_from_string<OptimImpl>(impl, "impl");
    const LoopResult guarded =
        run_with(cfg, d.file("nan"), [](ToyTask& t) { t.nan_epoch = 0, t.nan_batch = 2, t.noise_ = false; });
    const LoopResult without =
        run_with(cfg, d.file("drop"), [](ToyTask& t) { t.drop_epoch = 0, t.drop_batch = 2, t.noise_ = false; });
    EXPECT_EQ(guarded.steps, 7);
    EXPECT_EQ(without.steps, 7);
    const Checkpoint a = load_checkpoint(d.file("nan")), b = load_checkpoint(d.file("drop"));
    for (const auto& [k, v] : b.model) EXPECT_TRUE(torch::equal(a.model.at(k), v)) << k;
    for (const auto& [k, v] : b.ema) EXPECT_TRUE(torch::equal(a.ema.at(k), v)) << k;
    for (const auto& [k, v] : b.optimizer) EXPECT_TRUE(torch::equal(a.optimizer.at(k), v)) << k;
    EXPECT_EQ(eval_lines(d.file("nan")), eval_lines(d.file("drop")));
    const std::string m = read_file(d.file("nan") + "/metrics.jsonl");
    EXPECT_NE(m.find("\"skipped_steps\":1"), std::string::npos) << m;
    EXPECT_EQ(m.find("null"), std::string::npos) << "a skipped batch's NaN loss stays out of the logged means";
  }
}

// Too many non-finite steps in a row end the run with one line naming them and the last finite checkpoint; nothing
// non-finite was written; `--resume auto` (with a sane learning rate) continues from that checkpoint.
TEST(TrainLoop, ADivergedRunStopsAndResumesFromItsLastFiniteCheckpoint) {
  test::TempDir d;
  LoopConfig cfg = toy_config(d, "max_nonfinite_steps: 3");
  cfg.schedule.kind = LrSchedule::constant;
  const std::string dir = d.file("run");
  const auto quiet = [](ToyTask& t) { t.noise_ = false; };
  LoopConfig first = cfg;
  first.train.epochs = 1;  // a finite checkpoint at step 4
  run_with(first, dir, quiet);
  LoopConfig bad = cfg;
  bad.optim.lr = 1e30;  // epoch 2's first step throws the weights to ~1e30; every loss after it overflows
  std::string message;
  try {
    run_with(bad, dir, quiet, "auto");
    ADD_FAILURE() << "a run whose every step is non-finite must stop";
  } catch (const RunStopped& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("training diverged: non-finite loss or gradients in batches 6–8 of the run (3 in a row)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("last finite checkpoint: " + dir + "/checkpoints/0000004"), std::string::npos) << message;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/checkpoints")) {
    if (!e.is_directory()) continue;
    for (const auto& [k, v] : load_checkpoint(e.path().string()).model)
      EXPECT_TRUE(at::isfinite(v).all().item<bool>()) << e.path() << " " << k;
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/diverged.json"));
  const LoopResult resumed = run_with(cfg, dir, quiet, "auto");  // a sane learning rate again
  EXPECT_EQ(resumed.steps, 12);
  EXPECT_FALSE(std::filesystem::exists(dir + "/diverged.json"));
}

// Retention: over a 12-checkpoint run, keep_last 3 and milestones every 4 steps keep exactly those, `best` besides;
// a pass after an interrupted deletion (kill -9 between commit and delete) removes what is left; a checkpoint a
// reader holds is kept until a later pass.
TEST(Retention, KeepsTheNewestTheMilestonesAndBest) {
  EXPECT_EQ(checkpoints_to_prune({1, 2, 3, 4, 5, 6, 7, 8}, 8, 2, 3, 4), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(checkpoints_to_prune({1, 2, 3}, 3, -1, 0, 0), std::vector<int64_t>{});  // keep_last 0: keep all
  test::TempDir d;
  LoopConfig cfg = toy_config(d, "keep_last: 3, keep_every_steps: 8");
  cfg.train.epochs = 12;  // 4 steps an epoch, a checkpoint after each: steps 4, 8, ..., 48
  run(cfg, d.file("run"));
  std::set<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(d.file("run") + "/checkpoints"))
    if (e.is_directory()) left.insert(e.path().filename().string());
  const std::string best = read_file(d.file("run") + "/checkpoints/best");
  std::set<std::string> want{"0000008", "0000016", "0000024",        "0000032", "0000040",  // milestones
                             "0000044", "0000048", best.substr(0, 7)};  // the newest 3 (40-48), best
  EXPECT_EQ(left, want);
  std::filesystem::create_directories(d.file("run") + "/checkpoints/0000005");  // left by a kill before its deletion
  std::filesystem::create_directories(d.file("run") + "/checkpoints/0000006");
  hold_checkpoint(d.file("run") + "/checkpoints/0000006");  // a moh sample reading it
  prune_checkpoints(d.file("run"), 3, 8);
  EXPECT_FALSE(std::filesystem::exists(d.file("run") + "/checkpoints/0000005"));
  EXPECT_TRUE(std::filesystem::exists(d.file("run") + "/checkpoints/0000006"));
}

// A group whose backend lives on a device other than the host (the `meta` device stands in for a GPU: it holds no
// data, so the group keeps each tensor's values aside while "on the device"). It records the device of every tensor
// its collectives are handed; under NCCL a host tensor there is an error at the first step.
class MetaBackendGroup : public dist::Group {
 public:
  explicit MetaBackendGroup(int world) : Group(0, world, c10::Device(c10::kMeta)) {}
  std::string backend() const override { return "fake (meta device)"; }
  void barrier() override {}
  int64_t handed = 0, on_host = 0;

 protected:
  void backend_allreduce_sum_(std::vector<at::Tensor>& t) override { record(t); }  // the other ranks add zeros
  void backend_broadcast_(std::vector<at::Tensor>& t, int) override { record(t); }
  at::Tensor to_backend(const at::Tensor& t) override {
    at::Tensor m = at::empty(t.sizes(), t.options().device(device_));
    values_[m.unsafeGetTensorImpl()] = t.detach().clone();
    return m;
  }
  at::Tensor from_backend(const at::Tensor& t, const c10::Device& device) override {
    return values_.at(t.unsafeGetTensorImpl()).to(device);
  }

 private:
  void record(const std::vector<at::Tensor>& t) {
    for (const auto& x : t) {
      ++handed;
      on_host += x.device().is_cpu();
    }
  }
  std::map<const void*, at::Tensor> values_;
};

TEST(Distributed, CollectivesGetTensorsOnTheBackendDevice) {
  auto group = std::make_shared<MetaBackendGroup>(2);
  EXPECT_EQ(group->sum({1.0, 2.0}), (std::vector<double>{1.0, 2.0}));
  torch::nn::Linear lin(3, 2);
  group->broadcast_module(*lin);
  (lin->weight.sum() * 2).backward();
  group->average_gradients(lin->parameters());
  EXPECT_TRUE(torch::equal(lin->weight.grad(), at::ones({2, 3})));  // (2 + 0) / 2 ranks
  const at::Tensor block = at::arange(6, at::kByte).view({2, 3});
  EXPECT_TRUE(torch::equal(group->gather_cat(block), block));
  EXPECT_EQ(group->gather_cat(block).scalar_type(), at::kByte);  // no widened copy
  const auto states = dist::gather_rng_states(*group, c10::Device(c10::kCPU), /*per_rank=*/true);
  EXPECT_TRUE(torch::equal(states.at("cpu_ranks")[0], states.at("cpu")));
  // A whole run of the loop as rank 0 of 2 (model on the host, collectives on the "device").
  const int64_t before = group->handed;
  setenv("WORLD_SIZE", "2", 1), setenv("RANK", "0", 1);
  test::TempDir d;
  TrainArgs args{d.file("run"), ""};
  args.group = group;
  const LoopResult r = run_training(toy_config(d, "ema_decay: 0.9"), args,
                                    [](const RunContext&) { return std::make_unique<ToyTask>(); });
  unsetenv("WORLD_SIZE"), unsetenv("RANK");
  EXPECT_EQ(r.steps, 12);
  EXPECT_GT(group->handed - before, 12 * 2);  // gradients and the stop check of every step, metrics, states
  EXPECT_EQ(group->on_host, 0) << "of " << group->handed << " tensors handed to collectives";
}

// A process group of one joined through the backend: Gloo on the CPU, NCCL under MOH_TEST_DEVICE=cuda (a machine
// with one GPU cannot form a two-rank NCCL group). Every collective the trainers use, with tensors from the host and
// from the device, and a whole training run in that group equal bit for bit to the same run without one.
TEST(Distributed, GroupOfOneThroughTheBackendEqualsNoGroup) {
  if (!dist::available()) GTEST_SKIP() << "this build has no c10d process groups";
  const torch::Device dev = test::device();
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(31000 + static_cast<int>(std::random_device{}() % 20000)).c_str(), 1);
  const RunContext ctx = RunContext::create(test::device_name(), Precision::fp32, 0);
  const auto group = dist::Group::join(ctx, {}, /*even_alone=*/true);
  ASSERT_EQ(group->backend(), dev.is_cuda() ? "nccl" : "gloo") << "(a CUDA check needs -DMOH_WITH_NCCL=ON)";
  EXPECT_EQ(group->device().type(), dev.type());
  EXPECT_EQ(group->sum({1.5, -2.0}), (std::vector<double>{1.5, -2.0}));
  const at::Tensor host = at::arange(5, at::kFloat), there = at::arange(4, at::kDouble).mul(3).to(dev);
  std::vector<at::Tensor> t{host.clone(), there.clone()};
  group->allreduce_sum_(t);
  group->broadcast_(t);
  EXPECT_TRUE(t[0].is_cpu() && torch::equal(t[0], host));
  EXPECT_EQ(t[1].device(), there.device());
  EXPECT_TRUE(torch::equal(t[1], there));
  const at::Tensor block = at::arange(6, at::kByte).view({2, 3});
  EXPECT_TRUE(torch::equal(group->gather_cat(block), block));
  EXPECT_TRUE(torch::equal(group->gather_cat(block.to(dev)).cpu(), block));
  const auto states = dist::gather_rng_states(*group, dev, /*per_rank=*/true);
  EXPECT_TRUE(torch::equal(states.at("cpu_ranks")[0], states.at("cpu")));
  if (dev.is_cuda()) {
    EXPECT_TRUE(torch::equal(states.at("cuda_ranks")[0].cpu(), states.at("cuda").cpu()));
  }
  group->barrier();
  test::TempDir d;
  const LoopConfig cfg = toy_config(d, "ema_decay: 0.9");
  run(cfg, d.file("alone"));
  TrainArgs args{d.file("grouped"), ""};
  args.group = group;
  EXPECT_EQ(run_training(cfg, args, [](const RunContext&) { return std::make_unique<ToyTask>(); }).steps, 12);
  const Checkpoint a = load_checkpoint(d.file("alone")), b = load_checkpoint(d.file("grouped"));
  for (const auto& [k, v] : a.model) EXPECT_TRUE(torch::equal(v, b.model.at(k))) << k;
  for (const auto& [k, v] : a.ema) EXPECT_TRUE(torch::equal(v, b.ema.at(k))) << k;
  EXPECT_EQ(metrics_without_timing(d.file("alone")), metrics_without_timing(d.file("grouped")));
}

// timm CosineLRScheduler as the TransNeXt recipe configures it (per-epoch t, warm-up, cosine over t / epochs).
TEST(TrainLoop, LearningRateSchedule) {
  LoopConfig cfg;
  cfg.optim.lr = 1e-3;
  cfg.schedule.kind = LrSchedule::cosine;
  cfg.schedule.warmup_epochs = 5;
  cfg.schedule.warmup_lr = 1e-6;
  cfg.schedule.min_lr = 1e-5;
  cfg.train.epochs = 300;
  EXPECT_DOUBLE_EQ(learning_rate_at(cfg, 0), 1e-6);
  EXPECT_NEAR(learning_rate_at(cfg, 2.5), 1e-6 + 2.5 * (1e-3 - 1e-6) / 5, 1e-15);
  EXPECT_NEAR(learning_rate_at(cfg, 150), 1e-5 + 0.5 * (1e-3 - 1e-5), 1e-12);
  EXPECT_NEAR(learning_rate_at(cfg, 300), 1e-5, 1e-15);
  cfg.schedule.kind = LrSchedule::constant;
  EXPECT_DOUBLE_EQ(learning_rate_at(cfg, 123), 1e-3);
}

}  // namespace
}  // namespace moh

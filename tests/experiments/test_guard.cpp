// The non-finite guard through the real trainers (classifier and DiT, fp32 and bf16): a batch whose input is NaN
// gives a NaN loss and NaN gradients; the step is skipped, the run finishes, and its checkpoint equals that of the
// same run stopped before that batch (the batch's update, and nothing else, is missing).
#include <limits>

#include "core/io/atomic_io.h"
#include "core/train/checkpoint.h"
#include "experiments/registry.h"
#include "experiments/train_tasks.h"
#include "tests/test_util.h"

namespace moh {
namespace {

// A task that forwards everything to the family's own and makes one batch's input NaN.
class NanBatch : public TrainTask {
 public:
  NanBatch(std::unique_ptr<TrainTask> inner, int64_t batch) : inner_(std::move(inner)), batch_(batch) {}
  std::shared_ptr<torch::nn::Module> build_model() override { return inner_->build_model(); }
  std::string describe() const override { return inner_->describe(); }
  bool decays(const std::string& n, const at::Tensor& p) const override { return inner_->decays(n, p); }
  bool per_rank_rng() const override { return inner_->per_rank_rng(); }
  std::unique_ptr<BatchStream> train_batches(int64_t e, int r, int w, int64_t s) const override {
    return inner_->train_batches(e, r, w, s);
  }
  int64_t train_examples() const override { return inner_->train_examples(); }
  LossTensors backward(torch::nn::Module& model, at::Tensor x, at::Tensor y, const StepInfo& at,
                       const GradScaler& scaler) override {
    if (at.epoch == 0 && at.batch == batch_) x = x.to(at::kFloat) * std::numeric_limits<float>::quiet_NaN();
    return inner_->backward(model, std::move(x), std::move(y), at, scaler);
  }
  Scalars evaluate(const std::shared_ptr<torch::nn::Module>& model, dist::Group& group) override {
    return inner_->evaluate(model, group);
  }
  std::vector<at::Tensor> take_head_load(torch::nn::Module& model) override { return inner_->take_head_load(model); }

 private:
  std::unique_ptr<TrainTask> inner_;
  int64_t batch_;
};

experiments::ExperimentConfig tiny(const std::string& file, const std::string& precision) {
  return experiments::load_experiment(
      test::source_path("configs/fashion_mnist/", file),
      {"data.limit_train=256", "data.limit_val=64", "train.epochs=1", "train.processes=1", "train.log_every_steps=1",
       "train.precision=" + precision, "train.device=cpu"});
}

TEST(Guard, TheRealTrainersSkipANonFiniteBatchAndKeepEverythingElse) {
  for (const char* file : {"moh_vit_nano.yaml", "moh_dit_pixel.yaml"})
    for (const char* precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(std::string(file) + " " + precision);
      test::TempDir d;
      const experiments::ExperimentConfig cfg = tiny(file, precision);
      const TaskFactory make = experiments::task_factory(cfg);
      int64_t batches = 0;
      const LoopResult guarded =
          run_training(experiments::loop_config(cfg), {d.file("nan"), ""}, [&](const RunContext& ctx) {
            std::unique_ptr<TrainTask> inner = make(ctx);
            batches = inner->train_batches(0, 0, 1, 0)->num_batches();
            return std::make_unique<NanBatch>(std::move(inner), batches - 1);  // the epoch's last batch
          });
      ASSERT_GE(batches, 2);
      EXPECT_EQ(guarded.steps, batches - 1);
      // the same run, stopped before the batch
      const experiments::ExperimentConfig stopped =
          experiments::with_overrides(cfg, {"train.max_steps=" + std::to_string(batches - 1)});
      run_training(experiments::loop_config(stopped), {d.file("stop"), ""}, make);
      const Checkpoint a = load_checkpoint(d.file("nan")), b = load_checkpoint(d.file("stop"));
      for (const auto& [k, v] : b.model) EXPECT_TRUE(torch::equal(a.model.at(k), v)) << k;
      for (const auto& [k, v] : b.ema) EXPECT_TRUE(torch::equal(a.ema.at(k), v)) << k;
      for (const auto& [k, v] : b.optimizer) EXPECT_TRUE(torch::equal(a.optimizer.at(k), v)) << k;
      EXPECT_NE(read_file(d.file("nan") + "/metrics.jsonl").find("\"skipped_steps\":1"), std::string::npos);
    }
}

}  // namespace
}  // namespace moh

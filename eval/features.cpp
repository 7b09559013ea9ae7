#include "eval/features.h"

#include <torch/torch.h>

#include <filesystem>
#include <future>
#include <numeric>

#include "core/error.h"
#include "core/io/progress.h"
#include "core/io/sha256.h"
#include "core/platform/amp.h"
#include "core/train/checkpoint.h"
#include "datasets/augment.h"
#include "datasets/loader.h"
#include "vision/dinov2.h"

namespace moh::eval {

namespace {

constexpr const char* kFeaturesHint =
    "use inception:WEIGHTS(.pth|.safetensors), classifier:CHECKPOINT_OR_RUN_DIR or dinov2:WEIGHTS";
constexpr int64_t kDinoV2Side = 224;  // EDM2's FD-DINOv2 input

class InceptionNet : public FeatureNet {
 public:
  InceptionNet(const std::string& weights, const RunContext& ctx, InceptionResize resize)
      : device_(ctx.device), resize_(resize) {
    load_inception_weights(net_, weights);
    sha_ = sha256_file(weights);
    net_->eval();
    net_->to(device_);
  }
  InceptionFeatures extract(const at::Tensor& images_u8) override {
    torch::NoGradGuard ng;
    const Tf32Scope exact(false);  // TF32 changes Inception features at the 1e-3 level (spec §5): exact fp32
    const at::Tensor x = inception_preprocess(images_u8.to(device_), resize_);  // (B, 3, 299, 299)
    InceptionFeatures f = net_->forward(x);
    return {f.pool.to(at::kCPU), f.spatial.to(at::kCPU), f.logits.to(at::kCPU)};
  }
  std::string name() const override { return "inception"; }
  std::string weights_sha256() const override { return sha_; }
  c10::Device device() const override { return device_; }
  std::string preprocessing() const override {
    return resize_ == InceptionResize::tf1 ? "tf1-bilinear-299, (x-128)/128" : "pytorch-bilinear-299, 2x/255-1";
  }
  bool predicts_dataset_classes() const override { return false; }

 private:
  FIDInceptionV3 net_;
  at::Device device_;
  InceptionResize resize_;
  std::string sha_;
};

class DinoV2Net : public FeatureNet {
 public:
  DinoV2Net(const std::string& weights, const RunContext& ctx)
      : device_(ctx.device), net_(vision::load_dinov2(weights)), sha_(sha256_file(weights)) {
    net_->to(device_);
  }
  InceptionFeatures extract(const at::Tensor& images_u8) override {
    namespace F = torch::nn::functional;
    torch::NoGradGuard ng;
    const Tf32Scope exact(false);  // features in exact fp32 whatever the run's precision
    at::Tensor x = images_u8.to(device_).permute({0, 3, 1, 2}).to(at::kFloat);  // (B, C, H, W), 0…255
    if (x.size(1) == 1) x = x.expand({-1, 3, -1, -1});
    x = F::interpolate(x, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{kDinoV2Side, kDinoV2Side})
                              .mode(torch::kBicubic)
                              .align_corners(false)
                              .antialias(true));
    x = vision::imagenet_normalize(x / 255.0);
    InceptionFeatures f;
    f.pool = net_->forward_tokens(x).cls.to(at::kCPU, at::kFloat);  // (B, D)
    return f;
  }
  std::string name() const override { return "dinov2"; }
  std::string weights_sha256() const override { return sha_; }
  c10::Device device() const override { return device_; }
  std::string preprocessing() const override {
    return "grey to RGB, bicubic antialiased resize to 224, x/255, ImageNet mean/std (EDM2 fd_dinov2, torch resize)";
  }
  bool predicts_dataset_classes() const override { return false; }
  bool has_spatial() const override { return false; }
  bool has_logits() const override { return false; }

 private:
  at::Device device_;
  vision::DinoV2 net_;
  std::string sha_;
};

}  // namespace

std::unique_ptr<FeatureNet> make_dinov2_net(const std::string& weights, const RunContext& ctx) {
  return std::make_unique<DinoV2Net>(weights, ctx);
}

ClassifierFeatureNet::ClassifierFeatureNet(vision::TransNeXt model, datasets::ImageTransform transform,
                                           std::string name, std::string weights_sha256, const RunContext& ctx)
    : device_(ctx.device),
      options_(model->options),
      tf_(std::move(transform)),
      model_(std::move(model)),
      name_(std::move(name)),
      sha_(std::move(weights_sha256)) {
  model_->eval();
  model_->to(device_);
}

InceptionFeatures ClassifierFeatureNet::extract(const at::Tensor& images_u8) {
  torch::NoGradGuard ng;
  const Tf32Scope exact(false);  // features in exact fp32 whatever the run's precision
  at::Tensor x = images_u8;      // (B, H, W, C)
  const int64_t want_c = options_.in_chans;
  if (want_c == 1 && x.size(3) == 3) x = x.to(at::kFloat).mean(3, true).round().to(at::kByte);
  if (want_c == 3 && x.size(3) == 1) x = x.expand({-1, -1, -1, 3}).contiguous();
  if (x.size(1) > tf_.size || x.size(2) > tf_.size) {  // larger than the model input: area downsampling
    at::Tensor f = x.permute({0, 3, 1, 2}).to(at::kFloat);
    f = at::adaptive_avg_pool2d(f, {tf_.size, tf_.size});
    x = f.round().clamp(0, 255).to(at::kByte).permute({0, 2, 3, 1});
  }
  datasets::ImageSet set;
  set.images = (x.size(3) == 1 ? x.squeeze(3) : x).contiguous();
  set.labels = at::zeros({x.size(0)}, at::kLong);
  std::vector<int64_t> idx(static_cast<size_t>(x.size(0)));
  std::iota(idx.begin(), idx.end(), 0);
  const at::Tensor input = datasets::make_batch(set, idx, tf_, false, 0, 0).first.to(device_);  // (B, C, S, S)
  vision::ClassifierOutput out = model_->forward(input);
  const int64_t c = std::min<int64_t>(kSpatialChannels, out.stage3.size(3));
  at::Tensor spatial = out.stage3.narrow(3, 0, c).reshape({x.size(0), -1});  // NHWC flatten, like ADM's mixed_6
  return {out.features.to(at::kCPU, at::kFloat), spatial.to(at::kCPU, at::kFloat), out.logits.to(at::kCPU, at::kFloat)};
}

std::string ClassifierFeatureNet::preprocessing() const {
  return "grey/RGB to " + std::to_string(options_.in_chans) + " channels, pad or area-resize to " +
         std::to_string(tf_.size) + ", normalise (x/255 - " + c10::str(tf_.mean) + ") / " + c10::str(tf_.std);
}

FeatureSpec parse_feature_spec(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon), arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (colon == std::string::npos || arg.empty())
    throw UserError("--features " + spec, "expected KIND:PATH", kFeaturesHint);
  if (kind != "inception" && kind != "classifier" && kind != "dinov2")
    throw UserError("--features " + spec, "unknown feature network '" + kind + "'", kFeaturesHint);
  if (kind == "classifier" && !std::filesystem::exists(arg))
    throw UserError("--features " + spec, "no such checkpoint or run directory", kFeaturesHint);
  if (kind == "dinov2" && !std::filesystem::is_regular_file(arg))
    throw UserError("--features " + spec, "no such weights file",
                    "a DINOv2 ViT-L/14 file from timm (vit_large_patch14_dinov2) or facebookresearch/dinov2");
  return {kind, arg};
}

std::unique_ptr<FeatureNet> make_inception_net(const std::string& weights, const RunContext& ctx,
                                               InceptionResize resize) {
  return std::make_unique<InceptionNet>(weights, ctx, resize);
}

FeatureSet extract_features(FeatureNet& net, datasets::ImageSource& source, int64_t batch_size,
                            const std::string& label) {
  std::vector<at::Tensor> pool, spatial, logits, labels;
  Progress progress("features " + label, source.size(), "img");
  datasets::ImageBlock cur;
  bool have = source.next(batch_size, cur);
  while (have) {
    // Read/decode the next block while the network runs on this one.
    auto ahead = std::async(std::launch::async, [&source, batch_size] {
      datasets::ImageBlock b;
      const bool ok = source.next(batch_size, b);
      return std::make_pair(ok, b);
    });
    InceptionFeatures f;
    try {
      f = net.extract(cur.images);
    } catch (...) {
      ahead.wait();
      throw;
    }
    pool.push_back(f.pool);
    if (f.spatial.defined()) spatial.push_back(f.spatial);
    if (f.logits.defined()) logits.push_back(f.logits);
    if (cur.labels.defined()) labels.push_back(cur.labels);
    progress.advance(cur.images.size(0));
    auto next = ahead.get();
    have = next.first;
    cur = next.second;
  }
  progress.finish();
  if (pool.empty()) throw UserError("images " + source.spec(), "contains no images", "");
  FeatureSet out;
  out.pool = at::cat(pool);
  if (!spatial.empty()) out.spatial = at::cat(spatial);
  if (!logits.empty()) out.logits = at::cat(logits);
  if (source.has_labels() && !labels.empty()) out.labels = at::cat(labels);
  return out;
}

}  // namespace moh::eval

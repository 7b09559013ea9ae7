#pragma once
// Pluggable feature networks for the generative metrics and their batched extraction:
//   inception:WEIGHTS.safetensors  the FID Inception (standard; ADM / pytorch-fid numbers)
//   classifier:CHECKPOINT          a classifier trained with this toolkit (checkpoint or run directory): pooled
//                                  penultimate features for FID/P/R, its logits for IS and sample accuracy, and
//                                  the first 7 channels of stage 3 (NHWC) as the spatial features for sFID — for
//                                  data where Inception is meaningless (Fashion-MNIST);
//   dinov2:WEIGHTS                 a DINOv2 ViT (EDM2's FD-DINOv2: ViT-L/14, timm or official file): the final-norm
//                                  class token of 224 px images, no spatial features or logits.
#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "core/platform/run_context.h"
#include "datasets/image_source.h"
#include "datasets/loader.h"
#include "eval/inception.h"
#include "vision/transnext.h"

namespace moh::eval {

/// Features of a set of images, CPU float32, rows in source order.
struct FeatureSet {
  at::Tensor pool;     ///< (N, D) FID / precision / recall features
  at::Tensor spatial;  ///< (N, Ds) sFID features (undefined for nets without them)
  at::Tensor logits;   ///< (N, K) IS input (and class predictions for classifier nets; undefined for nets without)
  at::Tensor labels;   ///< (N) int64 labels of the source, undefined if it has none
};

/// A network mapping uint8 images to the three feature kinds.
class FeatureNet {
 public:
  virtual ~FeatureNet() = default;
  /// (B, H, W, C) uint8 → features on the CPU (float32).
  virtual InceptionFeatures extract(const at::Tensor& images_u8) = 0;
  /// Identifier written into reports and reference stats ("inception", "classifier:MoH-ViT-Nano").
  virtual std::string name() const = 0;
  /// SHA-256 of the weights file.
  virtual std::string weights_sha256() const = 0;
  /// Where extract() computes (reports name it: the last digits of a FID depend on it).
  virtual c10::Device device() const = 0;
  /// Preprocessing description ("tf1-bilinear-299", "pad-to-32, normalise mean/std").
  virtual std::string preprocessing() const = 0;
  /// Whether logits are class predictions of the dataset's labels (so sample accuracy can be reported).
  virtual bool predicts_dataset_classes() const = 0;
  /// Whether extract() gives spatial features (sFID) and logits (IS); a net without leaves them undefined.
  virtual bool has_spatial() const { return true; }
  virtual bool has_logits() const { return true; }
};

/// A `--features KIND:PATH` spec, checked (known kind, an existing classifier path); bad ones are UserErrors.
struct FeatureSpec {
  std::string kind;  ///< "inception", "classifier" or "dinov2"
  std::string path;
};
FeatureSpec parse_feature_spec(const std::string& spec);

/// The FID Inception from its weights file.
std::unique_ptr<FeatureNet> make_inception_net(const std::string& weights, const RunContext& ctx,
                                               InceptionResize resize = InceptionResize::tf1);

/// A DINOv2 ViT as EDM2's FD-DINOv2 runs it (calculate_metrics.py, resize mode "torch"): grey to RGB, bicubic
/// antialiased resize of the 0–255 values to 224 px, /255, ImageNet normalisation, the final-norm class token.
std::unique_ptr<FeatureNet> make_dinov2_net(const std::string& weights, const RunContext& ctx);

/// A trained classifier as feature network (the checkpoint is read by experiments/feature_nets.h, which builds every
/// kind from its spec): images converted to its channels, padded or area-resized to its input, normalised.
class ClassifierFeatureNet : public FeatureNet {
 public:
  ClassifierFeatureNet(vision::TransNeXt model, datasets::ImageTransform transform, std::string name,
                       std::string weights_sha256, const RunContext& ctx);
  InceptionFeatures extract(const at::Tensor& images_u8) override;
  std::string name() const override { return name_; }
  std::string weights_sha256() const override { return sha_; }
  c10::Device device() const override { return device_; }
  std::string preprocessing() const override;
  bool predicts_dataset_classes() const override { return true; }

 private:
  at::Device device_;
  vision::TransNeXtOptions options_;
  datasets::ImageTransform tf_;
  vision::TransNeXt model_;
  std::string name_, sha_;
};

/// Runs the net over a whole source in batches (the next block is read/decoded on a second thread while the
/// network runs), with a progress bar labelled `label`.
FeatureSet extract_features(FeatureNet& net, datasets::ImageSource& source, int64_t batch_size,
                            const std::string& label);

}  // namespace moh::eval

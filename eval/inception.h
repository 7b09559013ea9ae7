#pragma once
// The "FID Inception" v3 network (the TF 2015-12-05 graph as ported by pytorch-fid / torch-fidelity), which every
// FID / sFID / IS / precision / recall number in the ADM and DiT papers comes from. Differences from torchvision's
// inception_v3: the pool branches of Mixed_5*/6*/7b average with count_include_pad=False, Mixed_7c max-pools, the
// classifier has 1008 outputs, no aux head, no transform_input; BatchNorm eps 1e-3. Module names equal the
// pytorch-fid state_dict keys (Conv2d_1a_3x3.conv.weight, Mixed_6d.branch1x1.bn.running_var, fc.weight, ...).
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <string>

#include "core/config_schema.h"
#include "vision/nn/linear.h"

namespace moh::eval {

/// Classes of the TF graph's softmax (1000 ImageNet classes + 8 unused).
constexpr int64_t kInceptionClasses = 1008;
/// Input side the network is run at.
constexpr int64_t kInceptionSize = 299;
/// pool_3 feature width (FID, precision/recall).
constexpr int64_t kInceptionPoolDim = 2048;
/// Channels of Mixed_6d.branch1x1 kept for sFID (ADM: spatial[..., :7]), 7·17·17 = 2023 dims.
constexpr int64_t kSpatialChannels = 7;
/// BatchNorm epsilon of the TF graph.
constexpr double kInceptionBnEps = 1e-3;
/// Parameter count of the network (torchvision inception_v3 with 1008 classes and no aux head, whose blocks
/// pytorch-fid replaces with same-sized ones).
constexpr int64_t kInceptionParams = 23850960;

/// Conv (no bias) → BatchNorm(eps 1e-3) → ReLU.
struct BasicConv2dImpl : torch::nn::Module {
  BasicConv2dImpl(int64_t in, int64_t out, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {1, 1},
                  std::array<int64_t, 2> padding = {0, 0});
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(BasicConv2d);

/// Mixed_5b/5c/5d (FIDInceptionA): 1×1 | 5×5 | double 3×3 | avg-pool (no padded zeros) + 1×1.
struct InceptionAImpl : torch::nn::Module {
  InceptionAImpl(int64_t in, int64_t pool_features);
  at::Tensor forward(const at::Tensor& x);
  BasicConv2d branch1x1{nullptr}, branch5x5_1{nullptr}, branch5x5_2{nullptr}, branch3x3dbl_1{nullptr},
      branch3x3dbl_2{nullptr}, branch3x3dbl_3{nullptr}, branch_pool{nullptr};
};
TORCH_MODULE(InceptionA);

/// Mixed_6a (InceptionB): stride-2 3×3 | double 3×3 | max-pool.
struct InceptionBImpl : torch::nn::Module {
  explicit InceptionBImpl(int64_t in);
  at::Tensor forward(const at::Tensor& x);
  BasicConv2d branch3x3{nullptr}, branch3x3dbl_1{nullptr}, branch3x3dbl_2{nullptr}, branch3x3dbl_3{nullptr};
};
TORCH_MODULE(InceptionB);

/// Mixed_6b..6e (FIDInceptionC): 1×1 | 1×7,7×1 | double factorised 7×7 | avg-pool + 1×1.
struct InceptionCImpl : torch::nn::Module {
  InceptionCImpl(int64_t in, int64_t channels_7x7);
  /// Concatenated output; if `branch1x1_out` is given it receives the 1×1 branch (the sFID tap of Mixed_6d).
  at::Tensor forward(const at::Tensor& x, at::Tensor* branch1x1_out = nullptr);
  BasicConv2d branch1x1{nullptr}, branch7x7_1{nullptr}, branch7x7_2{nullptr}, branch7x7_3{nullptr},
      branch7x7dbl_1{nullptr}, branch7x7dbl_2{nullptr}, branch7x7dbl_3{nullptr}, branch7x7dbl_4{nullptr},
      branch7x7dbl_5{nullptr}, branch_pool{nullptr};
};
TORCH_MODULE(InceptionC);

/// Mixed_7a (InceptionD): 3×3 stride 2 | 7×7×3 stride 2 | max-pool.
struct InceptionDImpl : torch::nn::Module {
  explicit InceptionDImpl(int64_t in);
  at::Tensor forward(const at::Tensor& x);
  BasicConv2d branch3x3_1{nullptr}, branch3x3_2{nullptr}, branch7x7x3_1{nullptr}, branch7x7x3_2{nullptr},
      branch7x7x3_3{nullptr}, branch7x7x3_4{nullptr};
};
TORCH_MODULE(InceptionD);

/// Mixed_7b (FIDInceptionE_1, avg-pool) and Mixed_7c (FIDInceptionE_2, max-pool — the TF graph's quirk).
struct InceptionEImpl : torch::nn::Module {
  InceptionEImpl(int64_t in, bool max_pool);
  at::Tensor forward(const at::Tensor& x);
  BasicConv2d branch1x1{nullptr}, branch3x3_1{nullptr}, branch3x3_2a{nullptr}, branch3x3_2b{nullptr},
      branch3x3dbl_1{nullptr}, branch3x3dbl_2{nullptr}, branch3x3dbl_3a{nullptr}, branch3x3dbl_3b{nullptr},
      branch_pool{nullptr};
  bool max_pool;
};
TORCH_MODULE(InceptionE);

/// The three feature sets every metric needs, from one pass.
struct InceptionFeatures {
  at::Tensor pool;     ///< (B, 2048) pool_3
  at::Tensor spatial;  ///< (B, 2023) mixed_6/conv: Mixed_6d.branch1x1[:, :7] flattened in NHWC order
  at::Tensor logits;   ///< (B, 1008) pool_3 @ fc.weightᵀ, no bias (ADM's IS input)
};

/// How images are resized to 299 and normalised.
enum class InceptionResize {
  tf1,      ///< TF1 legacy bilinear (src = dst·in/out), (x − 128)/128 — ADM / torch-fidelity parity (default)
  pytorch,  ///< F.interpolate bilinear, align_corners=False, 2·x/255 − 1 — pytorch-fid parity
};

const config::EnumTable<InceptionResize>& enum_table(InceptionResize);

/// The FID Inception network.
struct FIDInceptionV3Impl : torch::nn::Module {
  FIDInceptionV3Impl();
  /// Features of a normalised (B, 3, 299, 299) float batch.
  InceptionFeatures forward(const at::Tensor& x);

  BasicConv2d Conv2d_1a_3x3{nullptr}, Conv2d_2a_3x3{nullptr}, Conv2d_2b_3x3{nullptr}, Conv2d_3b_1x1{nullptr},
      Conv2d_4a_3x3{nullptr};
  InceptionA Mixed_5b{nullptr}, Mixed_5c{nullptr}, Mixed_5d{nullptr};
  InceptionB Mixed_6a{nullptr};
  InceptionC Mixed_6b{nullptr}, Mixed_6c{nullptr}, Mixed_6d{nullptr}, Mixed_6e{nullptr};
  InceptionD Mixed_7a{nullptr};
  InceptionE Mixed_7b{nullptr}, Mixed_7c{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(FIDInceptionV3);

/// TF1 legacy bilinear resize of a float (B, C, H, W) batch: src = dst·(in/out), lower index floor(src), upper
/// min(lower+1, in−1), no antialias (torch-fidelity's interpolate_bilinear_2d_like_tensorflow1x).
at::Tensor resize_bilinear_tf1(const at::Tensor& x, int64_t out_h, int64_t out_w);

/// uint8 (B, H, W, C) images (C = 1 or 3; grey is replicated) → the network's normalised (B, 3, 299, 299) input.
at::Tensor inception_preprocess(const at::Tensor& images_u8, InceptionResize mode);

/// Loads pytorch-fid / torch-fidelity weights: the .pth as published, or safetensors (num_batches_tracked optional). A
/// missing file is a UserError saying how to obtain and convert it.
void load_inception_weights(FIDInceptionV3& net, const std::string& path);

}  // namespace moh::eval

#include "eval/inception.h"

#include <torch/nn/functional/pooling.h>

#include <filesystem>

#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/io/torch_file.h"
#include "core/train/checkpoint.h"

namespace moh::eval {

const config::EnumTable<InceptionResize>& enum_table(InceptionResize) {
  static const config::EnumTable<InceptionResize> t{{InceptionResize::tf1, "tf1"},
                                                    {InceptionResize::pytorch, "pytorch"}};
  return t;
}

namespace {

// TF's average pool ignores padded zeros (pytorch-fid: count_include_pad=False).
at::Tensor avg_pool_3x3_same(const at::Tensor& x) {
  return at::avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}, false, false);
}
at::Tensor max_pool_3x3_same(const at::Tensor& x) {
  return at::max_pool2d(x, {3, 3}, {1, 1}, {1, 1});
}
at::Tensor max_pool_3x3_s2(const at::Tensor& x) {
  return at::max_pool2d(x, {3, 3}, {2, 2});
}

// Holders forward their arguments as a template pack, which cannot take braced lists: build through a function.
BasicConv2d basic_conv(int64_t in, int64_t out, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {1, 1},
                       std::array<int64_t, 2> padding = {0, 0}) {
  return BasicConv2d(in, out, kernel, stride, padding);
}

}  // namespace

BasicConv2dImpl::BasicConv2dImpl(int64_t in, int64_t out, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                                 std::array<int64_t, 2> padding) {
  conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, {kernel[0], kernel[1]})
                                                       .stride({stride[0], stride[1]})
                                                       .padding({padding[0], padding[1]})
                                                       .bias(false)));
  bn = register_module("bn", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(out).eps(kInceptionBnEps)));
}

at::Tensor BasicConv2dImpl::forward(const at::Tensor& x) {
  return at::relu(bn->forward(conv->forward(x)));
}

InceptionAImpl::InceptionAImpl(int64_t in, int64_t pool_features) {
  branch1x1 = register_module("branch1x1", basic_conv(in, 64, {1, 1}));
  branch5x5_1 = register_module("branch5x5_1", basic_conv(in, 48, {1, 1}));
  branch5x5_2 = register_module("branch5x5_2", basic_conv(48, 64, {5, 5}, {1, 1}, {2, 2}));
  branch3x3dbl_1 = register_module("branch3x3dbl_1", basic_conv(in, 64, {1, 1}));
  branch3x3dbl_2 = register_module("branch3x3dbl_2", basic_conv(64, 96, {3, 3}, {1, 1}, {1, 1}));
  branch3x3dbl_3 = register_module("branch3x3dbl_3", basic_conv(96, 96, {3, 3}, {1, 1}, {1, 1}));
  branch_pool = register_module("branch_pool", basic_conv(in, pool_features, {1, 1}));
}

at::Tensor InceptionAImpl::forward(const at::Tensor& x) {
  return at::cat({branch1x1->forward(x), branch5x5_2->forward(branch5x5_1->forward(x)),
                  branch3x3dbl_3->forward(branch3x3dbl_2->forward(branch3x3dbl_1->forward(x))),
                  branch_pool->forward(avg_pool_3x3_same(x))},
                 1);
}

InceptionBImpl::InceptionBImpl(int64_t in) {
  branch3x3 = register_module("branch3x3", basic_conv(in, 384, {3, 3}, {2, 2}));
  branch3x3dbl_1 = register_module("branch3x3dbl_1", basic_conv(in, 64, {1, 1}));
  branch3x3dbl_2 = register_module("branch3x3dbl_2", basic_conv(64, 96, {3, 3}, {1, 1}, {1, 1}));
  branch3x3dbl_3 = register_module("branch3x3dbl_3", basic_conv(96, 96, {3, 3}, {2, 2}));
}

at::Tensor InceptionBImpl::forward(const at::Tensor& x) {
  return at::cat({branch3x3->forward(x), branch3x3dbl_3->forward(branch3x3dbl_2->forward(branch3x3dbl_1->forward(x))),
                  max_pool_3x3_s2(x)},
                 1);
}

InceptionCImpl::InceptionCImpl(int64_t in, int64_t c7) {
  const std::array<int64_t, 2> one{1, 1}, row{1, 7}, col{7, 1}, pad_row{0, 3}, pad_col{3, 0};
  branch1x1 = register_module("branch1x1", basic_conv(in, 192, one));
  branch7x7_1 = register_module("branch7x7_1", basic_conv(in, c7, one));
  branch7x7_2 = register_module("branch7x7_2", basic_conv(c7, c7, row, one, pad_row));
  branch7x7_3 = register_module("branch7x7_3", basic_conv(c7, 192, col, one, pad_col));
  branch7x7dbl_1 = register_module("branch7x7dbl_1", basic_conv(in, c7, one));
  branch7x7dbl_2 = register_module("branch7x7dbl_2", basic_conv(c7, c7, col, one, pad_col));
  branch7x7dbl_3 = register_module("branch7x7dbl_3", basic_conv(c7, c7, row, one, pad_row));
  branch7x7dbl_4 = register_module("branch7x7dbl_4", basic_conv(c7, c7, col, one, pad_col));
  branch7x7dbl_5 = register_module("branch7x7dbl_5", basic_conv(c7, 192, row, one, pad_row));
  branch_pool = register_module("branch_pool", basic_conv(in, 192, one));
}

at::Tensor InceptionCImpl::forward(const at::Tensor& x, at::Tensor* branch1x1_out) {
  at::Tensor b1 = branch1x1->forward(x);  // (B, 192, 17, 17)
  if (branch1x1_out) *branch1x1_out = b1;
  at::Tensor b7 = branch7x7_3->forward(branch7x7_2->forward(branch7x7_1->forward(x)));
  at::Tensor bd = branch7x7dbl_1->forward(x);
  bd = branch7x7dbl_5->forward(branch7x7dbl_4->forward(branch7x7dbl_3->forward(branch7x7dbl_2->forward(bd))));
  return at::cat({b1, b7, bd, branch_pool->forward(avg_pool_3x3_same(x))}, 1);
}

InceptionDImpl::InceptionDImpl(int64_t in) {
  const std::array<int64_t, 2> one{1, 1};
  branch3x3_1 = register_module("branch3x3_1", basic_conv(in, 192, one));
  branch3x3_2 = register_module("branch3x3_2", basic_conv(192, 320, {3, 3}, {2, 2}));
  branch7x7x3_1 = register_module("branch7x7x3_1", basic_conv(in, 192, one));
  branch7x7x3_2 = register_module("branch7x7x3_2", basic_conv(192, 192, {1, 7}, one, {0, 3}));
  branch7x7x3_3 = register_module("branch7x7x3_3", basic_conv(192, 192, {7, 1}, one, {3, 0}));
  branch7x7x3_4 = register_module("branch7x7x3_4", basic_conv(192, 192, {3, 3}, {2, 2}));
}

at::Tensor InceptionDImpl::forward(const at::Tensor& x) {
  at::Tensor b3 = branch3x3_2->forward(branch3x3_1->forward(x));
  at::Tensor b7 = branch7x7x3_4->forward(branch7x7x3_3->forward(branch7x7x3_2->forward(branch7x7x3_1->forward(x))));
  return at::cat({b3, b7, max_pool_3x3_s2(x)}, 1);
}

InceptionEImpl::InceptionEImpl(int64_t in, bool max_pool_branch) : max_pool(max_pool_branch) {
  const std::array<int64_t, 2> one{1, 1};
  branch1x1 = register_module("branch1x1", basic_conv(in, 320, one));
  branch3x3_1 = register_module("branch3x3_1", basic_conv(in, 384, one));
  branch3x3_2a = register_module("branch3x3_2a", basic_conv(384, 384, {1, 3}, one, {0, 1}));
  branch3x3_2b = register_module("branch3x3_2b", basic_conv(384, 384, {3, 1}, one, {1, 0}));
  branch3x3dbl_1 = register_module("branch3x3dbl_1", basic_conv(in, 448, one));
  branch3x3dbl_2 = register_module("branch3x3dbl_2", basic_conv(448, 384, {3, 3}, one, one));
  branch3x3dbl_3a = register_module("branch3x3dbl_3a", basic_conv(384, 384, {1, 3}, one, {0, 1}));
  branch3x3dbl_3b = register_module("branch3x3dbl_3b", basic_conv(384, 384, {3, 1}, one, {1, 0}));
  branch_pool = register_module("branch_pool", basic_conv(in, 192, one));
}

at::Tensor InceptionEImpl::forward(const at::Tensor& x) {
  at::Tensor b3 = branch3x3_1->forward(x);
  b3 = at::cat({branch3x3_2a->forward(b3), branch3x3_2b->forward(b3)}, 1);
  at::Tensor bd = branch3x3dbl_2->forward(branch3x3dbl_1->forward(x));
  bd = at::cat({branch3x3dbl_3a->forward(bd), branch3x3dbl_3b->forward(bd)}, 1);
  at::Tensor pooled = max_pool ? max_pool_3x3_same(x) : avg_pool_3x3_same(x);
  return at::cat({branch1x1->forward(x), b3, bd, branch_pool->forward(pooled)}, 1);
}

FIDInceptionV3Impl::FIDInceptionV3Impl() {
  Conv2d_1a_3x3 = register_module("Conv2d_1a_3x3", basic_conv(3, 32, {3, 3}, {2, 2}));
  Conv2d_2a_3x3 = register_module("Conv2d_2a_3x3", basic_conv(32, 32, {3, 3}));
  Conv2d_2b_3x3 = register_module("Conv2d_2b_3x3", basic_conv(32, 64, {3, 3}, {1, 1}, {1, 1}));
  Conv2d_3b_1x1 = register_module("Conv2d_3b_1x1", basic_conv(64, 80, {1, 1}));
  Conv2d_4a_3x3 = register_module("Conv2d_4a_3x3", basic_conv(80, 192, {3, 3}));
  Mixed_5b = register_module("Mixed_5b", InceptionA(192, 32));
  Mixed_5c = register_module("Mixed_5c", InceptionA(256, 64));
  Mixed_5d = register_module("Mixed_5d", InceptionA(288, 64));
  Mixed_6a = register_module("Mixed_6a", InceptionB(288));
  Mixed_6b = register_module("Mixed_6b", InceptionC(768, 128));
  Mixed_6c = register_module("Mixed_6c", InceptionC(768, 160));
  Mixed_6d = register_module("Mixed_6d", InceptionC(768, 160));
  Mixed_6e = register_module("Mixed_6e", InceptionC(768, 192));
  Mixed_7a = register_module("Mixed_7a", InceptionD(768));
  Mixed_7b = register_module("Mixed_7b", InceptionE(1280, false));
  Mixed_7c = register_module("Mixed_7c", InceptionE(2048, true));
  fc = register_module("fc", nn::Linear(kInceptionPoolDim, kInceptionClasses));
}

InceptionFeatures FIDInceptionV3Impl::forward(const at::Tensor& input) {
  at::Tensor x = Conv2d_1a_3x3->forward(input);                            // (B, 32, 149, 149)
  x = Conv2d_2b_3x3->forward(Conv2d_2a_3x3->forward(x));                   // (B, 64, 147, 147)
  x = max_pool_3x3_s2(x);                                                  // (B, 64, 73, 73)
  x = max_pool_3x3_s2(Conv2d_4a_3x3->forward(Conv2d_3b_1x1->forward(x)));  // (B, 192, 35, 35)
  x = Mixed_5d->forward(Mixed_5c->forward(Mixed_5b->forward(x)));          // (B, 288, 35, 35)
  x = Mixed_6a->forward(x);                                                // (B, 768, 17, 17)
  x = Mixed_6c->forward(Mixed_6b->forward(x));
  at::Tensor tap;
  x = Mixed_6e->forward(Mixed_6d->forward(x, &tap));               // tap: (B, 192, 17, 17)
  x = Mixed_7c->forward(Mixed_7b->forward(Mixed_7a->forward(x)));  // (B, 2048, 8, 8)
  InceptionFeatures f;
  f.pool = x.mean({2, 3});                                                                        // (B, 2048)
  f.spatial = tap.narrow(1, 0, kSpatialChannels).permute({0, 2, 3, 1}).reshape({x.size(0), -1});  // (B, 2023) NHWC
  f.logits = at::matmul(f.pool, fc->weight.t());                                                  // (B, 1008), no bias
  return f;
}

at::Tensor resize_bilinear_tf1(const at::Tensor& x, int64_t out_h, int64_t out_w) {
  const int64_t in_h = x.size(2), in_w = x.size(3);
  auto axis = [&](int64_t in, int64_t out) {
    // TF1 computes the scale in float32 and the source coordinate as dst·scale.
    const float scale = static_cast<float>(in) / static_cast<float>(out);
    at::Tensor src = at::arange(out, x.options().dtype(at::kFloat)) * scale;
    at::Tensor lo = src.floor().to(at::kLong).clamp_max(in - 1);
    at::Tensor hi = (lo + 1).clamp_max(in - 1);
    at::Tensor frac = (src - lo.to(at::kFloat)).to(x.scalar_type());
    return std::make_tuple(lo, hi, frac);
  };
  auto [y0, y1, dy] = axis(in_h, out_h);
  auto [x0, x1, dx] = axis(in_w, out_w);
  at::Tensor top = x.index_select(2, y0), bottom = x.index_select(2, y1);  // (B, C, out_h, in_w)
  dx = dx.view({1, 1, 1, out_w});
  at::Tensor tl = top.index_select(3, x0), tr = top.index_select(3, x1);
  at::Tensor bl = bottom.index_select(3, x0), br = bottom.index_select(3, x1);
  at::Tensor t = tl + (tr - tl) * dx, b = bl + (br - bl) * dx;  // (B, C, out_h, out_w)
  return t + (b - t) * dy.view({1, 1, out_h, 1});
}

at::Tensor inception_preprocess(const at::Tensor& images_u8, InceptionResize mode) {
  TORCH_CHECK(images_u8.dim() == 4 && images_u8.scalar_type() == at::kByte, "inception_preprocess: (B, H, W, C) uint8");
  at::Tensor x = images_u8.permute({0, 3, 1, 2}).to(at::kFloat);  // (B, C, H, W) in [0, 255]
  if (x.size(1) == 1) x = x.expand({-1, 3, -1, -1});
  if (mode == InceptionResize::tf1) {
    if (x.size(2) != kInceptionSize || x.size(3) != kInceptionSize)
      x = resize_bilinear_tf1(x, kInceptionSize, kInceptionSize);
    return (x - 128.0) / 128.0;
  }
  x = x / 255.0;
  if (x.size(2) != kInceptionSize || x.size(3) != kInceptionSize)
    x = at::upsample_bilinear2d(x, {kInceptionSize, kInceptionSize}, false, c10::nullopt, c10::nullopt);
  return 2.0 * x - 1.0;
}

void load_inception_weights(FIDInceptionV3& net, const std::string& path) {
  if (!std::filesystem::is_regular_file(path))
    throw UserError("inception weights " + path, "no such file",
                    "use pytorch-fid's pt_inception-2015-12-05-6726825d.pth (read as it is) or a safetensors "
                    "conversion of it; see docs/EVALUATION.md");
  load_module_tensors(*net, load_weights_file(path, ""), path);
}

}  // namespace moh::eval

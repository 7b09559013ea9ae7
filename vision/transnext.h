#pragma once
// TransNeXt (Shi, CVPR 2024; DaiShiResearch/TransNeXt@c8a9974 classification/transnext.py + attention_native.py) and
// MoH-ViT (SkyworkAI/MoH MoH-ViT, the same backbone with MoH head routing). Stages 1–3 use aggregated attention (a 3×3
// sliding window plus pooled keys under one softmax, length-scaled cosine attention with a learnable temperature,
// query embedding, learnable tokens/bias, log-spaced CPB bias); stage 4 uses full attention with the same machinery.
// The head routing is the shared HeadRouter of vision/nn/moh_attention.h. Registered names equal the official keys
// (patch_embed1.proj, block1.0.attn.q, block3.2.attn.wg, block4.0.attn.qkv, block1.0.mlp.dwconv.dwconv, norm4, head).
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "vision/nn/linear.h"
#include "vision/nn/moh_attention.h"

namespace moh::vision {

/// Options of the TransNeXt / MoH-ViT family (4 stages).
struct TransNeXtOptions {
  int64_t img_size = 224;     ///< input side; feature maps are fixed at construction (as in the official model)
  int64_t pretrain_size = 0;  ///< 0 = img_size; rescales the CPB coordinates when fine-tuning at another size
  int64_t in_chans = 3;
  int64_t num_classes = 1000;
  int64_t patch_size = 4;  ///< stem stride (kernel 2·p − 1); 2 for the small-input variants
  std::array<int64_t, 4> embed_dims{72, 144, 288, 576};
  std::array<int64_t, 4> num_heads{3, 6, 12, 24};
  std::array<int64_t, 4> mlp_ratios{8, 8, 4, 4};
  std::array<int64_t, 4> depths{2, 2, 15, 2};
  std::array<int64_t, 4> sr_ratios{8, 4, 2, 1};  ///< 1 = full attention (stage 4)
  std::array<AttentionMode, 4> attention{AttentionMode::mha, AttentionMode::mha, AttentionMode::mha,
                                         AttentionMode::mha};
  std::array<int64_t, 4> shared_heads{0, 0, 0, 0};  ///< MoH h_s per stage
  std::array<int64_t, 4> topk{0, 0, 0, 0};          ///< MoH K (MoA: experts) per stage
  double drop_path_rate = 0.0;
  bool qkv_bias = true;
  /// MoH layers: dense, sparse, or automatic = dense for every classifier layer (no sparse training layer measured
  /// faster than its dense one since the dense window runs through the sliding-window ops: docs/BENCHMARKS.md,
  /// "MoH-ViT attention"); sparse stays available (inference-only gains at stage 3).
  AttentionPath attention_path = AttentionPath::automatic;
  RouterKind router = RouterKind::learned;  ///< MoH layers' router (learned or query_norm)
  FusedMode fused = FusedMode::automatic;   ///< MoH layers' fused router and head gates (model.fused)
  bool grad_checkpoint = false;             ///< training: recompute each block's activations in the backward pass
  /// >= 0: each module's (and parameter's) initial weights drawn from a generator seeded by (init_seed, its name), so
  /// that variants of one seed start equal where they share it (train.paired); < 0: one stream in module order.
  int64_t init_seed = -1;

  /// Feature-map side of stage i at the input size (and at the pretraining size).
  int64_t stage_size(int64_t i) const;
  int64_t pretrain_stage_size(int64_t i) const;
  /// Attention options of one block of stage i (dims, heads, MoH split).
  nn::MoHAttentionOptions stage_attention(int64_t i) const;
  /// Σ active heads / Σ heads over all blocks (the paper's "activated heads").
  double active_ratio() const;
  int64_t routed_layers() const;
  int64_t total_layers() const { return depths[0] + depths[1] + depths[2] + depths[3]; }
  /// Throws UserError (sizes not divisible, 1×1 maps that would make the CPB coordinates NaN, bad MoH splits).
  void validate() const;
};

/// Log-spaced continuous relative position coordinates between a query grid and the pooled key grid
/// (`get_relative_position_cpb`): returns (table (T, 2) of unique coordinates, index (Nq·Nk) into it), as
/// at::unique_dim(coordinates, 0, sorted, inverse) orders them.
std::pair<at::Tensor, at::Tensor> relative_position_cpb(int64_t q_h, int64_t q_w, int64_t k_h, int64_t k_w,
                                                        int64_t pretrain_h, int64_t pretrain_w);

/// Each head's position bias (h, Nq, Nk) from the CPB MLP's output b (T, h): row `index` (Nq·Nk, into T) of each
/// head's column; as b.t().index_select(1, index), with a backward that is one loop in LibTorch 1.13.
at::Tensor gather_bias(const at::Tensor& b, const at::Tensor& index, int64_t nq, int64_t nk);

/// Aggregated attention (stages with sr_ratio > 1) or full TransNeXt attention (sr_ratio == 1), with optional MoH/MoA
/// head routing applied to each head's output before `proj`.
struct TransNeXtAttentionImpl : torch::nn::Module, nn::HeadControl {
  TransNeXtAttentionImpl(const nn::MoHAttentionOptions& heads, int64_t height, int64_t width, int64_t sr_ratio);
  /// x (B, N, C) normalised tokens; the stage's CPB table/index (shared by its blocks).
  nn::AttentionOutput forward(const at::Tensor& x, const at::Tensor& cpb_table, const at::Tensor& cpb_index);
  /// Neighbour-by-neighbour reference of the local branch, for tests (slow, same math as forward's unfold).
  nn::AttentionOutput forward_reference(const at::Tensor& x, const at::Tensor& cpb_table, const at::Tensor& cpb_index);

  int64_t head_count() const override { return options.num_heads; }
  int64_t shared_count() const override { return router.shared; }
  int64_t routed_topk() const override { return router.topk; }
  void set_routed_topk(int64_t k) override {
    router.set_topk(k);
    if (router.topk > 0) options.topk = router.topk;
  }
  void set_plain_router(bool on) override { router.plain = on; }
  void set_fused_ops(FusedMode mode) override { options.fused_ops = router.fused = mode; }
  std::vector<nn::HeadTensor> head_tensors() const override;

  nn::MoHAttentionOptions options;
  int64_t H, W, sr_ratio, pool_h = 0, pool_w = 0;
  bool aggregated;
  nn::Linear q{nullptr}, kv{nullptr}, qkv{nullptr}, proj{nullptr}, cpb_fc1{nullptr}, cpb_fc2{nullptr};
  torch::nn::Conv2d sr{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  at::Tensor temperature, query_embedding, relative_pos_bias_local, learnable_tokens, learnable_bias;
  at::Tensor seq_length_scale, padding_mask;  // non-persistent buffers: (N, 1), (N, 9)
  at::Tensor neighbours;                      // (N, 9) token index of each window slot, −1 outside the map
  nn::HeadRouter router;
  /// Dense aggregated path: the 3×3 window through the sliding-window ops (vision/sliding_window_op.h; CPU, and CUDA
  /// with options.fused) rather than im2col + matmul (the official native code's unfold; false = that path).
  bool window_kernels = true;

 private:
  nn::AttentionOutput run(const at::Tensor& x, const at::Tensor& cpb_table, const at::Tensor& cpb_index,
                          bool reference);
  nn::HeadRouting route(const at::Tensor& x);  // no routing for MHA layers
  /// Per-head outputs (B, h, N, d) before gating; tau = softplus(temperature) (h, 1, 1), len_scale (N, 1).
  at::Tensor full_attention(const at::Tensor& x, const at::Tensor& tau, const at::Tensor& len_scale,
                            const at::Tensor& cpb_table, const at::Tensor& cpb_index);
  at::Tensor aggregated_attention(const at::Tensor& x, const at::Tensor& tau, const at::Tensor& len_scale,
                                  const at::Tensor& cpb_table, const at::Tensor& cpb_index, bool reference);
  std::vector<at::Tensor> pooled_kv(const at::Tensor& x);  // (B, h, P, d) pooled keys (not normalised), values
  /// The sparse path: (B, N, C) gated head outputs, computed for the selected (token, head) pairs only.
  at::Tensor mix_sparse(const at::Tensor& x, const at::Tensor& tau, const at::Tensor& len_scale,
                        const at::Tensor& cpb_table, const at::Tensor& cpb_index, const nn::HeadRouting& routing);
};
TORCH_MODULE(TransNeXtAttention);

/// Depthwise 3×3 convolution on tokens (name `dwconv` inside, as in the official DWConv).
struct DWConvImpl : torch::nn::Module {
  explicit DWConvImpl(int64_t dim);
  at::Tensor forward(const at::Tensor& x, int64_t H, int64_t W);
  torch::nn::Conv2d dwconv{nullptr};
};
TORCH_MODULE(DWConv);

/// Convolutional GLU: fc1 → (gate, value); GELU(DWConv(gate)) · value → fc2. Hidden = int(2·hidden/3).
struct ConvolutionalGLUImpl : torch::nn::Module {
  ConvolutionalGLUImpl(int64_t dim, int64_t hidden);
  at::Tensor forward(const at::Tensor& x, int64_t H, int64_t W);
  nn::Linear fc1{nullptr}, fc2{nullptr};
  DWConv dwconv{nullptr};
};
TORCH_MODULE(ConvolutionalGLU);

/// Pre-norm block: x + DropPath(attn(norm1 x)), then x + DropPath(mlp(norm2 x)).
struct TransNeXtBlockImpl : torch::nn::Module {
  TransNeXtBlockImpl(const nn::MoHAttentionOptions& heads, int64_t height, int64_t width, int64_t sr_ratio,
                     int64_t mlp_ratio, double drop_path);
  nn::AttentionOutput forward(const at::Tensor& x, const at::Tensor& cpb_table, const at::Tensor& cpb_index);
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  TransNeXtAttention attn{nullptr};
  ConvolutionalGLU mlp{nullptr};
  double drop_path;
  int64_t H, W;
};
TORCH_MODULE(TransNeXtBlock);

/// Overlapping patch embedding: Conv2d(k, stride, pad k/2) → tokens → LayerNorm (eps 1e-5).
struct OverlapPatchEmbedImpl : torch::nn::Module {
  OverlapPatchEmbedImpl(int64_t in_chans, int64_t dim, int64_t kernel, int64_t stride);
  at::Tensor forward(const at::Tensor& x);  // (B, C, H, W) → (B, N, D)
  torch::nn::Conv2d proj{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(OverlapPatchEmbed);

/// Output of the classifier.
struct ClassifierOutput {
  at::Tensor logits;                 ///< (B, classes)
  at::Tensor features;               ///< (B, C4): pooled penultimate features (for FID-style metrics)
  at::Tensor stage3;                 ///< (B, H3, W3, C3): normalised stage-3 map (the sFID-style spatial features)
  std::array<at::Tensor, 4> stages;  ///< (B, H_s, W_s, C_s): every stage's normalised map (REPA's encoder tokens)
  at::Tensor aux_loss;               ///< mean MoH load-balance loss over routed layers (training), else undefined
  std::vector<at::Tensor> routed;    ///< per block (stage order): (B·N, K) selected heads, undefined if not routed
};

/// The TransNeXt / MoH-ViT classifier.
struct TransNeXtImpl : torch::nn::Module {
  explicit TransNeXtImpl(const TransNeXtOptions& options);
  ClassifierOutput forward(const at::Tensor& x);
  /// The official _init_weights: trunc-normal(0.02) Linear, He-normal(fan_out) conv, LN = (1, 0).
  void initialize_weights();

  TransNeXtOptions options;
  std::array<OverlapPatchEmbed, 4> patch_embed{nullptr, nullptr, nullptr, nullptr};
  std::array<torch::nn::ModuleList, 4> block{nullptr, nullptr, nullptr, nullptr};
  std::array<torch::nn::LayerNorm, 4> norm{nullptr, nullptr, nullptr, nullptr};
  std::array<at::Tensor, 4> cpb_table, cpb_index;  // per stage, non-persistent
  nn::Linear head{nullptr};
};
TORCH_MODULE(TransNeXt);

/// The classifier variant table: TransNeXt-Micro/Tiny/Small/Base, MoH-ViT-S-80/S-75/B-75/B-50 and the small-input
/// MoH-ViT-Nano / ViT-Nano.
const std::vector<std::pair<std::string, TransNeXtOptions>>& classifier_variants();
/// Looks a variant up; an unknown name is a UserError listing the valid ones.
TransNeXtOptions classifier_options(const std::string& name);

/// The official pooling, adaptive_avg_pool2d to (ph, pw): (B, C, H, W) -> (B, C, ph, pw). Its CUDA backward has no
/// deterministic kernel, so with deterministic kernels asked for (train.deterministic) on a GPU and a map the pool
/// divides evenly (every ImageNet stage), the same windows go through avg_pool2d, deterministic both ways.
at::Tensor average_pool(const at::Tensor& x, int64_t ph, int64_t pw, bool deterministic);

}  // namespace moh::vision

#pragma once
// DiT (Peebles & Xie 2023) and MoH-DiT (SkyworkAI/MoH MoH-DiT/models.py): latent diffusion transformers with
// adaLN-Zero blocks. Port of facebookresearch/DiT@ed81ce2 models.py; registered module names equal the official
// state_dict keys (x_embedder.proj, t_embedder.mlp.0, y_embedder.embedding_table, blocks.3.attn.qkv,
// blocks.3.attn.wg, blocks.3.adaLN_modulation.1, final_layer.linear, ...), so official checkpoints load by name.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/io/safetensors.h"
#include "vision/nn/linear.h"
#include "vision/nn/moh_attention.h"
#include "vision/nn/vit_layers.h"

namespace moh::diffusion {

/// A per-layer schedule written as runs of (value, count): {{3, 8}, {6, 4}} = 3 for 8 layers, then 6 for 4.
using LayerRuns = std::vector<std::pair<int64_t, int64_t>>;

/// Expands runs to one value per layer.
std::vector<int64_t> expand_runs(const LayerRuns& runs);

/// Options of the DiT family. MoH variants give per-layer heads/shared/top-K schedules (head_dim fixed).
struct DiTOptions {
  int64_t input_size = 32;  ///< latent (or pixel) side length
  int64_t patch_size = 2;
  int64_t in_channels = 4;
  int64_t hidden_size = 1152;
  int64_t depth = 28;
  int64_t num_heads = 16;  ///< heads of every layer unless `heads` is given
  int64_t head_dim = 0;    ///< 0 = hidden_size / num_heads
  double mlp_ratio = 4.0;
  double class_dropout_prob = 0.1;
  int64_t num_classes = 1000;
  bool learn_sigma = true;
  AttentionMode attention = AttentionMode::mha;
  LayerRuns heads, shared, topk;  ///< per-layer schedules (MoH); empty heads = num_heads everywhere
  AttentionPath path = AttentionPath::automatic;
  RouterKind router = RouterKind::learned;  ///< MoH layers' router (learned or query_norm)
  bool grad_checkpoint = false;             ///< training: recompute each block's activations in the backward pass
  FusedMode fused = FusedMode::automatic;   ///< fused block operations (model.fused; vision/nn/fused_ops.h)
  /// >= 0: each module's initial weights drawn from a generator seeded by (init_seed, its name), so that variants of
  /// one seed start equal where they share a module (train.paired); < 0: one stream in module order (DiT's).
  int64_t init_seed = -1;
  // LightningDiT's block options (off = DiT's block and names).
  NormKind norm = NormKind::layernorm;  ///< rmsnorm: norm1/norm2/norm_final RMSNorm with a scale
  MlpKind mlp = MlpKind::gelu;          ///< swiglu: mlp.w12 / mlp.w3 with hidden int(2/3 · mlp_ratio · D)
  PosKind pos = PosKind::sincos;        ///< rope2d: sincos + 2-D rotary q/k (feat_rope.freqs_cos / freqs_sin)
  bool qk_norm = false;                 ///< attn.q_norm / attn.k_norm with `norm`'s kind
  /// Overlapping output patches (model.overlap_output): each token predicts a 2p×2p window centred on its p×p patch
  /// (final_layer.linear: (2p)²·C_out outputs), and each pixel is the mean of the windows covering it weighted by a
  /// separable tent, so that neighbouring tokens blend linearly across a patch border instead of meeting at a step
  /// (the seams of a large-patch pixel model). Needs an even p.
  bool overlap_output = false;
  // REPA (diffusion/repa.h): one projector per encoder of block repa_depth's tokens, run in training mode only.
  int64_t repa_depth = 0;             ///< 1-based block whose output tokens are projected (REPA's encoder_depth)
  int64_t repa_projector_dim = 2048;  ///< hidden width of the projector MLP
  std::vector<int64_t> repa_z_dims;   ///< each encoder's feature width; empty = no projectors

  int64_t out_channels() const { return learn_sigma ? 2 * in_channels : in_channels; }
  /// Side of the square each token predicts: p, or 2p with overlap_output.
  int64_t output_window() const { return overlap_output ? 2 * patch_size : patch_size; }
  int64_t grid_size() const { return input_size / patch_size; }
  int64_t num_patches() const { return grid_size() * grid_size(); }
  /// Attention options of layer i (heads, head_dim, MoH split).
  nn::MoHAttentionOptions layer(int64_t i) const;
  /// Σ active heads / Σ heads over layers (how the paper counts "activated heads").
  double active_ratio() const;
  /// Number of layers whose attention routes heads (MoH with K > 0).
  int64_t routed_layers() const;
  /// Throws UserError on inconsistent options (schedule lengths, divisibility, ...).
  void validate() const;
};

/// SwiGLU feed-forward of a LightningDiT block (models/swiglu_ffn.py): w12 → (silu(x1) · x2) → w3.
struct SwiGLUImpl : torch::nn::Module {
  SwiGLUImpl(int64_t dim, int64_t hidden);
  at::Tensor forward(const at::Tensor& x);
  nn::Linear w12{nullptr}, w3{nullptr};
};
TORCH_MODULE(SwiGLU);

/// LightningDiT's `feat_rope`: the 2-D rotary tables every attention layer uses, as buffers (official keys
/// feat_rope.freqs_cos / freqs_sin), so they follow the model across devices.
struct RopeBuffersImpl : torch::nn::Module {
  RopeBuffersImpl(int64_t head_dim, int64_t grid);
  nn::RopeTables tables() const { return {freqs_cos, freqs_sin}; }
  at::Tensor freqs_cos, freqs_sin;
};
TORCH_MODULE(RopeBuffers);

/// Mlp of a DiT block (timm Mlp with DiT's approx_gelu: fc1 → GELU(tanh) → fc2) and its patch embedding.
using nn::Mlp;
using nn::PatchEmbed;

/// Sinusoidal timestep features (GLIDE: cos first, then sin; 256 dims, max period 10000) → MLP.
struct TimestepEmbedderImpl : torch::nn::Module {
  explicit TimestepEmbedderImpl(int64_t dim, int64_t frequency_dim = 256);
  static at::Tensor timestep_embedding(const at::Tensor& t, int64_t dim, double max_period = 10000.0);
  at::Tensor forward(const at::Tensor& t);
  torch::nn::Sequential mlp{nullptr};
  int64_t frequency_dim;
};
TORCH_MODULE(TimestepEmbedder);

/// Class embedding with an extra "null" row (index num_classes) used for classifier-free guidance; labels are
/// dropped to null with probability p in training mode.
struct LabelEmbedderImpl : torch::nn::Module {
  LabelEmbedderImpl(int64_t num_classes, int64_t dim, double dropout_prob);
  /// `force_drop` (N) bool/int: 1 = use the null class regardless of mode (CFG's unconditional half).
  at::Tensor forward(const at::Tensor& labels, const at::Tensor& force_drop = {});
  torch::nn::Embedding embedding_table{nullptr};
  int64_t num_classes;
  double dropout_prob;
};
TORCH_MODULE(LabelEmbedder);

/// Output of a DiT block or model: the tensor plus this layer's / the mean MoH load-balance loss.
struct DiTOutput {
  at::Tensor out;
  at::Tensor aux_loss;  ///< undefined when no routed layer ran in training mode
  at::Tensor routed;    ///< a block's (N·T, K) selected routed heads (undefined if not routed); unused for the model
  std::vector<at::Tensor> zs;  ///< REPA: per projector (N, T, z_dim), training mode only
};

/// adaLN-Zero transformer block (layer `layer` of `o`); with LightningDiT's options RMSNorm (`norm1`, `norm2`),
/// SwiGLU (`mlp.w12`, `mlp.w3`), qk_norm and the rotary tables `rope` in its attention.
struct DiTBlockImpl : torch::nn::Module {
  DiTBlockImpl(const DiTOptions& o, int64_t layer);
  DiTOutput forward(const at::Tensor& x, const at::Tensor& c, const nn::RopeTables& rope = {});
  /// Whether the fused operations run (model.fused): this block's LayerNorm + modulate, gates + residuals, the MLP's
  /// bias + GELU, and its attention's router and head gates.
  void set_fused_ops(FusedMode mode);
  nn::MoHAttention attn{nullptr};
  Mlp mlp{nullptr};
  SwiGLU swiglu{nullptr};                      ///< registered as `mlp` instead of the GELU Mlp (mlp: swiglu)
  nn::RMSNorm norm1{nullptr}, norm2{nullptr};  ///< norm: rmsnorm (else LayerNorm without parameters)
  torch::nn::Sequential adaLN_modulation{nullptr};
  int64_t dim;
  FusedMode fused = FusedMode::off;

 private:
  /// forward() by the fused operations (LayerNorm blocks); the same values up to rounding.
  DiTOutput forward_fused(const at::Tensor& x, const std::vector<at::Tensor>& mod, const nn::RopeTables& rope);
};
TORCH_MODULE(DiTBlock);

/// Final adaLN layer: (N, T, D) → (N, T, w·w·C_out), w the output window (p, or 2p when overlapping).
struct FinalLayerImpl : torch::nn::Module {
  /// `window`: the side of the square each token predicts (DiTOptions::output_window).
  FinalLayerImpl(int64_t dim, int64_t window, int64_t out_channels, NormKind norm = NormKind::layernorm);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& c);
  nn::Linear linear{nullptr};
  nn::RMSNorm norm_final{nullptr};  ///< norm: rmsnorm
  torch::nn::Sequential adaLN_modulation{nullptr};
  int64_t dim;
  FusedMode fused = FusedMode::off;  ///< LayerNorm + modulate in one pass (model.fused)
};
TORCH_MODULE(FinalLayer);

/// The DiT / MoH-DiT network.
struct DiTImpl : torch::nn::Module {
  explicit DiTImpl(const DiTOptions& options);
  /// x (N, C, H, W), t (N) original timesteps, y (N) labels → (N, C_out, H, W) and the mean aux loss over routed
  /// layers (training only).
  DiTOutput forward(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y, const at::Tensor& force_drop = {});
  /// (N, T, p·p·C) → (N, C, H, W); with overlap_output (N, T, 2p·2p·C) → (N, C, H, W) by overlap_add.
  at::Tensor unpatchify(const at::Tensor& x) const;
  /// DiT's initialize_weights(): xavier Linear, sin-cos pos_embed, N(0, .02) label/timestep, zero adaLN + final.
  void initialize_weights();
  /// model.fused for every block and the final layer (options.fused at construction; benchmarks and tests switch it).
  void set_fused_ops(FusedMode mode);

  /// Called after each forward when set (routing analytics while sampling, diffusion/head_load.h): every block's
  /// selected routed heads (N·T, K) (undefined for blocks without routing), the timesteps t (N) and the labels (N)
  /// the network saw (the null class num_classes for dropped ones).
  std::function<void(const std::vector<at::Tensor>&, const at::Tensor&, const at::Tensor&)> routing_observer;

  DiTOptions options;
  PatchEmbed x_embedder{nullptr};
  TimestepEmbedder t_embedder{nullptr};
  LabelEmbedder y_embedder{nullptr};
  at::Tensor pos_embed;  ///< (1, T, D), fixed (requires_grad false) but a parameter, as in the official code
  torch::nn::ModuleList blocks{nullptr};
  FinalLayer final_layer{nullptr};
  RopeBuffers feat_rope{nullptr};             ///< pos: rope2d
  torch::nn::ModuleList projectors{nullptr};  ///< REPA (repa_z_dims given)
};
TORCH_MODULE(DiT);

/// Overlap-add of (N, g·g, k·k·C) windows (k = 2p, layout (kh, kw, C) per token as DiT's patches) at stride p onto
/// an (N, C, g·p, g·p) image: each pixel the mean of the windows covering it, weighted by the tent
/// w(i) = min(i + ½, k − i − ½) / p in each axis (weights of two neighbouring windows sum to 1; at the image's border
/// the mean is over the one window there).
at::Tensor overlap_add(const at::Tensor& x, int64_t patch, int64_t channels, int64_t grid);

/// 2-D sin-cos position embedding (MAE): row k = r·G + c → [sin(c·ω), cos(c·ω), sin(r·ω), cos(r·ω)], float64.
at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid);

/// The variant table: "DiT-S/2" ... "DiT-XL/8", "MoH-DiT-S/2-90" ... "MoH-DiT-XL/2-75".
const std::vector<std::pair<std::string, DiTOptions>>& dit_variants();
/// Looks a variant up; an unknown name is a UserError listing the valid ones.
DiTOptions dit_options(const std::string& name);
/// `o` with input_size, in_channels, num_classes, class dropout and learn_sigma read off an official state_dict
/// (pos_embed, x_embedder.proj.weight, y_embedder.embedding_table.weight, final_layer.linear.weight; its rows also
/// tell overlap_output), so that e.g. the 512 px DiT-XL/2 file loads under the name DiT-XL/2. Tensors it cannot
/// interpret are left to the strict loader.
DiTOptions dit_options_for_weights(DiTOptions o, const TensorMap& w);

}  // namespace moh::diffusion

#pragma once
// What turning a dense model into MoH needs from its attention layers, for every family alike:
//   HeadHooks   — runtime instruments on the heads' outputs just before the output projection: a per-head scale (the
//                 learned shared-head masks) and a recorder of each head's mean contribution norm ‖o_i W_O^iᵀ‖₂ (head
//                 importance, measured on calibration batches);
//   HeadControl — the interface both attention classes (MoHAttention, TransNeXt attention) give: their hooks, their
//                 head split, and a runtime override of K (every routed head on = the dense model, with the routers
//                 of a converted checkpoint at zero);
//   HeadLayout / permute_heads — where a layer keeps per-head values in its state dict, and the reordering of heads
//                 that moves Q/K/V rows, output-projection columns and per-head parameters together (so the dense
//                 function is unchanged and the chosen shared heads come first).
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "vision/nn/model_config.h"

namespace moh::nn {

/// Instruments of one attention layer's head outputs (not parameters, not saved; unset = no effect).
struct HeadHooks {
  at::Tensor scale;     ///< (h): multiplies each head's output (before the projection); undefined = none
  bool record = false;  ///< accumulate each head's contribution norm
  at::Tensor norm_sum;  ///< (h) float64: Σ over tokens of ‖o_i W_O^iᵀ‖₂ (recorded)
  int64_t tokens = 0;   ///< tokens recorded

  /// mixed (B, N, h·d) head outputs in head-major order, proj_weight (C, h·d) → mixed with `scale` applied; records.
  at::Tensor apply(const at::Tensor& mixed, const at::Tensor& proj_weight, int64_t heads);
  /// The mean contribution norm per head (h), float64 on the CPU; zeros if nothing was recorded.
  at::Tensor mean_norms(int64_t heads) const;
};

/// One tensor holding per-head values: its dimension `axis` is `groups` head-major blocks of h equal parts
/// (qkv rows: 3 groups of h·d; kv rows: 2; q rows and proj columns: 1; temperature (h, 1, 1): 1 group of h).
struct HeadTensor {
  std::string name;  ///< suffix under the layer prefix, e.g. "qkv.weight"
  int64_t axis = 0, groups = 1;
};

/// What a model's attention layers expose to conversion and inference-time head budgets.
struct HeadControl {
  virtual ~HeadControl() = default;
  HeadHooks head_hooks;
  virtual int64_t head_count() const = 0;    ///< h
  virtual int64_t shared_count() const = 0;  ///< h_s (MoH), 0 otherwise
  /// Routed heads per token K (0 for mha and all-shared layers).
  virtual int64_t routed_topk() const = 0;
  /// Overrides K of a routed layer at run time (1 ≤ k ≤ h − h_s; a UserError outside); layers with K = 0 ignore it.
  virtual void set_routed_topk(int64_t k) = 0;
  /// The layer's tensors that hold per-head values (names under the layer's module name), router layers excepted.
  virtual std::vector<HeadTensor> head_tensors() const = 0;

  /// Routed picks per head (pool) int64 counted by the layer's training forwards since the last
  /// take_training_load(), on the layer's device (no host sync); undefined before the first. Not a buffer:
  /// checkpoints do not hold it.
  at::Tensor training_load;
  /// Adds one training forward's picks: `routed` (T, K) indices into the routed pool of `pool` heads, or `picks`
  /// (pool) int64 when the router already counted them.
  void count_training_picks(const at::Tensor& routed, int64_t pool, const at::Tensor& picks = {});
  /// Routes by the official op sequence (HeadRouter::plain) instead of the compact one: the reference of the parity
  /// test and of `moh bench train --router plain`.
  virtual void set_plain_router(bool on) = 0;
  /// Whether the fused router and head gates run (model.fused: on, off, or auto by the device's rule).
  virtual void set_fused_ops(FusedMode mode) = 0;
};

/// Every attention layer of `model` that exposes HeadControl, with its module name ("blocks.3.attn").
std::vector<std::pair<std::string, HeadControl*>> head_controls(torch::nn::Module& model);
/// HeadControl::set_plain_router on every attention layer of `model`.
void set_plain_routers(torch::nn::Module& model, bool on);
/// HeadControl::set_fused_ops on every attention layer of `model` (a DiT's blocks: DiTImpl::set_fused_ops).
void set_fused_attention(torch::nn::Module& model, FusedMode mode);

/// Every routed layer's training_load in module order ((h − h_s) counts; zeros where nothing was counted), each
/// reset: the trainer logs the head load of the steps since its last evaluation.
std::vector<at::Tensor> take_training_load(torch::nn::Module& model);

/// The per-head tensors of one attention layer in a state dict, and its MoH split in the target model.
struct HeadLayout {
  std::string prefix;  ///< module name, e.g. "blocks.3.attn"
  int64_t heads = 0, shared = 0, topk = 0;
  std::vector<HeadTensor> tensors;
};

/// Reorders the heads of one layer in `w`: new head j = old head perm[j], in every tensor of `layer` (absent
/// tensors, e.g. optional biases, are skipped). Exact: values move, none is recomputed.
void permute_heads(TensorMap& w, const HeadLayout& layer, const std::vector<int64_t>& perm);

/// The permutation that puts `shared` (old head indices) first, each part in ascending order of old index.
std::vector<int64_t> shared_first_permutation(int64_t heads, std::vector<int64_t> shared);

}  // namespace moh::nn

#pragma once
// The attention core shared by every attention layer: softmax(q kᵀ · scale + bias) v, and the two ways of mixing
// gated heads that MoH needs:
//   dense  — attend with every head, then multiply each head's output by its gate (the official MoH code; reference);
//   sparse — attend only for the (token, head) pairs whose gate is non-zero: the selected queries of each
//            (batch, head) group are gathered, attend to all keys/values of that head, and are scattered back.
// Both produce (B, N, h·d) ready for the output projection, with identical values and gradients up to float
// rounding (tests/vision/nn/test_attention.cpp checks ≤1e-5).
#include <ATen/ATen.h>
#include <torch/version.h>

#include <cstdint>
#include <vector>

#include "vision/nn/model_config.h"

namespace moh::nn {

/// Whether this LibTorch has scaled_dot_product_attention with an explicit scale (≥ 2.1): the fused/flash path.
constexpr bool kFusedAttentionAvailable = TORCH_VERSION_MAJOR > 2 ||
                                          (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1);

/// The path `automatic` resolves to for a DiT MoH layer with `active` = (h_s + K) / h of its heads on, over sequences
/// of `tokens`, on `device`: the faster of dense and sparse for a training step (forward + backward) as measured on
/// this LibTorch on a CPU (docs/BENCHMARKS.md, "attention_path: auto"); dense and sparse are returned as given. The
/// CPU rule, LibTorch 2.x: sparse when tokens ≥ 1024 and active ≤ 0.85, or tokens ≥ 256 and active ≤ 0.6, else
/// dense; LibTorch 1.13 the same (re-measured once its OpenMP workers stopped spinning on OpenBLAS's cores).
/// On a GPU: dense (the sparse path was the slower one at every MoH-ViT shape measured on an H200: docs/BENCHMARKS.md,
/// "GPU").
AttentionPath choose_attention_path(AttentionPath requested, double active, int64_t tokens,
                                    const c10::Device& device = c10::Device(c10::kCPU));

/// Where a rule of `automatic` is asked about: a CPU with LibTorch 1.x or 2.x, or a CUDA device.
enum class PathTarget { cpu_libtorch1, cpu_libtorch2, cuda };
/// The rule behind choose_attention_path for any target (the build's own target is what a run uses; the others let
/// `moh info --attention-paths` print one table whatever the build).
AttentionPath auto_attention_path(double active, int64_t tokens, PathTarget target);

/// softmax(q kᵀ · scale + bias) v over the last two dims: q (..., Nq, d), k/v (..., Nk, d), bias broadcastable to
/// (..., Nq, Nk). With `fused`: the CPU loop of attention_cpu.h where it pays (attention_cpu_pays; no bias), else
/// LibTorch ≥ 2.1's scaled_dot_product_attention (flash/mem-efficient on CUDA); otherwise, and without `fused`, the
/// plain matmul-softmax-matmul path (the reference). `live` (..., Nq) bool: the query rows whose output is used (MoH's
/// gated pairs); the CPU loop leaves the others zero, the other paths compute them.
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                  const at::Tensor& bias = {}, bool fused = false, const at::Tensor& live = {});

/// Dense head mixing: q (B, h, N, d), k/v (B, h_kv, N, d) with h_kv ∈ {1, h} (1 = keys/values shared by all heads,
/// MoA), gates (B·N, h) or undefined (plain MHA) → (B, N, h·d). `fused_gates`: the gates applied in the layout pass
/// (fused_gate_heads, stored in the type the output projection casts to) instead of a separate product.
at::Tensor mix_heads_dense(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& gates,
                           double scale, bool fused = false, bool fused_gates = false);

/// The sparse paths' layout: the selected (token, head) pairs grouped by (batch, head); groups of similar size share
/// one padded bucket (Gb groups × M slots). Index tensors (int64) on the routing's device, built there.
struct PairBucket {
  int64_t groups = 0, rows = 0;  ///< Gb, M
  at::Tensor batch, head;        ///< (Gb): b, head index in [0, h)
  at::Tensor token;              ///< (Gb, M): token position n; padding repeats the group's last token
  at::Tensor gate_row;           ///< (Gb, M): (b·N + n)·h + head, the pair's row in (B·N·h)-shaped tensors
  at::Tensor out_row;            ///< (Gb, M): gate_row, or B·N·h (one scratch row) for padding slots
};

/// Buckets the pairs of `routed` (B·N, K) (indices into the routed pool: head = shared + index); with `all_shared`,
/// heads [0, shared) join as groups holding every token. Empty groups are dropped.
/// Groups whose counts are within `fill` of a bucket's largest share it; the last of `max_buckets` takes the rest.
/// The pairs are sorted and gathered on the routing's device; the one host read is the (B·h) pair counts per
/// group, which decide the buckets' shapes (padded sizes cannot be known without it).
std::vector<PairBucket> bucket_pairs(const at::Tensor& routed, int64_t B, int64_t N, int64_t h, int64_t shared,
                                     bool all_shared, double fill = 0.95, int max_buckets = 8);

/// Where the sparse path gets its queries: either all heads' queries precomputed (`q`, (B, h, N, d)), or the layer
/// input and the query projection (`x` (B·N, C), `wq` (h·d, C), `bq` (h·d) or undefined) so that queries are
/// projected only for the selected (token, head) pairs.
struct QuerySource {
  at::Tensor q;
  at::Tensor x, wq, bq;
};

/// Sparse head mixing. Heads [0, shared) are computed for every token; for heads [shared, h) only the pairs listed
/// in `routed` (B·N, K) (indices into the routed pool, head = shared + index) are computed. `gates` (B·N, h) as in
/// mix_heads_dense; unselected routed heads contribute exactly zero. k/v (B, h_kv, N, d). Returns (B, N, h·d).
at::Tensor mix_heads_sparse(const QuerySource& queries, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& gates, const at::Tensor& routed, int64_t num_heads, int64_t shared,
                            double scale, bool fused = false);

}  // namespace moh::nn

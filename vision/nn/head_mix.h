#pragma once
// MoH attention's head mixing with its gradients written out, for callers that cannot lean on LibTorch's autograd:
// the PyTorch ops of python/ (torch.ops.moh.attention and its backward, each registered with a fake implementation
// and autograd of their own, so that torch.compile sees two opaque ops with static shapes). The same two paths as
// attention_core.h's mix_heads_dense / mix_heads_sparse:
//   dense  — every head attends for every token, then each head's output is multiplied by its gate (the official MoH
//            code);
//   sparse — heads [0, shared) attend for every token, the routed heads only for the (token, head) pairs `routed`
//            lists (bucket_pairs' groups), every other pair stays exactly zero.
// The forward keeps each head's output o and each query row's log-sum-exp of its scores, in shapes fixed by the
// inputs (zero where the sparse path skipped a pair): the backward recomputes the probabilities from them, as flash
// attention does. The attention itself runs the toolkit's attention arithmetic: LibTorch's fused CPU attention where
// the toolkit's attend() takes it (LibTorch >= 2.2), the CPU kernel of attention_cpu.h on 1.13 where it pays, and
// otherwise (a bias, fp64, CUDA) the plain product-softmax-product sequence in fp32 (fp64 for fp64 inputs).
// tests/vision/nn/test_head_mix.cpp holds both passes equal to autograd through the plain composition, every core.
#include <ATen/ATen.h>

#include <cstdint>

#include "vision/nn/model_config.h"

namespace moh::nn {

/// Which attention arithmetic head_mix runs (automatic: the rule above; the others for tests and benchmarks, where
/// they apply to the operands, else plain).
enum class AttentionCore { automatic, fused_cpu, kernel_cpu, plain };

/// What head mixing takes.
struct HeadMixInputs {
  at::Tensor q;        ///< (B, h, N, d), any strides with unit d stride
  at::Tensor k, v;     ///< (B, h_kv, N, d), h_kv ∈ {1, h} (1: one key/value head for all, MoA)
  at::Tensor gates;    ///< (B·N, h) floating, or undefined (plain multi-head attention: every weight 1)
  at::Tensor routed;   ///< (B·N, K) int64 indices into the routed pool (head = shared + index), or undefined
  at::Tensor bias;     ///< added to the scores: (h, N, N) or (B|1, h, N, N), or undefined
  int64_t shared = 0;  ///< h_s: heads [0, h_s) always on
  double scale = 1.0;  ///< multiplies q kᵀ
  AttentionPath path = AttentionPath::dense;  ///< dense or sparse (head_mix_path resolves automatic)
  AttentionCore core = AttentionCore::automatic;
};

/// The forward's results, all of them needed by the backward.
struct HeadMixForward {
  at::Tensor out;  ///< (B, N, h·d) in q's type: each head's output times its gate, ready for the output projection
  at::Tensor o;    ///< (B, h, N, d) contiguous in q's type: each head's attention output (ungated)
  at::Tensor lse;  ///< (B, h, N) contiguous, fp32 (fp64 for fp64 q): log-sum-exp of each row's scaled scores
};

/// Gradients of the inputs (undefined where the input is). The sparse path leaves the gradient of a routed gate it
/// skipped (a pair not in `routed`) at 0: that head's output was never computed. The router's gradient reads only the
/// kept gates' (their renormalisation), so the logits' gradient is the dense path's.
struct HeadMixGrads {
  at::Tensor q, k, v, gates, bias;
};

/// The path `requested` resolves to for these inputs: automatic by choose_attention_path on the share of heads on,
/// (h_s + K) / h, the sequence length and the device; sparse without routed pairs is dense (nothing to skip).
AttentionPath head_mix_path(AttentionPath requested, const HeadMixInputs& in);

/// The gated heads (see HeadMixForward). in.path must be dense or sparse.
HeadMixForward head_mix_forward(const HeadMixInputs& in);

/// The inputs' gradients from dout (B, N, h·d), with the forward's results (the same inputs and path).
HeadMixGrads head_mix_backward(const at::Tensor& dout, const HeadMixInputs& in, const HeadMixForward& fwd);

}  // namespace moh::nn

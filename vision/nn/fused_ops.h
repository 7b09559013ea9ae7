#pragma once
// The fused operations of a DiT / MoH-DiT block (and of the MoH layers every family shares), each one pass over its
// tensors forward and one backward, as autograd operations:
//   ln_modulate    LayerNorm (no affine) + adaLN modulate  x̂ (1 + scale) + shift
//   gate_residual  x + gate · branch
//   bias_gelu      GELU(tanh)(z + bias) after the MLP's first product (taken without its bias)
//   route          the MoH router after its gate product: softmax, top-K, renormalised two-stage gates, the
//                  load-balance loss and the head-load counts
//   gate_heads     the per-head gate applied in the (B, h, N, d) → (B, N, h·d) layout pass the output projection needs
// Their arithmetic is written once (vision/nn/fused_math.h) and run by CPU loops here and by the CUDA kernels of
// vision/nn/cuda/fused_block.cu. The official op sequence of each stays beside it as `plain_*`, the path
// model.fused: off runs, and tests/vision/nn/test_fused.cpp holds the two equal (fp32: rounding; bf16: its rounding).
// Mixed types follow what the official sequence does under autocast: e.g. ln_modulate of an fp32 x with bf16
// shift/scale rounds `1 + scale` to bf16 as the official code does, and may store its result directly in bf16 when
// the only consumer would cast it there.
#include <ATen/ATen.h>

#include <array>

#include "vision/nn/fused_math.h"
#include "vision/nn/model_config.h"

namespace moh::nn {

/// Whether the fused kernels serve tensors on `device`: the CPU loops always, CUDA in builds with the kernels
/// (MOH_CUDA_KERNELS, a CUDA LibTorch).
bool fused_kernels_available(const c10::Device& device);

/// Whether model.fused = `mode` runs the fused operations on `device`. on: yes (a UserError where no kernels serve
/// the device); off: no; auto: the measured rule — off on every device until a GPU run has passed the CUDA parity
/// tests and measured a gain (docs/BENCHMARKS.md, "Fused block").
bool use_fused_ops(FusedMode mode, const c10::Device& device);

/// Whether a fused operation takes tensors of this type (fp32, bf16, fp16); others (fp64 references) run plain.
bool fused_dtype(at::ScalarType t);

/// LayerNorm over the last dim of x (B, N, D), no affine, then modulate: x̂ (1 + scale) + shift; shift and scale
/// (B, D), any row stride (the chunks of adaLN_modulation's output). The result in `out_dtype` (x's type, or the
/// autocast type where the only consumer casts to it anyway: the same values).
at::Tensor fused_ln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps,
                             at::ScalarType out_dtype);
/// The official sequence: `modulate(norm(x), shift, scale)` (DiT models.py).
at::Tensor plain_ln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps);

/// x + gate.unsqueeze(1) · branch: x, branch (B, N, D); gate (B, D), any row stride. The product rounds to the
/// branch's type (as the official `gate.unsqueeze(1) * branch` tensor does), the sum to x's.
at::Tensor fused_gate_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& branch);
at::Tensor plain_gate_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& branch);

/// GELU(tanh)(z + bias): z (..., F) the MLP's first product without its bias, bias (F) (rounded to z's type, as
/// autocast casts the Linear's bias).
at::Tensor fused_bias_gelu(const at::Tensor& z, const at::Tensor& bias);
/// The official sequence on the product's input: gelu(linear(x, w, bias), "tanh").
at::Tensor plain_linear_gelu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);

/// What the fused router returns (HeadRouting's fields): gates (T, h) fp32, routed (T, K) int64 (descending
/// weight), and in training the picks (E) int64 and the load-balance loss E·Σ P_i f_i (0-dim fp32).
struct FusedRouting {
  at::Tensor gates, routed, picks, aux_loss;
};
/// The router after its one gate product: logits (T, E + n_shared + n_alpha) with the columns of
/// fused::RouterShape. Equal to HeadRouter::route_compact (its plain reference) up to fp32 rounding.
FusedRouting fused_route(const at::Tensor& logits, const fused::RouterShape& shape, bool training);

/// Gated heads in the layout of the output projection: o (B, h, N, d) any strides, gates (B·N, h) fp32 → (B, N, h·d)
/// in `out_dtype`. The official `(o.transpose(1, 2) * gates.view(B, N, h, 1)).reshape(B, N, h·d)` is plain_gate_heads.
at::Tensor fused_gate_heads(const at::Tensor& o, const at::Tensor& gates, at::ScalarType out_dtype);
at::Tensor plain_gate_heads(const at::Tensor& o, const at::Tensor& gates);

/// The type an op's result is stored in when its one consumer is a product under autocast on `t`'s device (the
/// autocast type), else `t`'s own.
at::ScalarType consumer_dtype(const at::Tensor& t);

namespace fused {

// The operations' two passes as plain functions (no autograd), on tensors the fused loops take (the callers check:
// fused_* above falls back to the plain sequence otherwise). What the autograd operations above run, and what the
// PyTorch ops of python/ (torch.ops.moh) register with their own autograd: one arithmetic for both.

/// ln_modulate's forward: the result in out_dtype and each row's mean and 1/std, (B·N) fp32, for the backward.
struct LnModulateForward {
  at::Tensor out, mean, rstd;
};
LnModulateForward ln_modulate_forward(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps,
                                      at::ScalarType out_dtype);
/// {dx, dshift, dscale} from dy (B, N, D).
std::array<at::Tensor, 3> ln_modulate_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& shift,
                                               const at::Tensor& scale, const at::Tensor& mean, const at::Tensor& rstd);
at::Tensor gate_residual_forward(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& branch);
/// {dgate, dbranch} from dout (B, N, D); x's gradient is dout itself.
std::array<at::Tensor, 2> gate_residual_backward(const at::Tensor& dout, const at::Tensor& gate,
                                                 const at::Tensor& branch);
at::Tensor bias_gelu_forward(const at::Tensor& z, const at::Tensor& bias);
/// {dz, dbias} from dy (..., F).
std::array<at::Tensor, 2> bias_gelu_backward(const at::Tensor& dy, const at::Tensor& z, const at::Tensor& bias);
/// The router's forward with every field: gates (T, h) fp32, routed (T, K) int64, picks (E) int64, aux_loss (0-dim).
FusedRouting route_forward(const at::Tensor& logits, const RouterShape& shape);
/// The logits' gradient from the gates' (T, h) and the load-balance loss's (0-dim); either may be undefined (zero).
at::Tensor route_backward(const at::Tensor& logits, const at::Tensor& routed, const at::Tensor& picks,
                          const at::Tensor& dgates, const at::Tensor& daux, const RouterShape& shape);
at::Tensor gate_heads_forward(const at::Tensor& o, const at::Tensor& gates, at::ScalarType out_dtype);
/// {do (B, h, N, d) over (B, N, h, d) memory, dgates (B·N, h) fp32} from dout (B, N, h·d).
std::array<at::Tensor, 2> gate_heads_backward(const at::Tensor& dout, const at::Tensor& o, const at::Tensor& gates);

}  // namespace fused

}  // namespace moh::nn

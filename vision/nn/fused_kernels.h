#pragma once
// The loops of the fused block operations (vision/nn/fused_ops.h) on raw memory, as the CPU runs them
// (fused_cpu.cpp); the CUDA kernels (cuda/fused_block.h) take the same arguments plus a stream. No LibTorch types,
// so the CUDA side compiles with nvcc alone. Every loop computes with the functions of fused_math.h, but the CPU's
// bias + GELU, which runs gelu_cpu.h's vectorised rows (GELU in its σ form: the same function, more exact for u < 0).
//
// Layouts: x-like tensors (B, N, D) and (T, F) are contiguous rows; a `Rows` operand is (B, D) with a row stride
// (a chunk of adaLN_modulation's (B, 6D) output) and unit column stride. Reductions over tokens (the gradients of
// shift, scale, gate and bias) are written as partial sums per tile of kTileRows rows of one batch element,
// (B, tiles(N), D) fp32, summed by the caller in tile order: the same partials, hence the same rounding, on every
// backend and thread count.
#include <cstdint>

#include "vision/nn/fused_math.h"

namespace moh::nn::fused {

/// Element types of the fused loops.
enum class DType { f32, f16, bf16 };

/// Rows per tile of the token reductions.
constexpr int64_t kTileRows = 32;
MOH_HD int64_t tiles(int64_t rows) {
  return (rows + kTileRows - 1) / kTileRows;
}

/// Widest row (D) ln_modulate takes: the CUDA backward keeps each thread's columns of a row in registers.
constexpr int64_t kMaxRowWidth = 2048;

/// A (B, D) operand read with a row stride (elements).
struct Rows {
  const void* p = nullptr;
  int64_t stride = 0;
  DType type = DType::f32;
};

/// (B, h, N, d) strides of the heads' attention output (elements; d's stride is 1).
struct HeadStrides {
  int64_t b = 0, h = 0, n = 0;
};

namespace cpu {

/// out = modulate(LayerNorm(x)) per row; mean / rstd (B·N) saved for the backward.
void ln_modulate_forward(const void* x, DType tx, Rows shift, Rows scale, void* out, DType to, float* mean, float* rstd,
                         int64_t B, int64_t N, int64_t D, float eps);
/// dx (tx) and the partial sums of dshift = Σ_n dy, dscale = Σ_n dy·x̂, each (B, tiles(N), D).
void ln_modulate_backward(const void* dy, DType tdy, const void* x, DType tx, Rows scale, const float* mean,
                          const float* rstd, void* dx, float* dshift_part, float* dscale_part, int64_t B, int64_t N,
                          int64_t D);

/// out (tx) = x + rnd_tb(gate · branch).
void gate_residual_forward(const void* x, DType tx, Rows gate, const void* branch, DType tb, void* out, int64_t B,
                           int64_t N, int64_t D);
/// From dout (tx): dbranch (tb) = rnd(rnd(dout) · gate), partial sums of dgate = Σ_n rnd(rnd(dout) · branch).
void gate_residual_backward(const void* dout, DType tx, Rows gate, const void* branch, DType tb, void* dbranch,
                            float* dgate_part, int64_t B, int64_t N, int64_t D);

/// out (tz) = gelu_tanh(rnd_tz(z + rnd_tz(bias))), z (T, F).
void bias_gelu_forward(const void* z, DType tz, const void* bias, DType tbias, void* out, int64_t T, int64_t F);
/// dz (tz) = rnd(dy · gelu'(u)); partial sums of dbias = Σ_t dz, (tiles(T), F).
void bias_gelu_backward(const void* dy, const void* z, DType tz, const void* bias, DType tbias, void* dz,
                        float* dbias_part, int64_t T, int64_t F);

/// Per row t of logits (T, L): gates (T, h) fp32, routed (T, K); with p_part (tiles(T), E) and picks_part
/// (tiles(T), E) non-null, the partial column sums of p and the partial counts of the picks.
void route_forward(const void* logits, DType tl, int64_t T, RouterShape s, float* gates, int64_t* routed, float* p_part,
                   int64_t* picks_part);
/// dlogits (tl) per row; picks_coef (E) = ∂L/∂aux · E / T² · picks, or null without the loss.
void route_backward(const void* logits, DType tl, int64_t T, RouterShape s, const int64_t* routed, const float* dgates,
                    const float* picks_coef, void* dlogits);

/// out (B, N, h, d) in `to` = rnd(o[b, head, n, :] · gates[b·N + n, head]).
void gate_heads_forward(const void* o, DType ti, HeadStrides st, const float* gates, void* out, DType to, int64_t B,
                        int64_t h, int64_t N, int64_t d);
/// do (B, N, h, d) contiguous in ti = rnd(dout · gate); dgates (B·N, h) = Σ_c dout · o.
void gate_heads_backward(const void* dout, DType to, const void* o, DType ti, HeadStrides st, const float* gates,
                         void* d_o, float* dgates, int64_t B, int64_t h, int64_t N, int64_t d);

}  // namespace cpu
}  // namespace moh::nn::fused

// The fused block operations' row loops on a CPU in vectors (cpu_simd.h: AVX-512, AVX2 or the baseline, as the CPU
// runs them), for what a DiT block stores: an fp32 residual stream x, and modulation, branch and outputs in fp32 or
// bf16 (its raw bits). fused_cpu.cpp calls them for those types and keeps its per-element loops (fused_math.h) for the
// rest (fp16) and as the reference: the same functions of fused_math.h, element by element (tests/vision/nn/
// test_fused.cpp compares both with the official op sequence). A row's sums (mean, variance, the LayerNorm gradient's
// means) run in vector lanes; the token reductions (the gradients of shift, scale and gate) stay one sum per column
// over the rows in order, as the per-element loops take them.
#pragma once

#include <cstdint>

namespace moh::nn::fused::rows {

/// ln_modulate forward of `n` rows of D fp32 values x: out = modulate(LayerNorm(x)) with shift (D) and factor (D, =
/// modulation_factor of scale, fp32), out fp32 or bf16 bits; each row's mean and rstd written.
void ln_modulate_forward(const float* x, int64_t n, int64_t D, const float* shift, const float* factor, float eps,
                         float* out, float* mean, float* rstd);
void ln_modulate_forward(const float* x, int64_t n, int64_t D, const float* shift, const float* factor, float eps,
                         uint16_t* out, float* mean, float* rstd);
/// Its backward over the same rows: dy (fp32 or bf16 bits) → dx (fp32); dshift += Σ dy, dscale += Σ dy·x̂ (D each,
/// the rows in order).
void ln_modulate_backward(const float* dy, const float* x, int64_t n, int64_t D, const float* factor, const float* mean,
                          const float* rstd, float* dx, float* dshift, float* dscale);
void ln_modulate_backward(const uint16_t* dy, const float* x, int64_t n, int64_t D, const float* factor,
                          const float* mean, const float* rstd, float* dx, float* dshift, float* dscale);

/// gate_residual forward of n rows of D: out = x + rnd_Tb(gate · branch), x and out fp32, gate (D) and branch in Tb
/// (fp32, or bf16 bits).
void gate_residual_forward(const float* x, const float* gate, const float* branch, float* out, int64_t n, int64_t D);
void gate_residual_forward(const float* x, const uint16_t* gate, const uint16_t* branch, float* out, int64_t n,
                           int64_t D);
/// Its backward: d = rnd_Tb(dout); dbranch = rnd_Tb(d · gate); dgate += rnd_Tb(d · branch) (D, the rows in order).
void gate_residual_backward(const float* dout, const float* gate, const float* branch, float* dbranch, float* dgate,
                            int64_t n, int64_t D);
void gate_residual_backward(const float* dout, const uint16_t* gate, const uint16_t* branch, uint16_t* dbranch,
                            float* dgate, int64_t n, int64_t D);

}  // namespace moh::nn::fused::rows

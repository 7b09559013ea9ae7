// The attention core softmax(q kᵀ · scale) v on a CPU in one pass per query row, forward and backward, for LibTorch
// builds without a fused CPU attention (1.13): the plain path writes the (B, h, N, N) scores and probabilities to
// memory and reads them back in backward, and at the small head widths of the pixel DiTs its batched products run
// far below the machine's rate. Here each query row's scores stay in a buffer of N floats, the probabilities are
// recomputed in backward from the saved log-sum-exp (as flash attention does), and all arithmetic is fp32 whatever
// the storage type: bf16 outputs and gradients are the fp32 values rounded once. Strided operands (q, k, v as views
// of one qkv product) are read in place, and the output and gradients come in their operands' layout. Backward skips
// query rows whose output gradient is zero (MoH's gated-off heads): they add nothing. attend_plain
// (attention_core.cpp) is the reference; tests/vision/nn/test_attention_cpu.cpp compares the two against fp64.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>

namespace moh::nn {

/// softmax(q kᵀ · scale) v for CPU tensors q (..., Nq, d), k (..., Nk, d), v (..., Nk, d) with equal leading sizes,
/// fp32 or bf16 (the result in their common type; fp32 when they differ); differentiable in q, k and v. `live`
/// (..., Nq) bool, or undefined for all: the query rows whose output is used; the others are not computed and come out
/// zero (MoH's (token, head) pairs whose gate is 0, which multiplies them by 0; their gradient is 0 and the backward
/// skips them). Live rows are bit for bit what they are without the mask.
at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                         const at::Tensor& live = {});

/// What attention_cpu_forward returns: the output (in q's layout, see attention_cpu) and each query row's
/// log-sum-exp of its scaled scores, (..., Nq) fp32, which the backward recomputes the probabilities from.
struct AttentionCpuResult {
  at::Tensor out, lse;
};
/// attention_cpu's two passes as plain functions (no autograd): what its autograd operation calls, and what the
/// explicit-gradient head mixing (head_mix.h) and the PyTorch ops (python/) call.
AttentionCpuResult attention_cpu_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                         const at::Tensor& live = {});
/// Gradients of q, k and v (in their types and layouts) from dout (..., Nq, d) and the forward's lse.
std::array<at::Tensor, 3> attention_cpu_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& lse, double scale);

/// Widest head attention_cpu takes (its loops keep a row of d floats per operand; the models use 16 to 128).
constexpr int64_t kMaxHeadDim = 256;

/// Where attend() runs attention_cpu (`fused`): where it applies and was measured faster than LibTorch's own path:
/// fp32 or bf16 operands (all three of one type), heads of at most 16 dims, at least 128 keys (the pixel DiT /2's 196
/// tokens of 16 dims); on 1.13 (against its plain path) on every instruction set, on 2.x (against its flash attention)
/// where the loop's AVX2 variant runs (its AVX-512 variant is not yet measured against 2.x). At 49 tokens or 64-dim
/// heads it was level or slower (docs/BENCHMARKS.md, "Attention core on a CPU").
bool attention_cpu_pays(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

/// Whether attention_cpu takes these operands (CPU, fp32 / bf16, equal leading sizes, v as wide as k, d <=
/// kMaxHeadDim).
bool attention_cpu_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

namespace attention_kernels {
/// Query rows each block of the loops below computes at once, by the instruction set they run in (simd::isa()): 8
/// with AVX-512 (eight 16-lane running sums in its 32 vector registers), 6 with AVX2 (six rows of two 8-lane sums in
/// its 16), else 4: enough independent sums to keep both FMA units busy through each FMA's latency. Every result is
/// the same whatever the block, bit for bit. set_block_rows(4, 6 or 8) fixes it (tests compare them), 0 restores the
/// CPU's choice.
int block_rows();
void set_block_rows(int rows);
/// Floats of scratch each call below needs.
int64_t forward_scratch(int64_t nk, int64_t d);
int64_t backward_scratch(int64_t nk, int64_t d);
/// Elements between consecutive rows of each operand of a group (d for a contiguous (rows, d) block); o stands for
/// the forward's output and the backward's dout.
struct Strides {
  int64_t q, k, v, o, dq, dk, dv;
};
/// One (batch, head) group, rows of d contiguous elements, fp32 or bf16 (its raw bits; the arithmetic in fp32 either
/// way): q (n, d), k and v (nk, d) → o (n, d) and the rows' log-sum-exp (n, fp32, contiguous). `live` (n bytes, or
/// null for all): rows with 0 there are not computed (output 0, lse +∞).
void forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t n, int64_t nk, int64_t d,
             float scale, const Strides& s, float* scratch, const uint8_t* live = nullptr);
void forward(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* o, float* lse, int64_t n, int64_t nk,
             int64_t d, float scale, const Strides& s, float* scratch, const uint8_t* live = nullptr);
/// Its gradients from dout (n, d) and the forward's lse: dq (n, d), dk and dv (nk, d), all overwritten.
void backward(const float* q, const float* k, const float* v, const float* dout, const float* lse, float* dq, float* dk,
              float* dv, int64_t n, int64_t nk, int64_t d, float scale, const Strides& s, float* scratch);
void backward(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout, const float* lse,
              uint16_t* dq, uint16_t* dk, uint16_t* dv, int64_t n, int64_t nk, int64_t d, float scale, const Strides& s,
              float* scratch);
}  // namespace attention_kernels

}  // namespace moh::nn

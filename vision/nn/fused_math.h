#pragma once
// The arithmetic of the fused block operations (vision/nn/fused_ops.h), written once for the CPU loops
// (vision/nn/fused_ops.cpp) and the CUDA kernels (vision/nn/cuda/fused_block.cu): per-element functions and the
// per-row router, all in fp32, with the storage rounding of the official op sequence made explicit (`rnd<T>`: what
// PyTorch does when it stores an intermediate result in a bf16 / fp16 tensor). No LibTorch or CUDA types: each side
// supplies `Storage<T>` (load a stored element as float, round a float to T) for its own element types.
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define MOH_HD __host__ __device__ __forceinline__
#else
#define MOH_HD inline
#endif

namespace moh::nn::fused {

/// Conversion between an element type T and fp32: `load(T) -> float`, `store(float) -> T` (round to nearest even).
/// Specialised by each side for its element types; float is the same on both.
template <class T>
struct Storage;
template <>
struct Storage<float> {
  static MOH_HD float load(float v) { return v; }
  static MOH_HD float store(float v) { return v; }
};

/// v rounded to T and read back: the value an op of the official sequence leaves in a T tensor.
template <class T>
MOH_HD float rnd(float v) {
  return Storage<T>::load(Storage<T>::store(v));
}

// ---- LayerNorm (no affine) + adaLN modulate: y = x̂ (1 + scale) + shift, x̂ = (x − μ) · rstd -------------------------

/// The factor DiT's modulate multiplies by: the official `1 + scale` is a tensor of the modulation's type Tm.
template <class Tm>
MOH_HD float modulation_factor(float scale) {
  return rnd<Tm>(1.f + scale);
}
// modulate, modulate_grad and layer_norm_grad also run on CPU vectors (fused_rows.cpp), inlined into one instruction
// set's function: GCC's note on the ABI of vector returns does not apply to them (cpu_simd.h). Their parameters are
// references: GCC's note on 64-byte vector parameters ignores the pragma.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
/// DiT's modulate on a normalised element, with factor = modulation_factor(scale): x̂ · factor + shift. F: float, or a
/// CPU vector of floats (fused_rows.cpp) computing it lane by lane.
template <class F>
MOH_HD F modulate(const F& xhat, const F& shift, const F& factor) {
  return xhat * factor + shift;
}
/// 1 / sqrt(var + eps) of a row (biased variance, as LayerNorm).
MOH_HD float inv_std(float var, float eps) {
  return 1.f / sqrtf(var + eps);
}
/// ∂L/∂x̂ of modulate from ∂L/∂y.
template <class F>
MOH_HD F modulate_grad(const F& dy, const F& factor) {
  return dy * factor;
}
/// LayerNorm's input gradient from the normalised-value gradient g = ∂L/∂x̂ of one element and the row means
/// mean(g) and mean(g · x̂): rstd · (g − mean(g) − x̂ · mean(g x̂)).
template <class F>
MOH_HD F layer_norm_grad(const F& g, const F& xhat, const F& mean_g, const F& mean_gx, const F& rstd) {
  return rstd * (g - mean_g - xhat * mean_gx);
}
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC diagnostic pop
#endif

// ---- gate × branch + residual: out = x + gate · branch ------------------------------------------------------------

/// The official `x + gate.unsqueeze(1) * branch`: the product is a Tb tensor (bf16 under autocast), the sum in x's.
template <class Tb>
MOH_HD float gate_residual(float x, float gate, float branch) {
  return x + rnd<Tb>(gate * branch);
}

// ---- bias + GELU (tanh approximation)
// ----------------------------------------------------------------------------------

constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / π)
constexpr float kGeluKappa = 0.044715f;

/// tanh(v) from one exponential, 1 − 2 / (e^{2v} + 1): within a few ulps of 1 of tanh (absolute), which GELU's
/// 0.5 u (1 + tanh) turns into a few ulps of its result, and several times cheaper than the C library's tanhf on a
/// CPU (e^{2v} = inf gives 1, 0 gives −1).
MOH_HD float tanh_by_exp(float v) {
  return 1.f - 2.f / (expf(2.f * v) + 1.f);
}

/// GELU with the tanh approximation (DiT's approx_gelu): 0.5 u (1 + tanh(√(2/π) (u + 0.044715 u³))).
MOH_HD float gelu_tanh(float u) {
  const float inner = kGeluBeta * (u + kGeluKappa * u * u * u);
  return 0.5f * u * (1.f + tanh_by_exp(inner));
}
/// d gelu_tanh / du (PyTorch's GeluBackward with approximate="tanh").
MOH_HD float gelu_tanh_grad(float u) {
  const float u2 = u * u;
  const float t = tanh_by_exp(kGeluBeta * (u + kGeluKappa * u2 * u));
  return 0.5f * (1.f + t) + 0.5f * u * (1.f - t * t) * kGeluBeta * (1.f + 3.f * kGeluKappa * u2);
}
/// The fc1 output the official Linear leaves in Tz (its bias added before the rounding): the GELU's input.
template <class Tz>
MOH_HD float biased(float z, float bias) {
  return rnd<Tz>(z + bias);
}

// ---- the MoH router after its gate product
// ----------------------------------------------------------------------------

/// Largest routed pool / logits row the per-row router handles (DiT-XL: 24 routed heads + shared + 2).
constexpr int kMaxRouterLogits = 64;
constexpr int kMaxRouterTopK = 32;

/// A MoH layer's routing layout: logits columns [routed E | shared n_shared (h_s > 1) | α 2 (h_s > 0)], gates
/// [shared h_s | routed E].
struct RouterShape {
  int experts = 0;         ///< E = h − h_s, the routed pool
  int shared = 0;          ///< h_s
  int topk = 0;            ///< K
  bool scale_by_k = true;  ///< MoH: renormalised routed weights × K; MoA: they sum to 1
  MOH_HD int n_shared_logits() const { return shared > 1 ? shared : 0; }
  MOH_HD int n_alpha() const { return shared > 0 ? 2 : 0; }
  MOH_HD int logits() const { return experts + n_shared_logits() + n_alpha(); }
  MOH_HD int heads() const { return shared + experts; }
};

/// Numerically safe softmax of n values in place (max subtracted), as at::softmax in fp32.
MOH_HD void softmax_inplace(float* v, int n) {
  float m = v[0];
  for (int i = 1; i < n; ++i) m = v[i] > m ? v[i] : m;
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += (v[i] = expf(v[i] - m));
  const float inv = 1.f / s;
  for (int i = 0; i < n; ++i) v[i] *= inv;
}

/// softmax backward in place: g ← p ⊙ (g − Σ p g).
MOH_HD void softmax_grad_inplace(const float* p, float* g, int n) {
  float dot = 0.f;
  for (int i = 0; i < n; ++i) dot += p[i] * g[i];
  for (int i = 0; i < n; ++i) g[i] = p[i] * (g[i] - dot);
}

/// The K largest of p[0, E) in descending order (ties: the lower index first), as indices.
MOH_HD void top_k(const float* p, int E, int K, int* idx) {
  for (int k = 0; k < K; ++k) {
    int best = -1;
    for (int i = 0; i < E; ++i) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken = taken || idx[j] == i;
      if (!taken && (best < 0 || p[i] > p[best])) best = i;
    }
    idx[k] = best;
  }
}

/// One token's routing from its logits row (fp32): p = softmax(routed logits) (written to p, E values), the top-K
/// heads (idx, K), and the gates (h values): routed p_i · K / Σ_kept p · α2 for the kept, 0 for the others; shared
/// softmax(wg_1 logits) · h_s · α1 (α1 alone for h_s = 1); α = 2 softmax(wg_0 logits). The official MoH router
/// (route_plain in moh_attention.cpp), written for one row.
MOH_HD void route_row(const float* logits, const RouterShape& s, float* p, int* idx, float* gates) {
  const int E = s.experts, K = s.topk, hs = s.shared, ns = s.n_shared_logits();
  for (int i = 0; i < E; ++i) p[i] = logits[i];
  softmax_inplace(p, E);
  top_k(p, E, K, idx);
  float kept = 0.f;
  for (int k = 0; k < K; ++k) kept += p[idx[k]];
  float alpha[2] = {1.f, 1.f};
  if (hs > 0) {
    alpha[0] = logits[E + ns], alpha[1] = logits[E + ns + 1];
    softmax_inplace(alpha, 2);
    alpha[0] *= 2.f, alpha[1] *= 2.f;
  }
  const float coef = (s.scale_by_k ? static_cast<float>(K) : 1.f) / kept * alpha[1];
  float* routed = gates + hs;
  for (int i = 0; i < E; ++i) routed[i] = 0.f;
  for (int k = 0; k < K; ++k) routed[idx[k]] = p[idx[k]] * coef;
  if (ns > 0) {
    for (int j = 0; j < ns; ++j) gates[j] = logits[E + j];
    softmax_inplace(gates, ns);
    const float c = alpha[0] * static_cast<float>(hs);
    for (int j = 0; j < ns; ++j) gates[j] *= c;
  } else if (hs == 1) {
    gates[0] = alpha[0];
  }
}

/// The logits' gradient of route_row for one token (written to dlogits, s.logits() values), from the gates' gradient
/// dgates (h values) and the load-balance term: aux = E/T · Σ_i mean_t(p_ti) · picks_i contributes
/// aux_coef · picks_i to ∂L/∂p_i, aux_coef = ∂L/∂aux · E / T² (the picks carry no gradient). idx: the row's top-K.
MOH_HD void route_row_grad(const float* logits, const RouterShape& s, const int* idx, const float* dgates,
                           const float* picks_coef, float* dlogits) {
  const int E = s.experts, K = s.topk, hs = s.shared, ns = s.n_shared_logits();
  float p[kMaxRouterLogits];
  p[0] = 0.f;  // a routed layer has E >= 1: this only says so to GCC's -O1 uninitialised-read analysis
  for (int i = 0; i < E; ++i) p[i] = logits[i];
  softmax_inplace(p, E);
  float kept = 0.f;
  for (int k = 0; k < K; ++k) kept += p[idx[k]];
  float alpha[2] = {1.f, 1.f}, sig[2] = {0.5f, 0.5f};
  if (hs > 0) {
    sig[0] = logits[E + ns], sig[1] = logits[E + ns + 1];
    softmax_inplace(sig, 2);
    alpha[0] = 2.f * sig[0], alpha[1] = 2.f * sig[1];
  }
  const float scale = s.scale_by_k ? static_cast<float>(K) : 1.f;
  // Routed gates g_i = scale · α2 · p_i / kept for the kept i: ∂/∂p_i and ∂/∂α2.
  const float* dr = dgates + hs;
  float dot = 0.f;  // Σ_kept dg_i p_i
  for (int k = 0; k < K; ++k) dot += dr[idx[k]] * p[idx[k]];
  float* dp = dlogits;  // the routed logits' slots hold ∂L/∂p first
  for (int i = 0; i < E; ++i) dp[i] = picks_coef ? picks_coef[i] : 0.f;
  const float c = scale * alpha[1] / kept;
  for (int k = 0; k < K; ++k) dp[idx[k]] += c * (dr[idx[k]] - dot / kept);
  softmax_grad_inplace(p, dp, E);
  float dalpha[2] = {0.f, scale * dot / kept};
  if (ns > 0) {  // shared gates q_j · h_s · α1, q = softmax(wg_1 logits)
    float q[kMaxRouterLogits], dq[kMaxRouterLogits];
    for (int j = 0; j < ns; ++j) q[j] = logits[E + j];
    softmax_inplace(q, ns);
    for (int j = 0; j < ns; ++j) {
      dalpha[0] += dgates[j] * q[j] * static_cast<float>(hs);
      dq[j] = dgates[j] * static_cast<float>(hs) * alpha[0];
    }
    softmax_grad_inplace(q, dq, ns);
    for (int j = 0; j < ns; ++j) dlogits[E + j] = dq[j];
  } else if (hs == 1) {
    dalpha[0] = dgates[0];
  }
  if (hs > 0) {  // α = 2 softmax(a)
    float ds[2] = {2.f * dalpha[0], 2.f * dalpha[1]};
    softmax_grad_inplace(sig, ds, 2);
    dlogits[E + ns] = ds[0], dlogits[E + ns + 1] = ds[1];
  }
}

}  // namespace moh::nn::fused

// CUDA kernels of the fused block operations (definitions and layouts: vision/nn/fused_kernels.h). The arithmetic is
// fused_math.h's, shared with the CPU loops; what is CUDA's here is the indexing and the reductions: warp shuffles
// across a row, and per-tile partial sums over tokens in row order (the CPU loops' tiles), so every result is
// deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "vision/nn/cuda/fused_block.h"

namespace moh::nn::fused {

template <>
struct Storage<__nv_bfloat16> {
  static MOH_HD float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static MOH_HD __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Storage<__half> {
  static MOH_HD float load(__half v) { return __half2float(v); }
  static MOH_HD __half store(float v) { return __float2half_rn(v); }
};

namespace cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kColsPerThread = static_cast<int>(kMaxRowWidth / kThreads);

// Calls f with a value of the element type `t` stands for.
template <class F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::bf16:
      return f(__nv_bfloat16{});
    case DType::f16:
      return f(__half{});
  }
}

template <class T>
__device__ __forceinline__ float ld(const void* p, int64_t i) {
  return Storage<T>::load(static_cast<const T*>(p)[i]);
}
template <class T>
__device__ __forceinline__ void st(void* p, int64_t i, float v) {
  static_cast<T*>(p)[i] = Storage<T>::store(v);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Σ over the block of (a, b), returned to every thread; `red` holds 2·kWarps floats of shared memory.
__device__ __forceinline__ void block_sum2(float& a, float& b, float* red) {
  a = warp_sum(a), b = warp_sum(b);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  __syncthreads();  // red is reused row after row
  if (lane == 0) red[warp] = a, red[kWarps + warp] = b;
  __syncthreads();
  a = 0.f, b = 0.f;
  for (int w = 0; w < kWarps; ++w) a += red[w], b += red[kWarps + w];
}

unsigned grid(int64_t work, int64_t per_block) {
  return static_cast<unsigned>((work + per_block - 1) / per_block);
}

// One warp per row: mean and variance by shuffles, then the modulated row.
template <class Tx, class Tm, class To>
__global__ void ln_forward_kernel(const void* x, Rows shift, Rows scale, void* out, float* mean, float* rstd,
                                  int64_t rows, int64_t N, int D, float eps) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const int64_t b = r / N, base = r * D;
  float s = 0.f;
  for (int c = lane; c < D; c += kWarp) s += ld<Tx>(x, base + c);
  const float mu = warp_sum(s) / static_cast<float>(D);
  float v = 0.f;
  for (int c = lane; c < D; c += kWarp) {
    const float dev = ld<Tx>(x, base + c) - mu;
    v += dev * dev;
  }
  const float rs = inv_std(warp_sum(v) / static_cast<float>(D), eps);
  if (lane == 0) mean[r] = mu, rstd[r] = rs;
  for (int c = lane; c < D; c += kWarp) {
    const float fac = modulation_factor<Tm>(ld<Tm>(scale.p, b * scale.stride + c));
    st<To>(out, base + c, modulate((ld<Tx>(x, base + c) - mu) * rs, ld<Tm>(shift.p, b * shift.stride + c), fac));
  }
}

// One block per tile (b, kTileRows rows): thread t owns columns t + kThreads·j; per row the block sums g and g·x̂,
// then writes dx; each thread's dshift / dscale partials stay in registers over the tile.
template <class Tx, class Tm, class Ty>
__global__ void ln_backward_kernel(const void* dy, const void* x, Rows scale, const float* mean, const float* rstd,
                                   void* dx, float* dshift_part, float* dscale_part, int64_t N, int D) {
  __shared__ float red[2 * kWarps];
  const int64_t per = tiles(N), tile = blockIdx.x, b = tile / per, n0 = (tile % per) * kTileRows;
  const int64_t n1 = n0 + kTileRows < N ? n0 + kTileRows : N;
  float fac[kColsPerThread], dsh[kColsPerThread], dsc[kColsPerThread];
#pragma unroll
  for (int j = 0; j < kColsPerThread; ++j) {
    const int c = threadIdx.x + kThreads * j;
    fac[j] = c < D ? modulation_factor<Tm>(ld<Tm>(scale.p, b * scale.stride + c)) : 0.f;
    dsh[j] = 0.f, dsc[j] = 0.f;
  }
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t r = b * N + n, base = r * D;
    const float mu = mean[r], rs = rstd[r];
    float sg = 0.f, sgx = 0.f;
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const int c = threadIdx.x + kThreads * j;
      if (c >= D) continue;
      const float d = ld<Ty>(dy, base + c), xh = (ld<Tx>(x, base + c) - mu) * rs, g = modulate_grad(d, fac[j]);
      sg += g, sgx += g * xh;
      dsh[j] += d, dsc[j] += d * xh;
    }
    block_sum2(sg, sgx, red);
    const float mg = sg / static_cast<float>(D), mgx = sgx / static_cast<float>(D);
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const int c = threadIdx.x + kThreads * j;
      if (c >= D) continue;
      const float g = modulate_grad(ld<Ty>(dy, base + c), fac[j]), xh = (ld<Tx>(x, base + c) - mu) * rs;
      st<Tx>(dx, base + c, layer_norm_grad(g, xh, mg, mgx, rs));
    }
  }
#pragma unroll
  for (int j = 0; j < kColsPerThread; ++j) {
    const int c = threadIdx.x + kThreads * j;
    if (c < D) dshift_part[tile * D + c] = dsh[j], dscale_part[tile * D + c] = dsc[j];
  }
}

template <class Tx, class Tb>
__global__ void gate_residual_forward_kernel(const void* x, Rows gate, const void* branch, void* out, int64_t total,
                                             int64_t N, int64_t D) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % D, b = i / D / N;
    st<Tx>(out, i, gate_residual<Tb>(ld<Tx>(x, i), ld<Tb>(gate.p, b * gate.stride + c), ld<Tb>(branch, i)));
  }
}

// Block (tile, column block): one thread per column, the tile's rows in order.
template <class Tx, class Tb>
__global__ void gate_residual_backward_kernel(const void* dout, Rows gate, const void* branch, void* dbranch,
                                              float* dgate_part, int64_t N, int64_t D) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= D) return;
  const int64_t per = tiles(N), tile = blockIdx.x, b = tile / per, n0 = (tile % per) * kTileRows;
  const int64_t n1 = n0 + kTileRows < N ? n0 + kTileRows : N;
  const float g = ld<Tb>(gate.p, b * gate.stride + c);
  float acc = 0.f;
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t i = (b * N + n) * D + c;
    const float d = rnd<Tb>(ld<Tx>(dout, i));
    st<Tb>(dbranch, i, d * g);
    acc += rnd<Tb>(d * ld<Tb>(branch, i));
  }
  dgate_part[tile * D + c] = acc;
}

template <class Tz, class Tbias>
__global__ void bias_gelu_forward_kernel(const void* z, const void* bias, void* out, int64_t total, int64_t F) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    st<Tz>(out, i, gelu_tanh(biased<Tz>(ld<Tz>(z, i), rnd<Tz>(ld<Tbias>(bias, i % F)))));
}

template <class Tz, class Tbias>
__global__ void bias_gelu_backward_kernel(const void* dy, const void* z, const void* bias, void* dz, float* dbias_part,
                                          int64_t T, int64_t F) {
  const int64_t f = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (f >= F) return;
  const int64_t tile = blockIdx.x, t0 = tile * kTileRows, t1 = t0 + kTileRows < T ? t0 + kTileRows : T;
  const float bf = rnd<Tz>(ld<Tbias>(bias, f));
  float acc = 0.f;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t i = t * F + f;
    const float g = rnd<Tz>(ld<Tz>(dy, i) * gelu_tanh_grad(biased<Tz>(ld<Tz>(z, i), bf)));
    st<Tz>(dz, i, g);
    acc += g;
  }
  dbias_part[tile * F + f] = acc;
}

// One block of kTileRows threads per tile, one thread per token; the tile's p rows and picks are summed in row order.
template <class Tl>
__global__ void route_forward_kernel(const void* logits, int64_t T, RouterShape s, float* gates, int64_t* routed,
                                     float* p_part, int64_t* picks_part) {
  __shared__ float p_rows[kTileRows][kMaxRouterLogits];
  __shared__ int picked[kTileRows][kMaxRouterTopK];
  const int L = s.logits(), E = s.experts, K = s.topk, h = s.heads();
  const int64_t tile = blockIdx.x, t = tile * kTileRows + threadIdx.x;
  const int rows = static_cast<int>(T - tile * kTileRows < kTileRows ? T - tile * kTileRows : kTileRows);
  if (threadIdx.x < rows) {
    float row[kMaxRouterLogits];
    int idx[kMaxRouterTopK];
    for (int j = 0; j < L; ++j) row[j] = ld<Tl>(logits, t * L + j);
    route_row(row, s, p_rows[threadIdx.x], idx, gates + t * h);
    for (int k = 0; k < K; ++k) routed[t * K + k] = idx[k], picked[threadIdx.x][k] = idx[k];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    float acc = 0.f;
    int64_t count = 0;
    for (int r = 0; r < rows; ++r) {
      acc += p_rows[r][i];
      for (int k = 0; k < K; ++k) count += picked[r][k] == i ? 1 : 0;
    }
    p_part[tile * E + i] = acc, picks_part[tile * E + i] = count;
  }
}

template <class Tl>
__global__ void route_backward_kernel(const void* logits, int64_t T, RouterShape s, const int64_t* routed,
                                      const float* dgates, const float* picks_coef, void* dlogits) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const int L = s.logits(), K = s.topk, h = s.heads();
  float row[kMaxRouterLogits], g[kMaxRouterLogits];
  int idx[kMaxRouterTopK];
  for (int j = 0; j < L; ++j) row[j] = ld<Tl>(logits, t * L + j);
  for (int k = 0; k < K; ++k) idx[k] = static_cast<int>(routed[t * K + k]);
  route_row_grad(row, s, idx, dgates + t * h, picks_coef, g);
  for (int j = 0; j < L; ++j) st<Tl>(dlogits, t * L + j, g[j]);
}

// One warp per (token, head): lanes over the head's d channels.
template <class Ti, class To>
__global__ void gate_heads_forward_kernel(const void* o, HeadStrides sd, const float* gates, void* out, int64_t pairs,
                                          int64_t h, int64_t N, int64_t d) {
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;  // (b·N + n)·h + head
  if (pair >= pairs) return;
  const int64_t r = pair / h, j = pair % h, b = r / N, n = r % N;
  const float g = gates[pair];
  const int64_t src = b * sd.b + j * sd.h + n * sd.n, dst = pair * d;
  for (int64_t c = threadIdx.x % kWarp; c < d; c += kWarp) st<To>(out, dst + c, ld<Ti>(o, src + c) * g);
}

template <class Ti, class To>
__global__ void gate_heads_backward_kernel(const void* dout, const void* o, HeadStrides sd, const float* gates,
                                           void* d_o, float* dgates, int64_t pairs, int64_t h, int64_t N, int64_t d) {
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  if (pair >= pairs) return;
  const int64_t r = pair / h, j = pair % h, b = r / N, n = r % N;
  const float g = gates[pair];
  const int64_t src = b * sd.b + j * sd.h + n * sd.n, row = pair * d;
  float acc = 0.f;
  for (int64_t c = threadIdx.x % kWarp; c < d; c += kWarp) {
    const float go = ld<To>(dout, row + c);
    st<Ti>(d_o, row + c, go * g);
    acc += go * ld<Ti>(o, src + c);
  }
  acc = warp_sum(acc);
  if (threadIdx.x % kWarp == 0) dgates[pair] = acc;
}

// Blocks of a grid-stride elementwise kernel: enough to fill the GPU, no more.
unsigned stride_grid(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

}  // namespace

cudaError_t ln_modulate_forward(const void* x, DType tx, Rows shift, Rows scale, void* out, DType to, float* mean,
                                float* rstd, int64_t B, int64_t N, int64_t D, float eps, cudaStream_t stream) {
  if (B * N == 0) return cudaSuccess;
  if (D > kMaxRowWidth) return cudaErrorInvalidValue;
  with_type(tx, [&](auto xt) {
    with_type(shift.type, [&](auto mt) {
      with_type(to, [&](auto ot) {
        ln_forward_kernel<decltype(xt), decltype(mt), decltype(ot)><<<grid(B * N, kWarps), kThreads, 0, stream>>>(
            x, shift, scale, out, mean, rstd, B * N, N, static_cast<int>(D), eps);
      });
    });
  });
  return cudaGetLastError();
}

cudaError_t ln_modulate_backward(const void* dy, DType tdy, const void* x, DType tx, Rows scale, const float* mean,
                                 const float* rstd, void* dx, float* dshift_part, float* dscale_part, int64_t B,
                                 int64_t N, int64_t D, cudaStream_t stream) {
  if (B * N == 0) return cudaSuccess;
  if (D > kMaxRowWidth) return cudaErrorInvalidValue;
  with_type(tx, [&](auto xt) {
    with_type(scale.type, [&](auto mt) {
      with_type(tdy, [&](auto yt) {
        ln_backward_kernel<decltype(xt), decltype(mt), decltype(yt)><<<B * tiles(N), kThreads, 0, stream>>>(
            dy, x, scale, mean, rstd, dx, dshift_part, dscale_part, N, static_cast<int>(D));
      });
    });
  });
  return cudaGetLastError();
}

cudaError_t gate_residual_forward(const void* x, DType tx, Rows gate, const void* branch, DType tb, void* out,
                                  int64_t B, int64_t N, int64_t D, cudaStream_t stream) {
  const int64_t total = B * N * D;
  if (total == 0) return cudaSuccess;
  with_type(tx, [&](auto xt) {
    with_type(tb, [&](auto bt) {
      gate_residual_forward_kernel<decltype(xt), decltype(bt)>
          <<<stride_grid(total), kThreads, 0, stream>>>(x, gate, branch, out, total, N, D);
    });
  });
  return cudaGetLastError();
}

cudaError_t gate_residual_backward(const void* dout, DType tx, Rows gate, const void* branch, DType tb, void* dbranch,
                                   float* dgate_part, int64_t B, int64_t N, int64_t D, cudaStream_t stream) {
  if (B * N * D == 0) return cudaSuccess;
  const dim3 blocks(static_cast<unsigned>(B * tiles(N)), grid(D, kThreads));
  with_type(tx, [&](auto xt) {
    with_type(tb, [&](auto bt) {
      gate_residual_backward_kernel<decltype(xt), decltype(bt)>
          <<<blocks, kThreads, 0, stream>>>(dout, gate, branch, dbranch, dgate_part, N, D);
    });
  });
  return cudaGetLastError();
}

cudaError_t bias_gelu_forward(const void* z, DType tz, const void* bias, DType tbias, void* out, int64_t T, int64_t F,
                              cudaStream_t stream) {
  const int64_t total = T * F;
  if (total == 0) return cudaSuccess;
  with_type(tz, [&](auto zt) {
    with_type(tbias, [&](auto bt) {
      bias_gelu_forward_kernel<decltype(zt), decltype(bt)>
          <<<stride_grid(total), kThreads, 0, stream>>>(z, bias, out, total, F);
    });
  });
  return cudaGetLastError();
}

cudaError_t bias_gelu_backward(const void* dy, const void* z, DType tz, const void* bias, DType tbias, void* dz,
                               float* dbias_part, int64_t T, int64_t F, cudaStream_t stream) {
  if (T * F == 0) return cudaSuccess;
  const dim3 blocks(static_cast<unsigned>(tiles(T)), grid(F, kThreads));
  with_type(tz, [&](auto zt) {
    with_type(tbias, [&](auto bt) {
      bias_gelu_backward_kernel<decltype(zt), decltype(bt)>
          <<<blocks, kThreads, 0, stream>>>(dy, z, bias, dz, dbias_part, T, F);
    });
  });
  return cudaGetLastError();
}

cudaError_t route_forward(const void* logits, DType tl, int64_t T, RouterShape s, float* gates, int64_t* routed,
                          float* p_part, int64_t* picks_part, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  with_type(tl, [&](auto lt) {
    route_forward_kernel<decltype(lt)>
        <<<static_cast<unsigned>(tiles(T)), kTileRows, 0, stream>>>(logits, T, s, gates, routed, p_part, picks_part);
  });
  return cudaGetLastError();
}

cudaError_t route_backward(const void* logits, DType tl, int64_t T, RouterShape s, const int64_t* routed,
                           const float* dgates, const float* picks_coef, void* dlogits, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  with_type(tl, [&](auto lt) {
    route_backward_kernel<decltype(lt)>
        <<<grid(T, 128), 128, 0, stream>>>(logits, T, s, routed, dgates, picks_coef, dlogits);
  });
  return cudaGetLastError();
}

cudaError_t gate_heads_forward(const void* o, DType ti, HeadStrides sd, const float* gates, void* out, DType to,
                               int64_t B, int64_t h, int64_t N, int64_t d, cudaStream_t stream) {
  const int64_t pairs = B * N * h;
  if (pairs == 0) return cudaSuccess;
  with_type(ti, [&](auto it) {
    with_type(to, [&](auto ot) {
      gate_heads_forward_kernel<decltype(it), decltype(ot)>
          <<<grid(pairs, kWarps), kThreads, 0, stream>>>(o, sd, gates, out, pairs, h, N, d);
    });
  });
  return cudaGetLastError();
}

cudaError_t gate_heads_backward(const void* dout, DType to, const void* o, DType ti, HeadStrides sd, const float* gates,
                                void* d_o, float* dgates, int64_t B, int64_t h, int64_t N, int64_t d,
                                cudaStream_t stream) {
  const int64_t pairs = B * N * h;
  if (pairs == 0) return cudaSuccess;
  with_type(ti, [&](auto it) {
    with_type(to, [&](auto ot) {
      gate_heads_backward_kernel<decltype(it), decltype(ot)>
          <<<grid(pairs, kWarps), kThreads, 0, stream>>>(dout, o, sd, gates, d_o, dgates, pairs, h, N, d);
    });
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace moh::nn::fused

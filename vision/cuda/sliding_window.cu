// CUDA kernels of the 3×3 sliding-window attention (see sliding_window.h for layouts and definitions).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "vision/cuda/sliding_window.h"

namespace moh::vision::cuda {

namespace {

constexpr int kWindow = 9;
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 256;

__device__ __forceinline__ float to_f(float v) {
  return v;
}
__device__ __forceinline__ float to_f(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_f(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

// Token index of neighbour z of (y, x), or −1 outside the map.
__device__ __forceinline__ int neighbour(int y, int x, int z, int height, int width) {
  const int ny = y + z / 3 - 1, nx = x + z % 3 - 1;
  return (ny < 0 || ny >= height || nx < 0 || nx >= width) ? -1 : ny * width + nx;
}

// One warp per (i, n): lanes stride over channels, 9 partial dot products reduced with shuffles.
template <class T>
__global__ void qk_kernel(const T* __restrict__ q, const T* __restrict__ k, T* __restrict__ logits, int bh, int height,
                          int width, int channels) {
  const int n_tokens = height * width;
  const long long row = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;  // i·N + n
  const int lane = threadIdx.x % kWarp;
  if (row >= static_cast<long long>(bh) * n_tokens) return;
  const long long i = row / n_tokens;
  const int n = static_cast<int>(row % n_tokens), y = n / width, x = n % width;
  const T* qrow = q + row * channels;
  float acc[kWindow];
  int nb[kWindow];
#pragma unroll
  for (int z = 0; z < kWindow; ++z) acc[z] = 0.f, nb[z] = neighbour(y, x, z, height, width);
  for (int c = lane; c < channels; c += kWarp) {
    const float qv = to_f(qrow[c]);
#pragma unroll
    for (int z = 0; z < kWindow; ++z)
      if (nb[z] >= 0) acc[z] += qv * to_f(k[(i * n_tokens + nb[z]) * channels + c]);
  }
#pragma unroll
  for (int z = 0; z < kWindow; ++z)
    for (int off = kWarp / 2; off > 0; off /= 2) acc[z] += __shfl_down_sync(0xffffffffu, acc[z], off);
  if (lane == 0)
#pragma unroll
    for (int z = 0; z < kWindow; ++z) logits[row * kWindow + z] = from_f<T>(acc[z]);
}

// One thread per (i, n, c).
template <class T, bool kTransposed>
__global__ void av_kernel(const T* __restrict__ w, const T* __restrict__ v, T* __restrict__ out, int bh, int height,
                          int width, int channels) {
  const int n_tokens = height * width;
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long long>(bh) * n_tokens * channels) return;
  const int c = static_cast<int>(idx % channels);
  const long long row = idx / channels;  // i·N + n
  const long long i = row / n_tokens;
  const int n = static_cast<int>(row % n_tokens), y = n / width, x = n % width;
  float acc = 0.f;
#pragma unroll
  for (int z = 0; z < kWindow; ++z) {
    if (!kTransposed) {  // gather: weights of this token, values of its neighbours
      const int m = neighbour(y, x, z, height, width);
      if (m >= 0) acc += to_f(w[row * kWindow + z]) * to_f(v[(i * n_tokens + m) * channels + c]);
    } else {  // adjoint: the tokens whose neighbour z is this one sit at offset −off(z)
      const int m = neighbour(y, x, kWindow - 1 - z, height, width);
      if (m >= 0) {
        const long long src = i * n_tokens + m;
        acc += to_f(w[src * kWindow + z]) * to_f(v[src * channels + c]);
      }
    }
  }
  out[idx] = from_f<T>(acc);
}

unsigned blocks(long long work, int per_block) {
  return static_cast<unsigned>((work + per_block - 1) / per_block);
}

}  // namespace

template <class T>
cudaError_t sliding_qk(const T* q, const T* k, T* logits, int bh, int height, int width, int channels,
                       cudaStream_t stream) {
  const long long rows = static_cast<long long>(bh) * height * width;
  if (rows == 0) return cudaSuccess;
  qk_kernel<T>
      <<<blocks(rows, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0, stream>>>(q, k, logits, bh, height, width, channels);
  return cudaGetLastError();
}

template <class T>
cudaError_t sliding_av(const T* w, const T* v, T* out, int bh, int height, int width, int channels,
                       cudaStream_t stream) {
  const long long work = static_cast<long long>(bh) * height * width * channels;
  if (work == 0) return cudaSuccess;
  av_kernel<T, false><<<blocks(work, kThreads), kThreads, 0, stream>>>(w, v, out, bh, height, width, channels);
  return cudaGetLastError();
}

template <class T>
cudaError_t sliding_av_transposed(const T* w, const T* x, T* out, int bh, int height, int width, int channels,
                                  cudaStream_t stream) {
  const long long work = static_cast<long long>(bh) * height * width * channels;
  if (work == 0) return cudaSuccess;
  av_kernel<T, true><<<blocks(work, kThreads), kThreads, 0, stream>>>(w, x, out, bh, height, width, channels);
  return cudaGetLastError();
}

#define MOH_SLIDING_INSTANTIATE(T)                                                              \
  template cudaError_t sliding_qk<T>(const T*, const T*, T*, int, int, int, int, cudaStream_t); \
  template cudaError_t sliding_av<T>(const T*, const T*, T*, int, int, int, int, cudaStream_t); \
  template cudaError_t sliding_av_transposed<T>(const T*, const T*, T*, int, int, int, int, cudaStream_t);
MOH_SLIDING_INSTANTIATE(float)
MOH_SLIDING_INSTANTIATE(__half)
MOH_SLIDING_INSTANTIATE(__nv_bfloat16)
#undef MOH_SLIDING_INSTANTIATE

}  // namespace moh::vision::cuda

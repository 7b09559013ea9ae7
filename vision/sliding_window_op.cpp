#include "vision/sliding_window_op.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <vector>

#include "vision/nn/fused_ops.h"

#ifdef MOH_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "vision/cuda/sliding_window.h"
#endif

namespace moh::vision {

namespace {

enum class Op { qk, av, av_t };

constexpr int kNeighbours = 9;  // a 3 x 3 window

// Token index of neighbour z = 3·(dy+1) + (dx+1) of token (y, x), or −1 outside the map (as the CUDA kernels).
inline int64_t neighbour(int64_t y, int64_t x, int z, int64_t H, int64_t W) {
  const int64_t ny = y + z / 3 - 1, nx = x + z % 3 - 1;
  return (ny < 0 || ny >= H || nx < 0 || nx >= W) ? -1 : ny * W + nx;
}

// A (B, h, N, C) tensor whose channel dim is contiguous, addressed as rows (i = b·h + head, n).
template <class T>
struct Rows {
  T* p;
  int64_t heads, sb, sh, sn;
  explicit Rows(const at::Tensor& t)
      : p(static_cast<T*>(t.data_ptr())), heads(t.size(1)), sb(t.stride(0)), sh(t.stride(1)), sn(t.stride(2)) {}
  T* row(int64_t i, int64_t n) const { return p + (i / heads) * sb + (i % heads) * sh + n * sn; }
};

// The three window operations on the CPU (the same definitions as vision/cuda/sliding_window.h), one output row per
// (i, n): qk writes 9 logits, av / av_t a C-wide row. Out-of-map neighbours contribute 0. Plain loops over the
// contiguous channel dim (auto-vectorised); rows are split over LibTorch's intra-op threads.
template <class T>
void cpu_window(Op op, const at::Tensor& a, const at::Tensor& b, at::Tensor& out, int64_t H, int64_t W) {
  const Rows<const T> A(a), Bv(b);
  const int64_t BH = a.size(0) * a.size(1), N = H * W;
  const int64_t C = op == Op::qk ? a.size(3) : b.size(3);
  T* o = out.data_ptr<T>();  // contiguous (B, h, N, 9) or (B, h, N, C)
  const int64_t width = op == Op::qk ? kNeighbours : C;
  at::parallel_for(0, BH * N, 256, [&](int64_t begin, int64_t end) {
    std::vector<T> acc(static_cast<size_t>(C));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r / N, n = r % N, y = n / W, x = n % W;
      T* dst = o + r * width;
      if (op == Op::qk) {  // dst[z] = a[i, n] · b[i, nbr(n, z)]
        const T* q = A.row(i, n);
        for (int z = 0; z < kNeighbours; ++z) {
          const int64_t m = neighbour(y, x, z, H, W);
          T s = 0;
          if (m >= 0) {
            const T* k = Bv.row(i, m);
            for (int64_t c = 0; c < C; ++c) s += q[c] * k[c];
          }
          dst[z] = s;
        }
        continue;
      }
      std::fill(acc.begin(), acc.end(), T(0));
      for (int z = 0; z < kNeighbours; ++z) {
        // av: weights of this token, values of its neighbour z; av_t (adjoint): the token whose neighbour z is this
        // one sits at offset −off(z) = off(8 − z), and both its weight z and its row are read there.
        const int64_t m = neighbour(y, x, op == Op::av ? z : kNeighbours - 1 - z, H, W);
        if (m < 0) continue;
        const T w = op == Op::av ? A.row(i, n)[z] : A.row(i, m)[z];
        const T* v = Bv.row(i, m);
        for (int64_t c = 0; c < C; ++c) acc[static_cast<size_t>(c)] += w * v[c];
      }
      std::copy(acc.begin(), acc.end(), dst);
    }
  });
}

// A (B, h, N, ·) operand with its last dim contiguous.
at::Tensor rows_view(const at::Tensor& t) {
  return t.stride(-1) == 1 ? t : t.contiguous();
}

at::Tensor run_cpu(Op op, const at::Tensor& a, const at::Tensor& b, int64_t H, int64_t W) {
  const at::ScalarType dt = a.scalar_type();
  if (dt != at::kFloat && dt != at::kDouble)  // bf16 / fp16 (autocast): accumulate in fp32
    return run_cpu(op, a.to(at::kFloat), b.to(at::kFloat), H, W).to(dt);
  const at::Tensor x = rows_view(a), y = rows_view(b);
  const int64_t B = x.size(0), h = x.size(1), N = x.size(2);
  at::Tensor out = at::empty({B, h, N, op == Op::qk ? int64_t{kNeighbours} : y.size(3)}, x.options());
  if (dt == at::kFloat)
    cpu_window<float>(op, x, y, out, H, W);
  else
    cpu_window<double>(op, x, y, out, H, W);
  return out;
}

#ifdef MOH_CUDA_KERNELS
// Runs one CUDA kernel on contiguous (BH, N, ·) views; a and b share the dtype.
at::Tensor run_cuda(Op op, const at::Tensor& a, const at::Tensor& b, int64_t H, int64_t W) {
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  const int64_t B = x.size(0), h = x.size(1), N = x.size(2);
  const int64_t C = op == Op::qk ? x.size(3) : y.size(3);
  at::Tensor out = op == Op::qk ? at::empty({B, h, N, 9}, x.options()) : at::empty({B, h, N, C}, x.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  const int bh = static_cast<int>(B * h), hh = static_cast<int>(H), ww = static_cast<int>(W), cc = static_cast<int>(C);
  cudaError_t err = cudaSuccess;
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* p = reinterpret_cast<const T*>(x.data_ptr());
    const T* q = reinterpret_cast<const T*>(y.data_ptr());
    T* o = reinterpret_cast<T*>(out.data_ptr());
    if (op == Op::qk)
      err = cuda::sliding_qk<T>(p, q, o, bh, hh, ww, cc, stream);
    else if (op == Op::av)
      err = cuda::sliding_av<T>(p, q, o, bh, hh, ww, cc, stream);
    else
      err = cuda::sliding_av_transposed<T>(p, q, o, bh, hh, ww, cc, stream);
  };
  switch (x.scalar_type()) {
    case at::kFloat:
      run(static_cast<float*>(nullptr));
      break;
    case at::kHalf:
      run(static_cast<__half*>(nullptr));
      break;
    case at::kBFloat16:
      run(static_cast<__nv_bfloat16*>(nullptr));
      break;
    default:
      TORCH_CHECK(false, "sliding-window kernels: unsupported dtype ", x.scalar_type());
  }
  TORCH_CHECK(err == cudaSuccess, "sliding-window kernel failed: ", cudaGetErrorString(err));
  return out;
}
#endif

at::Tensor launch(Op op, const at::Tensor& a, const at::Tensor& b, int64_t H, int64_t W) {
  TORCH_CHECK(a.dim() == 4 && b.dim() == 4 && a.size(2) == H * W, "sliding-window op: (B, h, ", H, "x", W,
              ", ·) operands expected, got ", a.sizes(), " and ", b.sizes());
  TORCH_CHECK(a.device() == b.device(), "sliding-window op: operands on different devices");
  if (a.is_cpu()) return run_cpu(op, a, b, H, W);
#ifdef MOH_CUDA_KERNELS
  if (a.is_cuda()) return run_cuda(op, a, b, H, W);
#endif
  TORCH_CHECK(false, "sliding-window op: no kernels for device ", a.device());
}

// logits = qk(q, k):  dq = av(g, k),  dk = avᵀ(g, q)
struct SlidingQK : torch::autograd::Function<SlidingQK> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, int64_t H,
                            int64_t W) {
    ctx->save_for_backward({q, k});
    ctx->saved_data["H"] = H, ctx->saved_data["W"] = W;
    return launch(Op::qk, q, k, H, W);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::tensor_list g) {
    const auto s = ctx->get_saved_variables();
    const int64_t H = ctx->saved_data["H"].toInt(), W = ctx->saved_data["W"].toInt();
    const at::Tensor go = g[0].to(s[0].scalar_type());
    return {launch(Op::av, go, s[1], H, W), launch(Op::av_t, go, s[0], H, W), at::Tensor(), at::Tensor()};
  }
};

// out = av(w, v):  dw = qk(g, v),  dv = avᵀ(w, g)
struct SlidingAV : torch::autograd::Function<SlidingAV> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& w, const at::Tensor& v, int64_t H,
                            int64_t W) {
    ctx->save_for_backward({w, v});
    ctx->saved_data["H"] = H, ctx->saved_data["W"] = W;
    return launch(Op::av, w, v, H, W);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::tensor_list g) {
    const auto s = ctx->get_saved_variables();
    const int64_t H = ctx->saved_data["H"].toInt(), W = ctx->saved_data["W"].toInt();
    const at::Tensor go = g[0].to(s[0].scalar_type());
    return {launch(Op::qk, go, s[1], H, W), launch(Op::av_t, s[0], go, H, W), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool sliding_window_kernels_available(const at::Device& device) {
  return nn::fused_kernels_available(device);  // one build switch (MOH_CUDA_KERNELS) builds every CUDA kernel
}

at::Tensor sliding_window_qk(const at::Tensor& q, const at::Tensor& k, int64_t H, int64_t W) {
  const auto dt = at::result_type(q, k);
  return SlidingQK::apply(q.to(dt), k.to(dt), H, W);
}

at::Tensor sliding_window_av(const at::Tensor& w, const at::Tensor& v, int64_t H, int64_t W) {
  const auto dt = at::result_type(w, v);
  return SlidingAV::apply(w.to(dt), v.to(dt), H, W);
}

}  // namespace moh::vision

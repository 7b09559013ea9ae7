#include "vision/sliding_window_op.h"

#include "core/error.h"

#ifdef MOH_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/autograd.h>

#include <type_traits>

#include "vision/cuda/sliding_window.h"
#endif

namespace moh::vision {

#ifndef MOH_CUDA_KERNELS

bool sliding_window_kernels_available() { return false; }
at::Tensor sliding_window_qk(const at::Tensor&, const at::Tensor&, int64_t, int64_t) {
  throw UserError("sliding-window kernels", "this build has no CUDA kernels", "build against a CUDA LibTorch");
}
at::Tensor sliding_window_av(const at::Tensor&, const at::Tensor&, int64_t, int64_t) {
  throw UserError("sliding-window kernels", "this build has no CUDA kernels", "build against a CUDA LibTorch");
}

#else

namespace {

enum class Op { qk, av, av_t };

// Runs one kernel on contiguous (BH, N, ·) views; a and b share the dtype.
at::Tensor launch(Op op, const at::Tensor& a, const at::Tensor& b, int64_t H, int64_t W) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda(), "sliding-window kernels take CUDA tensors");
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  const int64_t B = x.size(0), h = x.size(1), N = x.size(2);
  TORCH_CHECK(N == H * W, "sliding-window kernels: N = ", N, " is not ", H, "x", W);
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
    if (op == Op::qk) err = cuda::sliding_qk<T>(p, q, o, bh, hh, ww, cc, stream);
    else if (op == Op::av) err = cuda::sliding_av<T>(p, q, o, bh, hh, ww, cc, stream);
    else err = cuda::sliding_av_transposed<T>(p, q, o, bh, hh, ww, cc, stream);
  };
  switch (x.scalar_type()) {
    case at::kFloat: run(static_cast<float*>(nullptr)); break;
    case at::kHalf: run(static_cast<__half*>(nullptr)); break;
    case at::kBFloat16: run(static_cast<__nv_bfloat16*>(nullptr)); break;
    default: TORCH_CHECK(false, "sliding-window kernels: unsupported dtype ", x.scalar_type());
  }
  TORCH_CHECK(err == cudaSuccess, "sliding-window kernel failed: ", cudaGetErrorString(err));
  return out;
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

bool sliding_window_kernels_available() { return true; }

at::Tensor sliding_window_qk(const at::Tensor& q, const at::Tensor& k, int64_t H, int64_t W) {
  const auto dt = at::result_type(q, k);
  return SlidingQK::apply(q.to(dt), k.to(dt), H, W);
}

at::Tensor sliding_window_av(const at::Tensor& w, const at::Tensor& v, int64_t H, int64_t W) {
  const auto dt = at::result_type(w, v);
  return SlidingAV::apply(w.to(dt), v.to(dt), H, W);
}

#endif

}  // namespace moh::vision

// torch.ops.moh: every schema of the C++ kernels, defined once; the kernels of each dispatch key (block_ops.cpp,
// attention_ops.cpp) and the metric ops (metric_ops.cpp) are registered on them.
// The fake (meta) implementations and the autograd formulas are registered from Python (moh_torch/_ops.py), as
// torch.library asks for ops defined in C++: each forward op returns what its backward needs, and each backward
// is an op of its own, so torch.compile traces both as opaque nodes of known shapes.
#include <sstream>

#include "python/csrc/ops.h"

namespace moh::torch_ops {

std::string shape_str(at::IntArrayRef sizes) {
  std::ostringstream s;
  s << sizes;
  return s.str();
}

void check_dims(const char* op, const char* name, const at::Tensor& t, int64_t dims, const char* shape) {
  TORCH_CHECK_VALUE(t.dim() == dims, "moh::", op, ": ", name, " must be ", shape, ", got ", shape_str(t.sizes()));
}

void check_sizes(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef want, const char* shape) {
  TORCH_CHECK_VALUE(t.sizes() == want, "moh::", op, ": ", name, " must be ", shape, " = ", shape_str(want), ", got ",
                    shape_str(t.sizes()));
}

void check_fused_type(const char* op, const char* name, const at::Tensor& t) {
  const at::ScalarType s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kBFloat16 || s == at::kHalf, "moh::", op, ": ", name,
                   " must be float32, bfloat16 or float16, got ", s);
}

void check_device(const char* op, const char* name, const at::Tensor& t, const c10::Device& device) {
  TORCH_CHECK_VALUE(t.device() == device, "moh::", op, ": ", name, " must be on ", device, " (the first input's), got ",
                    t.device());
}

void check_type(const char* op, const char* name, const at::Tensor& t, at::ScalarType type) {
  TORCH_CHECK_TYPE(t.scalar_type() == type, "moh::", op, ": ", name, " must be ", type, ", got ", t.scalar_type());
}

void check_index_range(const char* op, const char* name, const at::Tensor& t, int64_t bound) {
  if (t.numel() == 0) return;
  if (t.is_cuda()) {
    at::_assert_async(at::logical_and(t.min() >= 0, t.max() < bound));
    return;
  }
  const auto [lo, hi] = at::aminmax(t);
  TORCH_CHECK_VALUE(lo.item<int64_t>() >= 0 && hi.item<int64_t>() < bound, "moh::", op, ": ", name,
                    " must hold indices in [0, ", bound, "), got values in [", lo.item<int64_t>(), ", ",
                    hi.item<int64_t>(), "]");
}

}  // namespace moh::torch_ops

TORCH_LIBRARY(moh, m) {
  // DiT-block ops (vision/nn/fused_ops.h).
  m.def("ln_modulate(Tensor x, Tensor shift, Tensor scale, float eps) -> (Tensor out, Tensor mean, Tensor rstd)");
  m.def(
      "ln_modulate_backward(Tensor grad, Tensor x, Tensor shift, Tensor scale, Tensor mean, Tensor rstd) -> "
      "(Tensor, Tensor, Tensor)");
  m.def("gate_residual(Tensor x, Tensor gate, Tensor branch) -> Tensor");
  m.def("gate_residual_backward(Tensor grad, Tensor gate, Tensor branch) -> (Tensor, Tensor)");
  m.def("bias_gelu(Tensor z, Tensor bias) -> Tensor");
  m.def("bias_gelu_backward(Tensor grad, Tensor z, Tensor bias) -> (Tensor, Tensor)");
  m.def(
      "route(Tensor logits, int heads, int shared, int topk, bool scale_by_k=True) -> "
      "(Tensor gates, Tensor routed, Tensor picks, Tensor aux_loss)");
  m.def(
      "route_backward(Tensor logits, Tensor routed, Tensor picks, Tensor grad_gates, Tensor grad_aux, int heads, "
      "int shared, int topk, bool scale_by_k) -> Tensor");
  m.def("gate_heads(Tensor o, Tensor gates) -> Tensor");
  m.def("gate_heads_backward(Tensor grad, Tensor o, Tensor gates) -> (Tensor, Tensor)");
  // MoH attention (vision/nn/head_mix.h); grad_* of absent inputs come back as empty tensors.
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, Tensor? gates, Tensor? routed, Tensor? bias, int shared, float scale, "
      "str path) -> (Tensor out, Tensor o, Tensor lse)");
  m.def(
      "attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? gates, Tensor? routed, Tensor? bias, "
      "Tensor o, Tensor lse, int shared, float scale, str path) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // Metrics of `moh fid` (eval/): numbers, not tensors.
  m.def(
      "fid_report(str samples, str reference, str features, str metrics, str is_mode, str resize, int batch_size, "
      "str device) -> str");
  m.def(
      "fid_report_images(Tensor samples, str reference, str features, str metrics, str is_mode, str resize, "
      "int batch_size, str device) -> str");
  m.def("frechet_distance(Tensor mu1, Tensor sigma1, Tensor mu2, Tensor sigma2) -> float");
  m.def("gaussian_stats(Tensor features) -> (Tensor mu, Tensor sigma)");
  m.def("inception_score(Tensor logits, str mode) -> (float mean, float std)");
  m.def("precision_recall(Tensor reference, Tensor samples) -> (float precision, float recall)");
  m.def("kid(Tensor a, Tensor b, int subsets, int subset_size) -> (float mean, float std)");
}

TORCH_LIBRARY_IMPL(moh, CPU, m) {
  moh::torch_ops::impl_block_ops(m);
  moh::torch_ops::impl_attention_ops(m);
}

#ifdef MOH_CUDA_KERNELS
TORCH_LIBRARY_IMPL(moh, CUDA, m) {
  moh::torch_ops::impl_block_ops(m);
  moh::torch_ops::impl_attention_ops(m);
}
#endif

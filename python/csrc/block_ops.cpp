// The DiT-block ops of torch.ops.moh: LayerNorm + adaLN modulate, gate × branch + residual, bias + GELU(tanh), the
// MoH router and the gated-heads layout pass, forward and backward, on the toolkit's fused loops (CPU) and CUDA
// kernels (vision/nn/fused_ops.h: one arithmetic for both, written in vision/nn/fused_math.h).
#include <tuple>

#include "python/csrc/ops.h"
#include "vision/nn/fused_kernels.h"
#include "vision/nn/fused_ops.h"

namespace moh::torch_ops {

namespace {

namespace fused = moh::nn::fused;

// (B, D) rows of x (B, N, D), same type for shift and scale: the modulation's chunks.
void check_rows(const char* op, const char* name, const at::Tensor& t, const at::Tensor& x) {
  check_dims(op, name, t, 2, "(B, D)");
  check_sizes(op, name, t, {x.size(0), x.size(2)}, "(B, D)");
  check_fused_type(op, name, t);
  check_device(op, name, t, x.device());
}

// A backward op's incoming gradient: `like`'s shape and device, a type the fused loops read.
void check_grad(const char* op, const at::Tensor& grad, const at::Tensor& like, const char* shape) {
  check_sizes(op, "grad", grad, like.sizes(), shape);
  check_fused_type(op, "grad", grad);
  check_device(op, "grad", grad, like.device());
}

void check_ln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  constexpr const char* op = "ln_modulate";
  check_dims(op, "x", x, 3, "(B, N, D)");
  check_fused_type(op, "x", x);
  check_rows(op, "shift", shift, x);
  check_rows(op, "scale", scale, x);
  TORCH_CHECK_TYPE(shift.scalar_type() == scale.scalar_type(), "moh::ln_modulate: shift and scale must have one type, ",
                   "got ", shift.scalar_type(), " and ", scale.scalar_type());
  TORCH_CHECK_VALUE(!x.is_cuda() || x.size(2) <= fused::kMaxRowWidth, "moh::ln_modulate: x's width D must be at most ",
                    fused::kMaxRowWidth, " on CUDA, got ", x.size(2));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ln_modulate(const at::Tensor& x, const at::Tensor& shift,
                                                           const at::Tensor& scale, double eps) {
  const DeviceOf guard(x.device());
  check_ln_modulate(x, shift, scale);
  TORCH_CHECK_VALUE(eps > 0, "moh::ln_modulate: eps must be positive, got ", eps);
  auto r = fused::ln_modulate_forward(x, shift, scale, eps, x.scalar_type());
  return {r.out, r.mean, r.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ln_modulate_backward(const at::Tensor& grad, const at::Tensor& x,
                                                                    const at::Tensor& shift, const at::Tensor& scale,
                                                                    const at::Tensor& mean, const at::Tensor& rstd) {
  constexpr const char* op = "ln_modulate_backward";
  const DeviceOf guard(x.device());
  check_ln_modulate(x, shift, scale);
  check_grad(op, grad, x, "x's shape (B, N, D)");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"mean", mean}, {"rstd", rstd}}) {
    check_sizes(op, name, t, {x.size(0) * x.size(1)}, "(B*N), ln_modulate's");
    check_type(op, name, t, at::kFloat);
    check_device(op, name, t, x.device());
  }
  auto g = fused::ln_modulate_backward(grad.to(x.scalar_type()), x, shift, scale, mean, rstd);
  return {g[0], g[1], g[2]};
}

void check_gate_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& branch) {
  constexpr const char* op = "gate_residual";
  check_dims(op, "x", x, 3, "(B, N, D)");
  check_fused_type(op, "x", x);
  check_sizes(op, "branch", branch, x.sizes(), "x's shape (B, N, D)");
  check_fused_type(op, "branch", branch);
  check_device(op, "branch", branch, x.device());
  check_rows(op, "gate", gate, x);
  TORCH_CHECK_TYPE(gate.scalar_type() == branch.scalar_type(), "moh::gate_residual: gate must have branch's type ",
                   branch.scalar_type(), ", got ", gate.scalar_type());
  TORCH_CHECK_TYPE(x.scalar_type() == branch.scalar_type() || x.scalar_type() == at::kFloat,
                   "moh::gate_residual: x must have branch's type or float32, got ", x.scalar_type());
}

at::Tensor gate_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& branch) {
  const DeviceOf guard(x.device());
  check_gate_residual(x, gate, branch);
  return fused::gate_residual_forward(x, gate, branch);
}

std::tuple<at::Tensor, at::Tensor> gate_residual_backward(const at::Tensor& grad, const at::Tensor& gate,
                                                          const at::Tensor& branch) {
  constexpr const char* op = "gate_residual_backward";
  const DeviceOf guard(branch.device());
  check_dims(op, "branch", branch, 3, "(B, N, D)");
  check_fused_type(op, "branch", branch);
  check_grad(op, grad, branch, "branch's shape (B, N, D)");
  check_rows(op, "gate", gate, branch);
  check_type(op, "gate", gate, branch.scalar_type());
  auto g = fused::gate_residual_backward(grad, gate, branch);
  return {g[0], g[1]};
}

void check_bias_gelu(const at::Tensor& z, const at::Tensor& bias) {
  constexpr const char* op = "bias_gelu";
  TORCH_CHECK_VALUE(z.dim() >= 1, "moh::bias_gelu: z must be (..., F), got ", shape_str(z.sizes()));
  check_fused_type(op, "z", z);
  check_dims(op, "bias", bias, 1, "(F)");
  check_sizes(op, "bias", bias, {z.size(-1)}, "(F), z's last dim");
  check_device(op, "bias", bias, z.device());
  TORCH_CHECK_TYPE(bias.scalar_type() == z.scalar_type() || bias.scalar_type() == at::kFloat,
                   "moh::bias_gelu: bias must have z's type or float32, got ", bias.scalar_type());
}

at::Tensor bias_gelu(const at::Tensor& z, const at::Tensor& bias) {
  const DeviceOf guard(z.device());
  check_bias_gelu(z, bias);
  if (z.numel() == 0) return at::empty_like(z, at::MemoryFormat::Contiguous);
  return fused::bias_gelu_forward(z, bias);
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad, const at::Tensor& z,
                                                      const at::Tensor& bias) {
  const DeviceOf guard(z.device());
  check_bias_gelu(z, bias);
  check_grad("bias_gelu_backward", grad, z, "z's shape");
  if (z.numel() == 0) return {at::empty_like(z, at::MemoryFormat::Contiguous), at::zeros_like(bias)};
  auto g = fused::bias_gelu_backward(grad, z, bias);
  return {g[0], g[1]};
}

fused::RouterShape router_shape(const at::Tensor& logits, int64_t heads, int64_t shared, int64_t topk,
                                bool scale_by_k) {
  constexpr const char* op = "route";
  TORCH_CHECK_VALUE(heads >= 1 && shared >= 0 && shared < heads, "moh::route: shared must be in [0, heads) = [0, ",
                    heads, "), got ", shared);
  TORCH_CHECK_VALUE(topk >= 1 && topk <= heads - shared, "moh::route: topk must be in [1, heads - shared] = [1, ",
                    heads - shared, "], got ", topk, " (a layer without routed heads needs no router op)");
  fused::RouterShape s;
  s.experts = static_cast<int>(heads - shared), s.shared = static_cast<int>(shared), s.topk = static_cast<int>(topk);
  s.scale_by_k = scale_by_k;
  check_dims(op, "logits", logits, 2, "(T, L)");
  TORCH_CHECK_VALUE(logits.size(1) == s.logits(), "moh::route: logits must be (T, ", s.logits(), ") for heads=", heads,
                    ", shared=", shared, " (routed ", s.experts, " | shared ", s.n_shared_logits(), " | alpha ",
                    s.n_alpha(), "), got ", shape_str(logits.sizes()));
  TORCH_CHECK_VALUE(s.logits() <= fused::kMaxRouterLogits && topk <= fused::kMaxRouterTopK, "moh::route: at most ",
                    fused::kMaxRouterLogits, " logits and topk ", fused::kMaxRouterTopK, ", got ", s.logits(), " and ",
                    topk);
  check_fused_type(op, "logits", logits);
  return s;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> route(const at::Tensor& logits, int64_t heads,
                                                                 int64_t shared, int64_t topk, bool scale_by_k) {
  const DeviceOf guard(logits.device());
  const fused::RouterShape s = router_shape(logits, heads, shared, topk, scale_by_k);
  const nn::FusedRouting r = fused::route_forward(logits, s);
  return {r.gates, r.routed, r.picks, r.aux_loss};
}

at::Tensor route_backward(const at::Tensor& logits, const at::Tensor& routed, const at::Tensor& picks,
                          const at::Tensor& grad_gates, const at::Tensor& grad_aux, int64_t heads, int64_t shared,
                          int64_t topk, bool scale_by_k) {
  constexpr const char* op = "route_backward";
  const DeviceOf guard(logits.device());
  const fused::RouterShape s = router_shape(logits, heads, shared, topk, scale_by_k);
  const int64_t T = logits.size(0);
  check_sizes(op, "routed", routed, {T, topk}, "(T, topk), route's");
  check_type(op, "routed", routed, at::kLong);
  check_device(op, "routed", routed, logits.device());
  check_index_range(op, "routed", routed, s.experts);
  check_sizes(op, "picks", picks, {s.experts}, "(heads - shared), route's");
  check_type(op, "picks", picks, at::kLong);
  check_device(op, "picks", picks, logits.device());
  check_sizes(op, "grad_gates", grad_gates, {T, heads}, "(T, heads)");
  TORCH_CHECK_TYPE(grad_gates.is_floating_point(), "moh::route_backward: grad_gates must be floating point, got ",
                   grad_gates.scalar_type());
  check_device(op, "grad_gates", grad_gates, logits.device());
  check_sizes(op, "grad_aux", grad_aux, {}, "a 0-dim tensor");
  TORCH_CHECK_TYPE(grad_aux.is_floating_point(), "moh::route_backward: grad_aux must be floating point, got ",
                   grad_aux.scalar_type());
  check_device(op, "grad_aux", grad_aux, logits.device());
  return fused::route_backward(logits, routed, picks, grad_gates, grad_aux, s);
}

void check_gate_heads(const at::Tensor& o, const at::Tensor& gates) {
  constexpr const char* op = "gate_heads";
  check_dims(op, "o", o, 4, "(B, h, N, d)");
  check_fused_type(op, "o", o);
  check_sizes(op, "gates", gates, {o.size(0) * o.size(2), o.size(1)}, "(B*N, h)");
  TORCH_CHECK_TYPE(gates.scalar_type() == at::kFloat, "moh::gate_heads: gates must be float32, got ",
                   gates.scalar_type());
  check_device(op, "gates", gates, o.device());
}

at::Tensor gate_heads(const at::Tensor& o, const at::Tensor& gates) {
  const DeviceOf guard(o.device());
  check_gate_heads(o, gates);
  return fused::gate_heads_forward(o, gates, o.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> gate_heads_backward(const at::Tensor& grad, const at::Tensor& o,
                                                       const at::Tensor& gates) {
  const DeviceOf guard(o.device());
  check_gate_heads(o, gates);
  check_sizes("gate_heads_backward", "grad", grad, {o.size(0), o.size(2), o.size(1) * o.size(3)}, "(B, N, h*d)");
  check_fused_type("gate_heads_backward", "grad", grad);
  check_device("gate_heads_backward", "grad", grad, o.device());
  auto g = fused::gate_heads_backward(grad.to(o.scalar_type()), o, gates);
  return {g[0].contiguous(), g[1]};
}

}  // namespace

void impl_block_ops(torch::Library& m) {
  m.impl("ln_modulate", &ln_modulate);
  m.impl("ln_modulate_backward", &ln_modulate_backward);
  m.impl("gate_residual", &gate_residual);
  m.impl("gate_residual_backward", &gate_residual_backward);
  m.impl("bias_gelu", &bias_gelu);
  m.impl("bias_gelu_backward", &bias_gelu_backward);
  m.impl("route", &route);
  m.impl("route_backward", &route_backward);
  m.impl("gate_heads", &gate_heads);
  m.impl("gate_heads_backward", &gate_heads_backward);
}

}  // namespace moh::torch_ops

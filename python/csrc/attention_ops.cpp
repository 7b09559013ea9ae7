// MoH attention in torch.ops.moh: `attention` (the gated heads from q, k, v and the router's gates and picks) and its
// backward, on vision/nn/head_mix.h. (`moh_attention`, from the router logits, composes `route` and `attention` in
// Python: moh_torch/_ops.py.)
#include <optional>
#include <string>
#include <tuple>

#include "python/csrc/ops.h"
#include "vision/nn/fused_math.h"
#include "vision/nn/head_mix.h"

namespace moh::torch_ops {

namespace {

using moh::AttentionPath;

AttentionPath path_of(c10::string_view path) {
  if (path == "dense") return AttentionPath::dense;
  if (path == "sparse") return AttentionPath::sparse;
  if (path == "auto") return AttentionPath::automatic;
  TORCH_CHECK_VALUE(false, "moh::attention: path must be \"dense\", \"sparse\" or \"auto\", got \"", std::string(path),
                    "\"");
  return AttentionPath::dense;
}

at::Tensor value_or_undefined(const std::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  constexpr const char* op = "attention";
  check_dims(op, "q", q, 4, "(B, h, N, d)");
  TORCH_CHECK_TYPE(q.is_floating_point(), "moh::attention: q must be floating point, got ", q.scalar_type());
  const int64_t B = q.size(0), h = q.size(1), N = q.size(2), d = q.size(3);
  TORCH_CHECK_VALUE(h > 0 && d > 0 && (N > 0 || B == 0), "moh::attention: q must have heads, keys and head width, ",
                    "got ", shape_str(q.sizes()), " (only the batch may be empty)");
  check_dims(op, "k", k, 4, "(B, h_kv, N, d)");
  TORCH_CHECK_VALUE(k.size(1) == h || k.size(1) == 1, "moh::attention: k must have h = ", h,
                    " heads or 1 (shared by all heads), got ", shape_str(k.sizes()));
  check_sizes(op, "k", k, {B, k.size(1), N, d}, "(B, h_kv, N, d)");
  check_sizes(op, "v", v, k.sizes(), "k's shape (B, h_kv, N, d)");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"k", k}, {"v", v}}) {
    TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), "moh::attention: ", name, " must have q's type ",
                     q.scalar_type(), ", got ", t.scalar_type());
    check_device(op, name, t, q.device());
  }
}

// The inputs as head_mix takes them, every argument checked.
nn::HeadMixInputs head_mix_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const std::optional<at::Tensor>& gates, const std::optional<at::Tensor>& routed,
                                  const std::optional<at::Tensor>& bias, int64_t shared, double scale,
                                  c10::string_view path) {
  constexpr const char* op = "attention";
  check_qkv(q, k, v);
  const int64_t B = q.size(0), h = q.size(1), N = q.size(2);
  nn::HeadMixInputs in;
  in.q = q, in.k = k, in.v = v, in.scale = scale, in.shared = shared;
  in.gates = value_or_undefined(gates), in.routed = value_or_undefined(routed), in.bias = value_or_undefined(bias);
  TORCH_CHECK_VALUE(shared >= 0 && shared <= h, "moh::attention: shared must be in [0, h] = [0, ", h, "], got ",
                    shared);
  if (in.gates.defined()) {
    check_sizes(op, "gates", in.gates, {B * N, h}, "(B*N, h)");
    TORCH_CHECK_TYPE(in.gates.is_floating_point(), "moh::attention: gates must be floating point, got ",
                     in.gates.scalar_type());
    check_device(op, "gates", in.gates, q.device());
  }
  if (in.routed.defined()) {
    TORCH_CHECK_VALUE(in.gates.defined(), "moh::attention: routed needs gates (the router's weights of its heads)");
    check_dims(op, "routed", in.routed, 2, "(B*N, K)");
    TORCH_CHECK_VALUE(in.routed.size(0) == B * N && in.routed.size(1) <= h - shared,
                      "moh::attention: routed must be (B*N, K) with K in [0, h - shared] = [0, ", h - shared, "], got ",
                      shape_str(in.routed.sizes()));
    TORCH_CHECK_TYPE(in.routed.scalar_type() == at::kLong, "moh::attention: routed must be int64, got ",
                     in.routed.scalar_type());
    check_device(op, "routed", in.routed, q.device());
    check_index_range(op, "routed", in.routed, h - shared);
    if (in.routed.size(1) == 0) in.routed = at::Tensor();
  }
  if (in.bias.defined()) {
    const bool ok = (in.bias.dim() == 3 && in.bias.sizes() == at::IntArrayRef{h, N, N}) ||
                    (in.bias.dim() == 4 && (in.bias.size(0) == 1 || in.bias.size(0) == B) &&
                     in.bias.sizes().slice(1) == at::IntArrayRef{h, N, N});
    TORCH_CHECK_VALUE(ok, "moh::attention: bias must be (h, N, N) = ", shape_str({h, N, N}), " or (B|1, h, N, N), got ",
                      shape_str(in.bias.sizes()));
    check_device(op, "bias", in.bias, q.device());
  }
  in.path = nn::head_mix_path(path_of(path), in);
  return in;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                         const std::optional<at::Tensor>& gates,
                                                         const std::optional<at::Tensor>& routed,
                                                         const std::optional<at::Tensor>& bias, int64_t shared,
                                                         double scale, c10::string_view path) {
  const DeviceOf guard(q.device());
  const nn::HeadMixInputs in = head_mix_inputs(q, k, v, gates, routed, bias, shared, scale, path);
  if (q.size(0) == 0) {  // an empty batch: empty results of the shapes and types the kernels return
    const int64_t h = q.size(1), N = q.size(2), d = q.size(3);
    const auto lse_type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    return {q.new_empty({0, N, h * d}), q.new_empty({0, h, N, d}), q.new_empty({0, h, N}, q.options().dtype(lse_type))};
  }
  const nn::HeadMixForward f = nn::head_mix_forward(in);
  return {f.out, f.o, f.lse};
}

at::Tensor or_empty(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() ? t.contiguous() : at::empty({0}, like.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& gates, const std::optional<at::Tensor>& routed,
    const std::optional<at::Tensor>& bias, const at::Tensor& o, const at::Tensor& lse, int64_t shared, double scale,
    c10::string_view path) {
  constexpr const char* op = "attention_backward";
  const DeviceOf guard(q.device());
  const nn::HeadMixInputs in = head_mix_inputs(q, k, v, gates, routed, bias, shared, scale, path);
  const int64_t B = q.size(0), h = q.size(1), N = q.size(2), d = q.size(3);
  check_sizes(op, "grad", grad, {B, N, h * d}, "(B, N, h*d)");
  TORCH_CHECK_TYPE(grad.is_floating_point(), "moh::attention_backward: grad must be floating point, got ",
                   grad.scalar_type());
  check_device(op, "grad", grad, q.device());
  check_sizes(op, "o", o, q.sizes(), "q's shape (B, h, N, d), attention's");
  check_type(op, "o", o, q.scalar_type());
  check_device(op, "o", o, q.device());
  check_sizes(op, "lse", lse, {B, h, N}, "(B, h, N), attention's");
  check_type(op, "lse", lse, q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  check_device(op, "lse", lse, q.device());
  if (B == 0) {
    const at::Tensor none = at::empty({0}, q.options());
    return {at::zeros_like(q), at::zeros_like(k), at::zeros_like(v),
            in.gates.defined() ? at::zeros_like(in.gates) : none, in.bias.defined() ? at::zeros_like(in.bias) : none};
  }
  const nn::HeadMixGrads g = nn::head_mix_backward(grad.to(q.scalar_type()), in, {at::Tensor(), o, lse});
  return {g.q.contiguous(), g.k.contiguous(), g.v.contiguous(), or_empty(g.gates, q), or_empty(g.bias, q)};
}

}  // namespace

void impl_attention_ops(torch::Library& m) {
  m.impl("attention", &attention);
  m.impl("attention_backward", &attention_backward);
}

}  // namespace moh::torch_ops

#include "vision/nn/fused_ops.h"

#include <torch/autograd.h>

#include <initializer_list>

#include "core/error.h"
#include "core/platform/amp.h"
#include "vision/nn/fused_kernels.h"

#ifdef MOH_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "vision/nn/cuda/fused_block.h"
#endif

namespace moh::nn {

namespace {

using fused::DType;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

DType dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::f32;
    case at::kBFloat16:
      return DType::bf16;
    case at::kHalf:
      return DType::f16;
    default:
      TORCH_CHECK(false, "fused ops: unsupported dtype ", t);
  }
}
DType dtype_of(const at::Tensor& t) {
  return dtype_of(t.scalar_type());
}

// Every tensor defined, on one device the fused loops serve, of a type they take.
bool fused_inputs(std::initializer_list<at::Tensor> ts) {
  const at::Tensor& first = *ts.begin();
  for (const at::Tensor& t : ts)
    if (!t.defined() || t.device() != first.device() || !fused_dtype(t.scalar_type())) return false;
  return fused_kernels_available(first.device());
}

// A (B, D) operand as the loops read it: unit column stride.
fused::Rows rows_of(const at::Tensor& t) {
  return {t.data_ptr(), t.stride(0), dtype_of(t)};
}
at::Tensor unit_columns(const at::Tensor& t) {
  return t.stride(-1) == 1 ? t : t.contiguous();
}
at::Tensor partials(int64_t groups, int64_t rows, int64_t width, const at::Tensor& like) {
  return at::empty({groups, fused::tiles(rows), width}, like.options().dtype(at::kFloat));
}

#ifdef MOH_CUDA_KERNELS
cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}
void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "fused kernel ", what, " failed: ", cudaGetErrorString(err));
}
// The loop `fn` of fused_kernels.h on the device of tensor t: the CPU's, or the CUDA kernel of the same name.
#define MOH_FUSED_RUN(t, fn, ...)                                    \
  do {                                                               \
    if ((t).is_cuda())                                               \
      check_launch(fused::cuda::fn(__VA_ARGS__, stream_of(t)), #fn); \
    else                                                             \
      fused::cpu::fn(__VA_ARGS__);                                   \
  } while (0)
#else
#define MOH_FUSED_RUN(t, fn, ...) fused::cpu::fn(__VA_ARGS__)
#endif

fused::HeadStrides head_strides(const at::Tensor& o) {
  return {o.stride(0), o.stride(1), o.stride(2)};
}

fused::RouterShape shape_from(const std::vector<int64_t>& v) {
  fused::RouterShape s;
  s.experts = static_cast<int>(v[0]), s.shared = static_cast<int>(v[1]), s.topk = static_cast<int>(v[2]);
  s.scale_by_k = v[3] != 0;
  return s;
}

}  // namespace

namespace fused {

LnModulateForward ln_modulate_forward(const at::Tensor& x_in, const at::Tensor& shift, const at::Tensor& scale,
                                      double eps, at::ScalarType out_dtype) {
  const at::Tensor x = x_in.contiguous();
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(out_dtype));
  at::Tensor mean = at::empty({B * N}, x.options().dtype(at::kFloat)), rstd = at::empty_like(mean);
  const at::Tensor sh = unit_columns(shift), sc = unit_columns(scale);
  MOH_FUSED_RUN(x, ln_modulate_forward, x.data_ptr(), dtype_of(x), rows_of(sh), rows_of(sc), out.data_ptr(),
                dtype_of(out), mean.data_ptr<float>(), rstd.data_ptr<float>(), B, N, D, static_cast<float>(eps));
  return {out, mean, rstd};
}

std::array<at::Tensor, 3> ln_modulate_backward(const at::Tensor& dy_in, const at::Tensor& x_in, const at::Tensor& shift,
                                               const at::Tensor& scale, const at::Tensor& mean,
                                               const at::Tensor& rstd) {
  const at::Tensor x = x_in.contiguous(), dy = dy_in.contiguous(), sc = unit_columns(scale);
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
  at::Tensor dx = at::empty_like(x), dsh = partials(B, N, D, x), dsc = partials(B, N, D, x);
  MOH_FUSED_RUN(x, ln_modulate_backward, dy.data_ptr(), dtype_of(dy), x.data_ptr(), dtype_of(x), rows_of(sc),
                mean.data_ptr<float>(), rstd.data_ptr<float>(), dx.data_ptr(), dsh.data_ptr<float>(),
                dsc.data_ptr<float>(), B, N, D);
  // Σ over tiles in tile order, then the type of shift / scale (the official sums are tensors of that type).
  return {dx, dsh.sum(1).to(shift.scalar_type()), dsc.sum(1).to(scale.scalar_type())};
}

at::Tensor gate_residual_forward(const at::Tensor& x_in, const at::Tensor& gate, const at::Tensor& branch_in) {
  const at::Tensor x = x_in.contiguous(), branch = branch_in.contiguous(), g = unit_columns(gate);
  at::Tensor out = at::empty_like(x);
  MOH_FUSED_RUN(x, gate_residual_forward, x.data_ptr(), dtype_of(x), rows_of(g), branch.data_ptr(), dtype_of(branch),
                out.data_ptr(), x.size(0), x.size(1), x.size(2));
  return out;
}

std::array<at::Tensor, 2> gate_residual_backward(const at::Tensor& dout_in, const at::Tensor& gate,
                                                 const at::Tensor& branch_in) {
  const at::Tensor dout = dout_in.contiguous(), branch = branch_in.contiguous(), g = unit_columns(gate);
  const int64_t B = branch.size(0), N = branch.size(1), D = branch.size(2);
  at::Tensor dbranch = at::empty_like(branch), dg = partials(B, N, D, branch);
  MOH_FUSED_RUN(dout, gate_residual_backward, dout.data_ptr(), dtype_of(dout), rows_of(g), branch.data_ptr(),
                dtype_of(branch), dbranch.data_ptr(), dg.data_ptr<float>(), B, N, D);
  return {dg.sum(1).to(gate.scalar_type()), dbranch};
}

at::Tensor bias_gelu_forward(const at::Tensor& z_in, const at::Tensor& bias_in) {
  const at::Tensor z = z_in.contiguous(), bias = bias_in.contiguous();
  const int64_t F = z.size(-1), T = z.numel() / F;
  at::Tensor out = at::empty_like(z);
  MOH_FUSED_RUN(z, bias_gelu_forward, z.data_ptr(), dtype_of(z), bias.data_ptr(), dtype_of(bias), out.data_ptr(), T, F);
  return out;
}

std::array<at::Tensor, 2> bias_gelu_backward(const at::Tensor& dy_in, const at::Tensor& z_in,
                                             const at::Tensor& bias_in) {
  const at::Tensor z = z_in.contiguous(), bias = bias_in.contiguous();
  const at::Tensor dy = dy_in.to(z.scalar_type()).contiguous();
  const int64_t F = z.size(-1), T = z.numel() / F;
  at::Tensor dz = at::empty_like(z), db = partials(1, T, F, z);
  MOH_FUSED_RUN(z, bias_gelu_backward, dy.data_ptr(), z.data_ptr(), dtype_of(z), bias.data_ptr(), dtype_of(bias),
                dz.data_ptr(), db.data_ptr<float>(), T, F);
  // The official bias gradient is a sum in the product's type (the Linear's bias cast by autocast), then the bias's.
  return {dz, db.sum(1).reshape({F}).to(z.scalar_type()).to(bias.scalar_type())};
}

FusedRouting route_forward(const at::Tensor& logits_in, const RouterShape& s) {
  const at::Tensor logits = logits_in.contiguous();
  const int64_t T = logits.size(0), E = s.experts;
  const auto f32 = logits.options().dtype(at::kFloat);
  at::Tensor gates = at::empty({T, s.heads()}, f32), routed = at::empty({T, s.topk}, f32.dtype(at::kLong));
  at::Tensor p_part = at::empty({tiles(T), E}, f32), picks_part = at::empty_like(p_part, at::kLong);
  MOH_FUSED_RUN(logits, route_forward, logits.data_ptr(), dtype_of(logits), T, s, gates.data_ptr<float>(),
                routed.data_ptr<int64_t>(), p_part.data_ptr<float>(), picks_part.data_ptr<int64_t>());
  const at::Tensor picks = picks_part.sum(0);  // (E) int64: exact
  const double t = static_cast<double>(T), e = static_cast<double>(E);
  // E·Σ_i P_i f_i with P_i = mean_t p_ti and f_i = picks_i / T, as route_compact.
  const at::Tensor aux = ((p_part.sum(0) / t) * picks.to(at::kFloat)).sum() * (e / t);
  return {gates, routed, picks, aux};
}

at::Tensor route_backward(const at::Tensor& logits_in, const at::Tensor& routed_in, const at::Tensor& picks,
                          const at::Tensor& dgates_in, const at::Tensor& daux, const RouterShape& s) {
  const at::Tensor logits = logits_in.contiguous(), routed = routed_in.contiguous();
  const int64_t T = logits.size(0);
  at::Tensor dgates = dgates_in.defined() ? dgates_in.to(at::kFloat).contiguous()
                                          : at::zeros({T, s.heads()}, logits.options().dtype(at::kFloat));
  at::Tensor coef;  // ∂L/∂aux · E / T² · picks (E)
  if (daux.defined())
    coef =
        (picks.to(at::kFloat) *
         (daux.to(at::kFloat) * (static_cast<double>(s.experts) / (static_cast<double>(T) * static_cast<double>(T)))))
            .contiguous();
  at::Tensor dlogits = at::empty_like(logits);
  MOH_FUSED_RUN(logits, route_backward, logits.data_ptr(), dtype_of(logits), T, s, routed.data_ptr<int64_t>(),
                dgates.data_ptr<float>(), coef.defined() ? coef.data_ptr<float>() : nullptr, dlogits.data_ptr());
  return dlogits;
}

at::Tensor gate_heads_forward(const at::Tensor& o_in, const at::Tensor& gates_in, at::ScalarType out_dtype) {
  const at::Tensor o = unit_columns(o_in), gates = gates_in.contiguous();
  const int64_t B = o.size(0), h = o.size(1), N = o.size(2), d = o.size(3);
  at::Tensor out = at::empty({B, N, h * d}, o.options().dtype(out_dtype));
  MOH_FUSED_RUN(o, gate_heads_forward, o.data_ptr(), dtype_of(o), head_strides(o), gates.data_ptr<float>(),
                out.data_ptr(), dtype_of(out), B, h, N, d);
  return out;
}

std::array<at::Tensor, 2> gate_heads_backward(const at::Tensor& dout_in, const at::Tensor& o_in,
                                              const at::Tensor& gates_in) {
  const at::Tensor o = unit_columns(o_in), gates = gates_in.contiguous(), dout = dout_in.contiguous();
  const int64_t B = o.size(0), h = o.size(1), N = o.size(2), d = o.size(3);
  at::Tensor d_o = at::empty({B, N, h, d}, o.options()), dgates = at::empty_like(gates);
  MOH_FUSED_RUN(o, gate_heads_backward, dout.data_ptr(), dtype_of(dout), o.data_ptr(), dtype_of(o), head_strides(o),
                gates.data_ptr<float>(), d_o.data_ptr(), dgates.data_ptr<float>(), B, h, N, d);
  return {d_o.permute({0, 2, 1, 3}), dgates};  // (B, h, N, d) over the (B, N, h, d) memory
}

}  // namespace fused

namespace {

struct LnModulate : torch::autograd::Function<LnModulate> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                            double eps, int64_t out_dtype) {
    auto r = fused::ln_modulate_forward(x, shift, scale, eps, static_cast<at::ScalarType>(out_dtype));
    ctx->save_for_backward({x.contiguous(), shift, scale, r.mean, r.rstd});
    return r.out;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto s = ctx->get_saved_variables();
    auto g = fused::ln_modulate_backward(grads[0], s[0], s[1], s[2], s[3], s[4]);
    return {g[0], g[1], g[2], at::Tensor(), at::Tensor()};
  }
};

struct GateResidual : torch::autograd::Function<GateResidual> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gate,
                            const at::Tensor& branch) {
    ctx->save_for_backward({gate, branch.contiguous()});
    return fused::gate_residual_forward(x, gate, branch);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor dout = grads[0].contiguous();
    auto g = fused::gate_residual_backward(dout, s[0], s[1]);
    return {dout, g[0], g[1]};
  }
};

struct BiasGelu : torch::autograd::Function<BiasGelu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& z, const at::Tensor& bias) {
    ctx->save_for_backward({z.contiguous(), bias});
    return fused::bias_gelu_forward(z, bias);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto s = ctx->get_saved_variables();
    auto g = fused::bias_gelu_backward(grads[0], s[0], s[1]);
    return {g[0], g[1]};
  }
};

struct Route : torch::autograd::Function<Route> {
  // logits (T, L) → {gates (T, h) fp32, routed (T, K), picks (E), aux_loss (0-dim)}
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& logits, std::vector<int64_t> shape) {
    const FusedRouting r = fused::route_forward(logits, shape_from(shape));
    ctx->mark_non_differentiable({r.routed, r.picks});
    ctx->save_for_backward({logits.contiguous(), r.routed, r.picks});
    ctx->saved_data["shape"] = shape;
    return {r.gates, r.routed, r.picks, r.aux_loss};
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto sv = ctx->get_saved_variables();
    const fused::RouterShape s = shape_from(ctx->saved_data["shape"].toIntVector());
    return {fused::route_backward(sv[0], sv[1], sv[2], grads[0], grads[3], s), at::Tensor()};
  }
};

struct GateHeads : torch::autograd::Function<GateHeads> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& o_in, const at::Tensor& gates, int64_t out_dtype) {
    const at::Tensor o = unit_columns(o_in);
    ctx->save_for_backward({o, gates});
    return fused::gate_heads_forward(o, gates, static_cast<at::ScalarType>(out_dtype));
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto s = ctx->get_saved_variables();
    auto g = fused::gate_heads_backward(grads[0], s[0], s[1]);
    return {g[0], g[1], at::Tensor()};
  }
};

}  // namespace

#undef MOH_FUSED_RUN

bool fused_kernels_available(const c10::Device& device) {
  if (device.is_cpu()) return true;
#ifdef MOH_CUDA_KERNELS
  return device.is_cuda();
#else
  return false;
#endif
}

bool use_fused_ops(FusedMode mode, const c10::Device& device) {
  switch (mode) {
    case FusedMode::off:
      return false;
    case FusedMode::on:
      if (!fused_kernels_available(device))
        throw UserError("model.fused: on", "this build has no fused kernels for device " + device.str(),
                        "model.fused: off, or a build against a CUDA LibTorch");
      return true;
    case FusedMode::automatic:  // no device has measured a gain yet (docs/BENCHMARKS.md, "Fused block")
      return false;
  }
  return false;
}

bool fused_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

at::ScalarType consumer_dtype(const at::Tensor& t) {
  const AutocastState a = AutocastState::current();
  if (t.is_cuda() && a.cuda) return a.cuda_dtype;
  if (t.is_cpu() && a.cpu) return a.cpu_dtype;
  return t.scalar_type();
}

at::Tensor plain_ln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  const at::Tensor xn = at::layer_norm(x, {x.size(-1)}, {}, {}, eps);
  return xn * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

at::Tensor fused_ln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps,
                             at::ScalarType out_dtype) {
  if (!fused_inputs({x, shift, scale}) || x.dim() != 3 || shift.scalar_type() != scale.scalar_type() ||
      !fused_dtype(out_dtype))
    return plain_ln_modulate(x, shift, scale, eps);
  return LnModulate::apply(x, unit_columns(shift), unit_columns(scale), eps, static_cast<int64_t>(out_dtype));
}

at::Tensor plain_gate_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& branch) {
  return x + gate.unsqueeze(1) * branch;
}

at::Tensor fused_gate_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& branch) {
  // The loops round the product to the branch's type and add in x's: x fp32 or of the branch's type.
  const bool types = gate.scalar_type() == branch.scalar_type() &&
                     (x.scalar_type() == branch.scalar_type() || x.scalar_type() == at::kFloat);
  if (!fused_inputs({x, gate, branch}) || x.dim() != 3 || !types || x.sizes() != branch.sizes())
    return plain_gate_residual(x, gate, branch);
  return GateResidual::apply(x, unit_columns(gate), branch);
}

at::Tensor plain_linear_gelu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  return at::gelu(at::linear(x, w, bias), "tanh");
}

at::Tensor fused_bias_gelu(const at::Tensor& z, const at::Tensor& bias) {
  const bool types = bias.scalar_type() == z.scalar_type() || bias.scalar_type() == at::kFloat;
  if (!fused_inputs({z, bias}) || !types || bias.dim() != 1 || bias.size(0) != z.size(-1))
    return at::gelu(z + bias, "tanh");
  return BiasGelu::apply(z, bias.contiguous());
}

FusedRouting fused_route(const at::Tensor& logits, const fused::RouterShape& s, bool training) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) == s.logits(), "fused_route: logits (T, ", s.logits(),
              ") expected, got ", logits.sizes());
  TORCH_CHECK(
      s.logits() <= fused::kMaxRouterLogits && s.topk <= fused::kMaxRouterTopK && s.topk > 0 && fused_inputs({logits}),
      "fused_route: a layout or tensor the fused router does not take");
  const auto out = Route::apply(logits, std::vector<int64_t>{s.experts, s.shared, s.topk, s.scale_by_k ? 1 : 0});
  FusedRouting r{out[0], out[1], {}, {}};
  if (training) r.picks = out[2], r.aux_loss = out[3];
  return r;
}

at::Tensor plain_gate_heads(const at::Tensor& o, const at::Tensor& gates) {
  const int64_t B = o.size(0), h = o.size(1), N = o.size(2), d = o.size(3);
  return (o.transpose(1, 2) * gates.view({B, N, h, 1})).reshape({B, N, h * d});  // einsum("bne,bned->bned")
}

at::Tensor fused_gate_heads(const at::Tensor& o, const at::Tensor& gates, at::ScalarType out_dtype) {
  if (!fused_inputs({o, gates}) || gates.scalar_type() != at::kFloat || o.dim() != 4 || !fused_dtype(out_dtype))
    return plain_gate_heads(o, gates);
  return GateHeads::apply(o, gates.contiguous(), static_cast<int64_t>(out_dtype));
}

}  // namespace moh::nn

"""torch.ops.moh: loads the compiled ops (_moh_ops.so, python/csrc/) and registers, for each differentiable op, its fake
implementation (shapes and types only, for torch.compile and torch.export) and its autograd formula (the op's own
backward op). The arithmetic is the toolkit's C++; nothing here computes but moh_attention, which composes two ops.
"""
import os

import torch

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_moh_ops.so")
_REBUILD = "rebuild it: `pip install ./python --no-build-isolation` from the toolkit's checkout, in this environment"
if not os.path.isfile(_LIBRARY):
    raise ImportError(f"moh_torch: {_LIBRARY} is missing ({_REBUILD})")


def _check_torch():
    """The ops call ATen outside its stable ABI: they load only into the torch they were built against."""
    try:
        from . import _build_info
    except ImportError:
        return  # a tree-local copy without the record (tests of the build itself)
    if _build_info.TORCH_VERSION != torch.__version__:
        raise ImportError(f"moh_torch: its ops were built for torch {_build_info.TORCH_VERSION} (CUDA "
                          f"{_build_info.CUDA}), this is torch {torch.__version__}: {_REBUILD}")


_check_torch()
try:
    torch.ops.load_library(_LIBRARY)
except OSError as e:
    raise ImportError(f"moh_torch: {os.path.basename(_LIBRARY)} does not load into torch {torch.__version__} "
                      f"({str(e).splitlines()[0][:200]}): {_REBUILD}") from None
ops = torch.ops.moh

_F32 = torch.float32
_FUSED_TYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(ok, kind, message):
    if not ok:
        raise kind(message)


def _shape(t):
    return list(t.shape)


def _dense(t):
    """A new contiguous tensor like t: every output of the C++ kernels is contiguous, whatever its inputs' strides."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


# ---- fake implementations: the C++ kernels' output shapes and types, with their main argument checks -------------

@torch.library.register_fake("moh::ln_modulate")
def _ln_modulate_fake(x, shift, scale, eps):
    _check(x.dim() == 3, ValueError, f"moh::ln_modulate: x must be (B, N, D), got {_shape(x)}")
    for name, t in (("shift", shift), ("scale", scale)):
        _check(_shape(t) == [x.shape[0], x.shape[2]], ValueError,
               f"moh::ln_modulate: {name} must be (B, D) = {[x.shape[0], x.shape[2]]}, got {_shape(t)}")
    rows = x.shape[0] * x.shape[1]
    return _dense(x), x.new_empty(rows, dtype=_F32), x.new_empty(rows, dtype=_F32)


@torch.library.register_fake("moh::ln_modulate_backward")
def _ln_modulate_backward_fake(grad, x, shift, scale, mean, rstd):
    return _dense(x), _dense(shift), _dense(scale)


@torch.library.register_fake("moh::gate_residual")
def _gate_residual_fake(x, gate, branch):
    _check(x.dim() == 3 and _shape(branch) == _shape(x), ValueError,
           f"moh::gate_residual: x and branch must be (B, N, D), got {_shape(x)} and {_shape(branch)}")
    return _dense(x)


@torch.library.register_fake("moh::gate_residual_backward")
def _gate_residual_backward_fake(grad, gate, branch):
    return _dense(gate), _dense(branch)


@torch.library.register_fake("moh::bias_gelu")
def _bias_gelu_fake(z, bias):
    _check(bias.dim() == 1 and bias.shape[0] == z.shape[-1], ValueError,
           f"moh::bias_gelu: bias must be (F) with F = z's last dim {z.shape[-1]}, got {_shape(bias)}")
    return _dense(z)


@torch.library.register_fake("moh::bias_gelu_backward")
def _bias_gelu_backward_fake(grad, z, bias):
    return _dense(z), _dense(bias)


def _router_logits(heads, shared):
    return (heads - shared) + (shared if shared > 1 else 0) + (2 if shared > 0 else 0)


@torch.library.register_fake("moh::route")
def _route_fake(logits, heads, shared, topk, scale_by_k=True):
    _check(0 <= shared < heads and 1 <= topk <= heads - shared, ValueError,
           f"moh::route: need 0 <= shared < heads and 1 <= topk <= heads - shared, got heads={heads}, "
           f"shared={shared}, topk={topk}")
    width = _router_logits(heads, shared)
    _check(logits.dim() == 2 and logits.shape[1] == width, ValueError,
           f"moh::route: logits must be (T, {width}), got {_shape(logits)}")
    T = logits.shape[0]
    return (logits.new_empty((T, heads), dtype=_F32), logits.new_empty((T, topk), dtype=torch.int64),
            logits.new_empty(heads - shared, dtype=torch.int64), logits.new_empty((), dtype=_F32))


@torch.library.register_fake("moh::route_backward")
def _route_backward_fake(logits, routed, picks, grad_gates, grad_aux, heads, shared, topk, scale_by_k):
    return _dense(logits)


@torch.library.register_fake("moh::gate_heads")
def _gate_heads_fake(o, gates):
    B, h, N, d = o.shape
    _check(_shape(gates) == [B * N, h], ValueError, f"moh::gate_heads: gates must be (B*N, h) = {[B * N, h]}, "
           f"got {_shape(gates)}")
    return o.new_empty((B, N, h * d))


@torch.library.register_fake("moh::gate_heads_backward")
def _gate_heads_backward_fake(grad, o, gates):
    return _dense(o), _dense(gates)


def _lse_type(q):
    return torch.float64 if q.dtype == torch.float64 else _F32


@torch.library.register_fake("moh::attention")
def _attention_fake(q, k, v, gates, routed, bias, shared, scale, path):
    _check(q.dim() == 4, ValueError, f"moh::attention: q must be (B, h, N, d), got {_shape(q)}")
    B, h, N, d = q.shape
    _check(k.dim() == 4 and k.shape[1] in (1, h) and _shape(v) == _shape(k), ValueError,
           f"moh::attention: k and v must be (B, h or 1, N, d), got {_shape(k)} and {_shape(v)}")
    if gates is not None:
        _check(_shape(gates) == [B * N, h], ValueError,
               f"moh::attention: gates must be (B*N, h) = {[B * N, h]}, got {_shape(gates)}")
    return (q.new_empty((B, N, h * d)), q.new_empty((B, h, N, d)), q.new_empty((B, h, N), dtype=_lse_type(q)))


@torch.library.register_fake("moh::attention_backward")
def _attention_backward_fake(grad, q, k, v, gates, routed, bias, o, lse, shared, scale, path):
    return (_dense(q), _dense(k), _dense(v), q.new_empty(0) if gates is None else _dense(gates),
            q.new_empty(0) if bias is None else _dense(bias))


@torch.library.register_fake("moh::gaussian_stats")
def _gaussian_stats_fake(features):
    _check(features.dim() == 2, ValueError, f"moh::gaussian_stats: features must be (N, D), got {_shape(features)}")
    D = features.shape[1]
    return (features.new_empty(D, dtype=torch.float64, device="cpu"),
            features.new_empty((D, D), dtype=torch.float64, device="cpu"))


def _host_number_fake(name):
    """The float-valued metric ops have no fake value: torch.compile runs them eagerly (a graph break), as it does
    Tensor.item()."""
    from torch._subclasses.fake_tensor import DataDependentOutputException
    op = getattr(ops, name).default

    def fake(*args):
        raise DataDependentOutputException(op)
    return fake


for _name in ("frechet_distance", "inception_score", "precision_recall", "kid", "fid_report_images"):
    torch.library.register_fake(f"moh::{_name}")(_host_number_fake(_name))


# ---- autograd: each forward op's backward is its backward op -------------------------------------------------------

def _once_differentiable(name, backward):
    """The backward ops have no derivative of their own: where a graph of the backward is asked for (create_graph, a
    gradient penalty, gradgradcheck), the gradients come back marked so that differentiating them again raises a
    RuntimeError naming the op, instead of PyTorch's silent wrong second derivative."""
    message = (f"moh::{name}: double backward is not supported (its backward op has no derivative); take second "
               "derivatives through the plain PyTorch composition (moh_torch's tests name it for each op)").encode()

    def wrapper(ctx, *grads):
        with torch.no_grad():
            result = backward(ctx, *grads)
        if not torch.is_grad_enabled():
            return result
        sources = [t for t in list(grads) + list(ctx.saved_tensors) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not sources:
            return result
        single = not isinstance(result, tuple)
        outputs = (result,) if single else result
        live = [i for i, t in enumerate(outputs) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        # One node whose backward raises, between the gradients and everything they were computed from: reached by
        # any second derivative, whichever inputs it is taken with.
        links = [outputs[i].detach().requires_grad_() for i in live] + sources
        raised = torch._C._functions.DelayedError(message, len(links))(*links)
        raised = (raised,) if isinstance(raised, torch.Tensor) else raised
        outputs = list(outputs)
        for i, t in zip(live, raised):
            outputs[i] = t
        return outputs[0] if single else tuple(outputs)

    return wrapper


def _ln_modulate_setup(ctx, inputs, output):
    x, shift, scale, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, shift, scale, mean, rstd)
    ctx.mark_non_differentiable(mean, rstd)


def _ln_modulate_backward(ctx, grad, _grad_mean, _grad_rstd):
    dx, dshift, dscale = ops.ln_modulate_backward(grad, *ctx.saved_tensors)
    return dx, dshift, dscale, None


def _gate_residual_setup(ctx, inputs, output):
    _, gate, branch = inputs
    ctx.save_for_backward(gate, branch)


def _gate_residual_backward(ctx, grad):
    dgate, dbranch = ops.gate_residual_backward(grad, *ctx.saved_tensors)
    return grad, dgate, dbranch


def _bias_gelu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _bias_gelu_backward(ctx, grad):
    return ops.bias_gelu_backward(grad, *ctx.saved_tensors)


def _route_setup(ctx, inputs, output):
    logits, heads, shared, topk, scale_by_k = inputs
    _, routed, picks, _ = output
    ctx.save_for_backward(logits, routed, picks)
    ctx.layout = (heads, shared, topk, scale_by_k)
    ctx.mark_non_differentiable(routed, picks)


def _route_backward(ctx, grad_gates, _grad_routed, _grad_picks, grad_aux):
    logits, routed, picks = ctx.saved_tensors
    dlogits = ops.route_backward(logits, routed, picks, grad_gates, grad_aux, *ctx.layout)
    return dlogits, None, None, None, None


def _gate_heads_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _gate_heads_backward(ctx, grad):
    return ops.gate_heads_backward(grad, *ctx.saved_tensors)


def _attention_setup(ctx, inputs, output):
    q, k, v, gates, routed, bias, shared, scale, path = inputs
    _, o, lse = output
    ctx.save_for_backward(q, k, v, gates, routed, bias, o, lse)
    ctx.args = (shared, scale, path)
    ctx.mark_non_differentiable(o, lse)


def _attention_backward(ctx, grad, _grad_o, _grad_lse):
    q, k, v, gates, routed, bias, o, lse = ctx.saved_tensors
    dq, dk, dv, dgates, dbias = ops.attention_backward(grad, q, k, v, gates, routed, bias, o, lse, *ctx.args)
    return (dq, dk, dv, None if gates is None else dgates, None, None if bias is None else dbias, None, None, None)


for _name, _backward, _setup in (
        ("ln_modulate", _ln_modulate_backward, _ln_modulate_setup),
        ("gate_residual", _gate_residual_backward, _gate_residual_setup),
        ("bias_gelu", _bias_gelu_backward, _bias_gelu_setup),
        ("route", _route_backward, _route_setup),
        ("gate_heads", _gate_heads_backward, _gate_heads_setup),
        ("attention", _attention_backward, _attention_setup)):
    torch.library.register_autograd(f"moh::{_name}", _once_differentiable(_name, _backward), setup_context=_setup)


# ---- moh_attention: the router op on the logits, then the attention op (a composite: their autograd and fakes) ------

_LIB = torch.library.Library("moh", "FRAGMENT")
_LIB.define("moh_attention(Tensor q, Tensor k, Tensor v, Tensor? logits, int shared, int topk, float scale, str path, "
            "Tensor? bias=None, bool scale_by_k=True) -> (Tensor out, Tensor aux_loss, Tensor picks, Tensor routed)")


def _moh_attention(q, k, v, logits, shared, topk, scale, path, bias=None, scale_by_k=True):
    B, h, N, _ = q.shape
    _check(0 <= shared <= h and 0 <= topk <= h - shared, ValueError,
           f"moh::moh_attention: need 0 <= shared <= h = {h} and topk in [0, h - shared] = [0, {h - shared}], "
           f"got shared={shared}, topk={topk}")
    gates = routed = None
    aux = q.new_zeros((), dtype=_F32)
    picks = q.new_zeros(h - shared, dtype=torch.int64)
    if logits is not None and topk > 0:
        gates, routed, picks, aux = ops.route(logits, h, shared, topk, scale_by_k)
    elif logits is not None:  # the official K = 0 layer: every head on, weighted by softmax(wg_1 x) · h
        _check(_shape(logits) == [B * N, h], ValueError,
               f"moh::moh_attention: logits must be (B*N, h) = {[B * N, h]} for topk 0, got {_shape(logits)}")
        gates = torch.softmax(logits.float(), dim=-1) * h
    out = ops.attention(q, k, v, gates, routed, bias, shared, scale, path)[0]
    if routed is None:
        routed = q.new_empty((B * N, 0), dtype=torch.int64)
    return out, aux, picks, routed


_LIB.impl("moh_attention", _moh_attention, "CompositeImplicitAutograd")

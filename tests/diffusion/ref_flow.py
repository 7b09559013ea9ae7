#!/usr/bin/env python3
"""Reference for flow matching and its samplers (tests/pyref_test.sh flow; read by the FlowReference gtest).

The formulas are written here from the SiT paper (Ma et al. 2024, "SiT: Exploring Flow and Diffusion-based Generative
Models with Scalable Interpolant Transformers", Sec. 2): x_t = alpha_t x* + sigma_t eps with t from 0 (noise) to
1 (data); linear alpha = t, sigma = 1 - t; GVP alpha = sin(pi t / 2), sigma = cos(pi t / 2); the velocity
v = alpha' x* + sigma' eps; the probability-flow velocity from the score s: v = (alpha'/alpha) x + ((alpha'/alpha)
sigma^2 - sigma sigma') s, the noise from the score eps = -sigma s, and the SDE dx = [v + w_t s] dt + sqrt(2 w_t) dW
with w_t = sigma_t, SiT's default diffusion form. LightningDiT's cosine term: 1 - cos over channels.
The Euler and Heun chains are cross-checked here against diffusers' FlowMatchEulerDiscreteScheduler and
FlowMatchHeunDiscreteScheduler (sigma = 1 - t, model output -v) on the same grid, every completed step; dopri5 is
torchdiffeq.odeint(method="dopri5") itself, with its number of function evaluations.

    ref_flow.py OUT_DIR

Writes OUT_DIR/flow.safetensors (random inputs and every formula's output, the stand-in chains step by step, the
SDE's draws, dopri5's results and NFE, the tiny DiT's chains) and OUT_DIR/dit.safetensors (its weights).
"""
import math
import os
import sys

import torch
import torchdiffeq
from diffusers import FlowMatchEulerDiscreteScheduler, FlowMatchHeunDiscreteScheduler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "gen"))
import make_torch as ref  # noqa: E402

EPS = 1e-3  # SiT's train/sample eps for the noise and score predictions


def coefficients(path, t):
    """alpha, alpha', sigma, sigma' at t."""
    if path == "linear":
        return t, torch.ones_like(t), 1 - t, -torch.ones_like(t)
    h = math.pi / 2
    return torch.sin(h * t), h * torch.cos(h * t), torch.cos(h * t), -h * torch.sin(h * t)


def expand(t, x):
    return t.reshape(-1, *([1] * (x.dim() - 1)))


def score_of(path, pred, out, x, t):
    a, da, s, ds = coefficients(path, expand(t, x))
    if pred == "score":
        return out
    if pred == "noise":
        return -out / s
    # velocity: solve v = (a'/a) x + ((a'/a) s^2 - s s') score for the score, multiplied through by a/a' (finite at
    # t = 0, where a = 0)
    r = a / da
    return (r * out - x) / (s * s - r * s * ds)


def velocity_of(path, pred, out, x, t):
    if pred == "velocity":
        return out
    a, da, s, ds = coefficients(path, expand(t, x))
    return (da / a) * x + ((da / a) * s * s - s * ds) * score_of(path, pred, out, x, t)


def losses(path, pred, out, x1, x0, t, cosine):
    a, da, s, ds = coefficients(path, expand(t, x1))
    u = da * x1 + ds * x0
    # the score of x_t given eps is -eps / sigma; SiT weighs its error by sigma^2: (s_hat sigma + eps)^2
    err = {"velocity": (out - u) ** 2, "noise": (out - x0) ** 2, "score": (out * s + x0) ** 2}[pred]
    mse = err.flatten(1).mean(1)
    cos = (1 - torch.nn.functional.cosine_similarity(out, u, dim=1)).flatten(1).mean(1) if cosine else 0 * mse
    return mse, cos


def interval(pred, sde):
    t0 = 0.0 if pred == "velocity" else EPS
    if sde:
        return t0, 1 - 0.04
    return t0, 1.0 if pred == "velocity" else 1 - EPS


def grid(t0, t1, n):
    g = [t0 + (t1 - t0) * i / (n - 1) for i in range(n)]
    g[-1] = t1
    return g


def standin(x, t):
    """A smooth velocity field (not a flow of any data; the solvers only integrate it)."""
    return -x * (0.6 + 0.3 * math.cos(2 * t)) + 0.2 * torch.tanh(x) * math.sin(3 * t) + 0.1 * t


def euler(field, noise, g):
    x, states = noise, [noise]
    for i in range(len(g) - 1):
        x = x + (g[i + 1] - g[i]) * field(x, g[i])
        states.append(x)
    return torch.stack(states)


def heun(field, noise, g):
    x, states = noise, [noise]
    for i in range(len(g) - 1):
        dt = g[i + 1] - g[i]
        v = field(x, g[i])
        x_e = x + dt * v
        x = x_e if i + 2 == len(g) else x + dt * 0.5 * (v + field(x_e, g[i + 1]))
        states.append(x)
    return torch.stack(states)


def sde(path, pred, model, noise, n, draws):
    t0, t1 = interval(pred, True)
    g = grid(t0, t1, n)
    dt = g[1] - g[0]

    def drift(x, t):
        out, tt = model(x, t), torch.full((x.shape[0],), t, dtype=x.dtype)
        w = expand(coefficients(path, tt)[2], x)
        return velocity_of(path, pred, out, x, tt) + w * score_of(path, pred, out, x, tt), w

    x, states = noise, [noise]
    for i in range(n - 1):
        d, w = drift(x, g[i])
        x = x + d * dt + torch.sqrt(2 * w) * draws[i] * math.sqrt(dt)
        states.append(x)
    x = x + drift(x, t1)[0] * (1 - t1)
    states.append(x)
    return torch.stack(states)


def diffusers_euler(field, noise, g, s=None):
    """FlowMatchEulerDiscreteScheduler on the grid g; with LightningDiT's shift s it is shift=1/s on the plain grid
    (diffusers warps sigma = 1 - t itself)."""
    sched = FlowMatchEulerDiscreteScheduler(shift=1.0 / s) if s else FlowMatchEulerDiscreteScheduler()
    sched.set_timesteps(sigmas=[1 - t for t in g[:-1]])
    x, states = noise, [noise]
    for i, ts in enumerate(sched.timesteps):
        x = sched.step(-field(x, 1 - float(sched.sigmas[i])), ts, x).prev_sample
        states.append(x)
    return torch.stack(states)


def shifted(g, s):
    """LightningDiT's timestep shift of a grid (transport/integrators.py compute_tm)."""
    return [s * t / (1 + (s - 1) * t) for t in g]


def diffusers_heun(field, noise, g):
    """FlowMatchHeunDiscreteScheduler on our grid (its set_timesteps knows only its own; the layout is its own)."""
    sched = FlowMatchHeunDiscreteScheduler()
    sched.set_timesteps(len(g) - 1)
    s = torch.tensor([1 - t for t in g[:-1]], dtype=torch.float32)
    ts = s * sched.config.num_train_timesteps
    sched.timesteps = torch.cat([ts[:1], ts[1:].repeat_interleave(2)])
    s = torch.cat([s, torch.zeros(1)])
    sched.sigmas = torch.cat([s[:1], s[1:-1].repeat_interleave(2), s[-1:]])
    sched.set_begin_index(0)
    x, states = noise, [noise]
    for i, t in enumerate(sched.timesteps):
        x = sched.step(-field(x, 1 - float(sched.sigmas[i])), t, x).prev_sample
        if sched.state_in_first_order or i + 1 == len(sched.timesteps):  # a completed step
            states.append(x)
    return torch.stack(states)


def dopri5(field, noise, t0, t1, atol, rtol):
    nfe = [0]

    def f(t, x):
        nfe[0] += 1
        return field(x, float(t))

    x = torchdiffeq.odeint(f, noise, torch.tensor([t0, t1], dtype=torch.float64), method="dopri5", atol=[atol],
                           rtol=[rtol])[-1]
    return x, nfe[0]


def dit_prediction(model, labels, scale, hi, evals=None):
    """The guided prediction channels of a DiT at flow time t (noise level 1 - t), every channel guided; `evals`
    counts network evaluations per image (2 for a guided one)."""
    evals = [0] if evals is None else evals

    def predict(x, t):
        n, c = x.shape[0], x.shape[1]
        u = min(max(1 - t, 0.0), 1.0)  # dopri5's stages may pass t = 1: guided there as SiT guides everywhere
        if scale <= 1.0 or not (0.0 <= u <= hi):
            evals[0] += 1
            return model(x, torch.full((n,), float(t)), labels)[:, :c]
        evals[0] += 2
        out = model(torch.cat([x, x]), torch.full((2 * n,), float(t)), torch.cat([labels, torch.full((n,), 10)]))
        cond, uncond = out[:n, :c], out[n:, :c]
        return uncond + scale * (cond - uncond)
    return predict


def formulas(result):
    gen = torch.Generator().manual_seed(7)
    x1, x0, out = (torch.randn(4, 3, 4, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    t = 0.05 + 0.9 * torch.rand(4, generator=gen, dtype=torch.float64)
    result.update({"f_x1": x1, "f_x0": x0, "f_out": out, "f_t": t})
    for path in ("linear", "gvp"):
        for pred in ("velocity", "noise", "score"):
            tag = f"{path}_{pred}"
            mse, cos = losses(path, pred, out, x1, x0, t, pred == "velocity")
            result[f"f_{tag}_mse"], result[f"f_{tag}_cos"] = mse, cos
            result[f"f_{tag}_velocity"] = velocity_of(path, pred, out, x1, t)
            result[f"f_{tag}_score"] = score_of(path, pred, out, x1, t)


def chains(result):
    gen = torch.Generator().manual_seed(5)
    noise = torch.randn(2, 1, 6, 6, generator=gen)
    result["noise"] = noise
    for n in (10, 20):
        g = grid(0.0, 1.0, n + 1)
        for name, ours, theirs in (("euler", euler, diffusers_euler), ("heun", heun, diffusers_heun)):
            mine, real = ours(standin, noise, g), theirs(standin, noise, g)
            worst = ((mine - real).abs().max() / real.abs().max()).item()
            assert worst < 2e-6, f"{name} {n}: the written-out chain differs from diffusers' by {worst}"
            result[f"{name}_standin_{n}"] = real
    # LightningDiT's timestep shift 0.3: our warp of t against diffusers' shift 1/0.3 of sigma, on Euler; Heun walks
    # the same warped grid (diffusers' Heun cannot be handed one, above).
    g = grid(0.0, 1.0, 11)
    mine, real = euler(standin, noise, shifted(g, 0.3)), diffusers_euler(standin, noise, g, 0.3)
    worst = ((mine - real).abs().max() / real.abs().max()).item()
    assert worst < 2e-6, f"shifted euler: the written-out chain differs from diffusers' by {worst}"
    assert (real - result["euler_standin_10"]).abs().max() > 1e-3, "the shift changed nothing"
    result["euler_standin_10_shift"], result["heun_standin_10_shift"] = real, heun(standin, noise, shifted(g, 0.3))
    for atol, rtol, tag in ((1e-6, 1e-3, "sit"), (1e-8, 1e-7, "tight")):
        x, nfe = dopri5(standin, noise, 0.0, 1.0, atol, rtol)
        result[f"dopri5_standin_{tag}"], result[f"dopri5_standin_{tag}_nfe"] = x, torch.tensor(nfe)
    # The SDE in fp64: its formulas are checked to rounding, apart from fp32 noise amplified by 1 / (1 - t).
    draws = torch.randn(11, 2, 1, 6, 6, generator=gen, dtype=torch.float64)
    result["sde_draws"], result["sde_noise"] = draws, noise.double()
    for path, pred in (("linear", "velocity"), ("gvp", "score"), ("linear", "noise")):
        # A prediction of the asked kind whose probability-flow velocity is the stand-in's.
        model = prediction_from_standin(path, pred)
        result[f"sde_{path}_{pred}"] = sde(path, pred, model, noise.double(), 12, draws)


def prediction_from_standin(path, pred):
    """out(x, t) of kind `pred` whose velocity is standin(x, t): invert velocity_of through the score."""
    def model(x, t):
        v = standin(x, t)
        if pred == "velocity":
            return v
        tt = torch.full((x.shape[0],), t, dtype=x.dtype)
        score = score_of(path, "velocity", v, x, tt)
        return score if pred == "score" else -coefficients(path, expand(tt, x))[2] * score
    return model


class Fp64(torch.nn.Module):
    """Runs a module on its input cast to fp64 (the reference DiT's timestep features are fp32, as in DiT)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x.double())


def dit_chains(out, result):
    """A random DiT-Pixel/4 with CFG in fp64: in fp32, two implementations' ~1e-7 differences reach dopri5's error
    estimate where it is at fp32's rounding floor (a nearly linear first step) and the step sequences part."""
    gen = torch.Generator().manual_seed(9)
    noise = torch.randn(2, 1, 28, 28, generator=gen, dtype=torch.float64)
    labels = torch.tensor([3, 7])
    model = ref.randomize(ref.DiT(28, 4, 1, 128, 6, 10, [8] * 6, 16), seed=31).eval()
    ref.save_safetensors(os.path.join(out, "dit.safetensors"), model.state_dict())
    model = model.double()
    model.t_embedder.mlp = Fp64(model.t_embedder.mlp)
    result.update({"dit_noise": noise, "dit_labels": labels})
    for scale, hi, tag in ((1.0, 1.0, "cfg1"), (4.0, 1.0, "cfg4"), (4.0, 0.5, "cfg4_interval")):
        g = grid(0.0, 1.0, 9)
        result[f"euler_dit_{tag}"] = euler(dit_prediction(model, labels, scale, hi), noise, g)[-1]
        result[f"heun_dit_{tag}"] = heun(dit_prediction(model, labels, scale, hi), noise, g)[-1]
        evals = [0]
        field = dit_prediction(model, labels, scale, hi, evals)
        result[f"dopri5_dit_{tag}"] = dopri5(field, noise, 0.0, 1.0, 1e-6, 1e-3)[0]  # SiT's tolerances
        result[f"dopri5_dit_{tag}_nfe"] = torch.tensor(evals[0])
    assert (result["euler_dit_cfg4"] - result["euler_dit_cfg4_interval"]).abs().max() > 1e-3


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(2)
    result = {}
    formulas(result)
    chains(result)
    with torch.no_grad():
        dit_chains(out, result)
    ref.save_safetensors(os.path.join(out, "flow.safetensors"), {k: v.clone() for k, v in result.items()})


if __name__ == "__main__":
    main(sys.argv[1])

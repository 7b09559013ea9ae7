#!/usr/bin/env python3
"""Reference chains of the ODE samplers (tests/pyref_test.sh solvers; read by the SolverReference gtests):
diffusers' DPMSolverMultistepScheduler and EulerDiscreteScheduler (the venv's PyPI diffusers, default options:
"linspace" spacing, final sigma 0, DPM-Solver++ 2M midpoint) configured for DiT's linear schedule with 1000 steps,
and Karras et al. 2022 Algorithm 1 (deterministic Heun) written out in plain PyTorch on the Euler grid.

    ref_solvers.py OUT_DIR

Two models drive the chains: a closed-form stand-in eps(x, t) = x + 0.3 tanh(x) cos(t / 300) + 0.05 sin(t / 97)
(near the exact eps of data at 0, so that x_0 stays of order 1; the gtest computes the same) and a tiny random DiT-Pixel/4 (tests/fixtures/gen/make_torch.py, official key names) with
classifier-free guidance on the doubled batch, also with a guidance interval. Writes OUT_DIR/solvers.safetensors:
noise (2, 1, 28, 28), labels, every stand-in chain as (N + 1, 2, 1, 28, 28) states (step by step) and every DiT
chain's final sample, and OUT_DIR/dit.safetensors (the DiT's weights).
"""
import os
import sys

import torch
from diffusers import DPMSolverMultistepScheduler, EulerDiscreteScheduler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "gen"))
import make_torch as ref  # noqa: E402

SCHEDULE = dict(num_train_timesteps=1000, beta_start=1e-4, beta_end=0.02, beta_schedule="linear",
                prediction_type="epsilon")


def standin(x, t):
    return x + 0.3 * torch.tanh(x) * torch.cos(torch.tensor(t / 300.0)) + 0.05 * torch.sin(torch.tensor(t / 97.0))


def dit_eps(model, labels, scale, interval):
    """DiT's forward_with_cfg on [x; x] with [labels; null], guided on every eps channel, inside the interval only."""
    def eps(x, t):
        n, c = x.shape[0], x.shape[1]
        u = float(t) / 999.0
        if scale <= 1.0 or not (interval[0] <= u <= interval[1]):
            return model(x, torch.full((n,), float(t)), labels)[:, :c]
        out = model(torch.cat([x, x]), torch.full((2 * n,), float(t)), torch.cat([labels, torch.full((n,), 10)]))
        cond, uncond = out[:n, :c], out[n:, :c]
        return uncond + scale * (cond - uncond)
    return eps


def run_diffusers(kind, eps, noise, steps):
    sched = (DPMSolverMultistepScheduler if kind == "dpm++2m" else EulerDiscreteScheduler)(**SCHEDULE)
    sched.set_timesteps(steps)
    x = noise * sched.init_noise_sigma
    states = [x]
    for t in sched.timesteps:
        e = eps(sched.scale_model_input(x, t), float(t))
        x = sched.step(e, t, x).prev_sample
        states.append(x)
    return torch.stack(states)


def run_heun(eps, noise, steps):
    """Karras et al. 2022, Algorithm 1 (deterministic 2nd-order), D(x; sigma) = x - sigma eps(x / sqrt(sigma^2 + 1), t)."""
    grid = EulerDiscreteScheduler(**SCHEDULE)
    grid.set_timesteps(steps)
    sig, ts = grid.sigmas.double().tolist(), grid.timesteps.double().tolist() + [0.0]

    def slope(x, i):
        denoised = x - sig[i] * eps(x / (sig[i] ** 2 + 1) ** 0.5, ts[i])
        return (x - denoised) / sig[i]

    x = noise * sig[0]
    states = [x]
    for i in range(steps):
        d = slope(x, i)
        x_next = x + (sig[i + 1] - sig[i]) * d
        if sig[i + 1] != 0:
            x_next = x + (sig[i + 1] - sig[i]) * 0.5 * (d + slope(x_next, i + 1))
        x = x_next
        states.append(x)
    return torch.stack(states)


def run(kind, eps, noise, steps):
    return run_heun(eps, noise, steps) if kind == "heun" else run_diffusers(kind, eps, noise, steps)


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(5)
    noise = torch.randn(2, 1, 28, 28, generator=gen)
    labels = torch.tensor([3, 7])
    model = ref.randomize(ref.DiT(28, 4, 1, 128, 6, 10, [8] * 6, 16), seed=31).eval()
    ref.save_safetensors(os.path.join(out, "dit.safetensors"), model.state_dict())
    result = {"noise": noise, "labels": labels}
    with torch.no_grad():
        for kind in ("dpm++2m", "euler", "heun"):
            for steps in (10, 20):
                result[f"{kind}_standin_{steps}"] = run(kind, standin, noise, steps)
            for scale, interval, tag in ((1.0, (0.0, 1.0), "cfg1"), (4.0, (0.0, 1.0), "cfg4"),
                                         (4.0, (0.0, 0.5), "cfg4_interval")):
                chain = run(kind, dit_eps(model, labels, scale, interval), noise, 8)
                result[f"{kind}_dit_{tag}"] = chain[-1]
    # The chains must differ from one another, or the comparison could not tell solvers apart.
    assert (result["dpm++2m_standin_10"][-1] - result["euler_standin_10"][-1]).abs().max() > 1e-3
    assert (result["euler_dit_cfg4"] - result["euler_dit_cfg4_interval"]).abs().max() > 1e-3
    ref.save_safetensors(os.path.join(out, "solvers.safetensors"), {k: v.contiguous() for k, v in result.items()})


if __name__ == "__main__":
    main(sys.argv[1])

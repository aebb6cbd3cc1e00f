"""Flow-matching samplers as small pure functions, in the style of k-diffusion, and FramePack's sigma schedule.

A sampler is a generator over a model `model(x, sigma) -> x0` (the clean-latent estimate at noise level `sigma`, a
Python float) and a float32 schedule `sigmas` that runs from 1 down to 0. It yields `(i, x0)` after each of the
`len(sigmas) - 1` steps (0-based `i`; `x0` is what a per-step preview shows) and returns the result
(`result = yield from sampler(model, x, sigmas)`). The latents follow x = (1 − σ)·x0 + σ·noise.

- `sample_unipc`: FramePack's flow-matching UniPC (lllyasviel/FramePack, `diffusers_helper/k_diffusion/
  uni_pc_fm.py`), written here from its equations: one model call per step, no call at sigma 0 (the result is the
  last x0); a multistep predictor-corrector in λ = −log σ, whose first-order update is
  x_t = (σ_t/σ_s)·x_s − (e^{−h} − 1)·x0_s with h = λ_t − λ_s; solver order min(3, steps − 1), lower orders while
  the history is short; B(h) = −h (bh1, FramePack's default) or e^{−h} − 1 (bh2); the order-2 predictor takes ½.
  tests/test_samplers.py checks it against the original's outputs (tests/data/framepack_unipc_bh1.safetensors).
- `sample_euler`: the flow-matching Euler step of diffusers' `FlowMatchEulerDiscreteScheduler` (their reference
  FramePack pipeline's sampler), x_next = x + (σ_next − σ)·(x − x0)/σ.

diffusers' `UniPCMultistepScheduler` with flow sigmas is a different method (order 2, λ = log((1 − σ)/σ), α = 1 − σ
in the update), so it is not used: its result differs from FramePack's by ~0.6 % at 25 steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Generator

import numpy as np
import torch

Model = Callable[[torch.Tensor, float], torch.Tensor]
Sampler = Generator[tuple[int, torch.Tensor], None, torch.Tensor]

# mu from the window's token count: linear between these points, capped at ln 7 (FramePack's `calculate_flux_mu`
# with exp_max=7; diffusers' scheduler config names them base/max_image_seq_len and base/max_shift).
SHIFT_POINTS = ((256, 0.5), (4096, 1.15))
MAX_SHIFT = 7.0


def shift_mu(latent_frames: int, height: int, width: int, patch: int = 2) -> float:
    """FramePack's mu for a window of (latent_frames, height, width) latents: linear in its token count, ≤ ln 7."""
    seq = latent_frames * height * width / patch ** 2
    (x1, y1), (x2, y2) = SHIFT_POINTS
    slope = (y2 - y1) / (x2 - x1)
    return min(slope * seq + y1 - slope * x1, math.log(MAX_SHIFT))


def flow_sigmas(steps: int, mu: float) -> torch.Tensor:
    """`steps + 1` float32 sigmas from 1 to 0: linspace(1, 0) time-shifted by e^mu / (e^mu + 1/t − 1).

    This is FramePack's `get_flux_sigmas_from_mu` and what diffusers' flow-match schedulers compute with
    `use_dynamic_shifting` and exponential time shift (computed here in float64, then rounded once)."""
    if steps < 1:
        raise ValueError(f"steps: {steps} must be at least 1")
    t = np.linspace(1.0, 0.0, steps + 1)
    shift = math.exp(mu)
    with np.errstate(divide="ignore"):
        sigmas = shift / (shift + (1.0 / t - 1.0))       # t = 0 gives 1/0 = inf and sigma 0
    return torch.from_numpy(sigmas).to(torch.float32)


def sample_euler(model: Model, x: torch.Tensor, sigmas: torch.Tensor) -> Sampler:
    sig = [float(s) for s in sigmas]
    for i in range(len(sig) - 1):
        x0 = model(x, sig[i])
        yield i, x0
        x = x + (x - x0) * ((sig[i + 1] - sig[i]) / sig[i])
    return x


def sample_unipc(model: Model, x: torch.Tensor, sigmas: torch.Tensor, *, variant: str = "bh1") -> Sampler:
    if variant not in ("bh1", "bh2"):
        raise ValueError(f"variant: {variant!r} is not 'bh1' or 'bh2'")
    sig = [float(s) for s in sigmas]
    steps = len(sig) - 1
    max_order = min(3, steps - 1)
    x0 = model(x, sig[0])
    yield 0, x0
    history = [(-math.log(sig[0]), x0)]                  # (λ, x0) of the previous steps, newest last
    for i in range(1, steps):
        order = min(i, max_order)
        past = history[-order:]
        lam = -math.log(sig[i])
        c = unipc_coefficients([lam_k for lam_k, _ in past], lam, variant)
        m0 = past[-1][1]
        diffs = [(m_k - m0) / r_k for (_, m_k), r_k in zip(reversed(past[:-1]), c.r)]   # D1 of each older step
        ratio = sig[i] / sig[i - 1]
        x0 = model(unipc_predictor(x, ratio, m0, diffs, c), sig[i])
        yield i, x0
        if i + 1 < steps:                               # the corrected x is only needed for a next step
            x = unipc_corrector(x, ratio, m0, diffs, x0, c)
        history = (history + [(lam, x0)])[-max_order:]
    return x0


@dataclass(frozen=True)
class UniPCCoefficients:
    """The scalars of one UniPC step (float64): ratios r_k of the older steps' λ offsets to h, e^{−h} − 1, B(h),
    predictor weights rho_p (one per older step) and corrector weights rho_c (one per older step, then the new)."""
    r: list[float]
    phi1: float
    b_h: float
    rho_p: list[float]
    rho_c: list[float]


def unipc_coefficients(past_lambdas: list[float], lam: float, variant: str = "bh1") -> UniPCCoefficients:
    """Coefficients of a step from λ_s = past_lambdas[-1] to λ, with order = len(past_lambdas)."""
    order = len(past_lambdas)
    lam0 = past_lambdas[-1]
    h = lam - lam0
    hh = -h
    r = [(lam_k - lam0) / h for lam_k in reversed(past_lambdas[:-1])]   # newest older step first
    phi1 = math.expm1(hh)
    b_h = hh if variant == "bh1" else phi1
    # b_k = k!·φ_{k+1}(hh)/B(h) with the φ recurrences of UniPC; R[k] = r^k (the new step's r is 1).
    rks = np.array(r + [1.0])
    rows, b = [], []
    phi_k, factorial = phi1 / hh - 1.0, 1.0
    for k in range(1, order + 1):
        rows.append(rks ** (k - 1))
        b.append(phi_k * factorial / b_h)
        factorial *= k + 1
        phi_k = phi_k / hh - 1.0 / factorial
    big_r, b = np.stack(rows), np.array(b)
    if order == 1:
        rho_p, rho_c = [], [0.5]
    elif order == 2:
        rho_p, rho_c = [0.5], list(np.linalg.solve(big_r, b))
    else:
        rho_p, rho_c = list(np.linalg.solve(big_r[:-1, :-1], b[:-1])), list(np.linalg.solve(big_r, b))
    return UniPCCoefficients(r, phi1, b_h, [float(v) for v in rho_p], [float(v) for v in rho_c])


def unipc_predictor(x, ratio: float, m0, diffs: list, c: UniPCCoefficients):
    """x at the next sigma before the model is called there: the first-order update (ratio = σ_t/σ_s) plus the
    weighted differences D1 of the older x0 estimates."""
    out = x * ratio - m0 * c.phi1
    for d, rho in zip(diffs, c.rho_p):
        out = out - d * (c.b_h * rho)
    return out


def unipc_corrector(x, ratio: float, m0, diffs: list, m_t, c: UniPCCoefficients):
    """x at the next sigma once the model's estimate m_t there is known: the same update with the corrector's
    weights, including the new difference m_t − m0."""
    out = x * ratio - m0 * c.phi1 - (m_t - m0) * (c.b_h * c.rho_c[-1])
    for d, rho in zip(diffs, c.rho_c[:-1]):
        out = out - d * (c.b_h * rho)
    return out


SAMPLERS: dict[str, Callable[..., Sampler]] = {
    "unipc": sample_unipc,
    "unipc_bh2": lambda model, x, sigmas: sample_unipc(model, x, sigmas, variant="bh2"),
    "euler": sample_euler,
}

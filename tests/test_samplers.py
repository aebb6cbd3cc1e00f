"""The samplers against references nobody here wrote.

- `unipc` against the original FramePack sampler's outputs (tests/data/framepack_unipc_bh1.safetensors, made by
  running lllyasviel/FramePack's `sample_unipc` on an analytic model; README beside it): every per-step x0 and every
  result, for 1–50 steps and two sequence lengths, to 1e-5 in float32; and its schedule.
- `euler` and the schedule against diffusers' `FlowMatchEulerDiscreteScheduler`.
- Both UniPC variants (bh2 has no recorded reference) against the exact ODE step for polynomial x0 estimates.
- The model wrapper's FramePack rounding (bf16 timestep, x0 from the bf16 latents).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from configs.controls import SAMPLERS as CONFIG_SAMPLERS
from pipeline.samplers import SAMPLERS, flow_sigmas, sample_euler, sample_unipc, shift_mu, unipc_coefficients
from pipeline.sampling import x0_model

REFERENCE = Path(__file__).parent / "data" / "framepack_unipc_bh1.safetensors"


@pytest.fixture(scope="module")
def reference():
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(REFERENCE), "pt") as f:
        meta = json.loads(f.metadata()["meta"])
    return load_file(str(REFERENCE)), meta


class AnalyticModel:
    """The reference's model (an x0 predictor); counts its calls."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor):
        self.w, self.b, self.calls = w, b, 0

    def __call__(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        self.calls += 1
        s = torch.full((x.shape[0],), sigma, dtype=torch.float32)[:, None, None].to(x.dtype)
        return torch.tanh(x @ self.w + self.b) * (1 - s) + 0.3 * x * s


def run(sampler, *args, **kwargs):
    """All yielded (i, x0) and the result of a sampler generator."""
    gen, steps = sampler(*args, **kwargs), []
    while True:
        try:
            steps.append(next(gen))
        except StopIteration as done:
            return steps, done.value


def test_every_configured_sampler_exists():
    assert set(CONFIG_SAMPLERS) == set(SAMPLERS)
    assert CONFIG_SAMPLERS[0] == "unipc"


def test_reference_file_covers_what_the_issue_names(reference):
    tensors, meta = reference
    steps = sorted({int(k.split("_")[0]) for k in meta})
    lengths = sorted({int(k.split("_")[1]) for k in meta})
    assert steps == [1, 2, 3, 4, 8, 25, 50] and lengths == [144, 14400]
    assert all(f"final_{k}" in tensors and f"denoised_{k}" in tensors and f"sigmas_{k}" in tensors for k in meta)


@pytest.mark.parametrize("key", ["1_144", "1_14400", "2_144", "2_14400", "3_144", "3_14400", "4_144", "4_14400",
                                 "8_144", "8_14400", "25_144", "25_14400", "50_144", "50_14400"])
def test_unipc_reproduces_framepack(reference, key):
    tensors, meta = reference
    steps, seq = map(int, key.split("_"))
    # Our schedule for that many tokens (9 latent frames of 8×8 or 80×80, patch 2) is the original's.
    frames, side = 9, {144: 8, 14400: 80}[seq]
    mu = shift_mu(frames, side, side)
    assert mu == pytest.approx(meta[key]["mu"], abs=1e-12)
    sigmas = flow_sigmas(steps, mu)
    torch.testing.assert_close(sigmas, tensors[f"sigmas_{key}"], atol=2e-7, rtol=0)

    model = AnalyticModel(tensors["W"], tensors["b"])
    yielded, final = run(sample_unipc, model, tensors["noise"].clone(), sigmas)
    assert model.calls == meta[key]["model_calls"] == steps            # one call per step, none at sigma 0
    assert [i for i, _ in yielded] == list(range(steps))
    denoised = torch.stack([x0 for _, x0 in yielded])
    torch.testing.assert_close(denoised, tensors[f"denoised_{key}"], atol=1e-5, rtol=0)
    torch.testing.assert_close(final, tensors[f"final_{key}"], atol=1e-5, rtol=0)
    assert final.abs().mean() > 0.05                                      # a real signal, not zeros


def test_unipc_order_schedule_and_first_steps(reference):
    """Order min(3, steps − 1), lower while the history is short; the order-2 predictor weight is ½."""
    c1 = unipc_coefficients([0.1], 0.5)
    assert (c1.rho_p, c1.rho_c, c1.r) == ([], [0.5], [])
    c2 = unipc_coefficients([0.0, 0.2], 0.5)
    assert c2.rho_p == [0.5] and len(c2.rho_c) == 2 and c2.r == [pytest.approx(-0.2 / 0.3)]
    c3 = unipc_coefficients([0.0, 0.2, 0.3], 0.5)
    assert len(c3.rho_p) == 2 and len(c3.rho_c) == 3
    assert c1.b_h == pytest.approx(-0.4) and unipc_coefficients([0.1], 0.5, "bh2").b_h == pytest.approx(np.expm1(-0.4))
    with pytest.raises(ValueError, match="variant"):
        next(sample_unipc(lambda x, s: x, torch.zeros(1), torch.tensor([1.0, 0.0]), variant="bh3"))


def _exact_step(coefs: list[float], lam_s: float, lam_t: float, x_s: float) -> float:
    """The exact flow ODE step for an x0 that is a polynomial p(λ) (independent of x): in λ = −log σ the ODE is
    dx/dλ = p(λ) − x, solved by q + e^{−(λ−λ_s)}·(x_s − q(λ_s)) with q = p − p' + p'' − …"""
    p = np.polynomial.Polynomial(coefs)
    q, d, sign = np.polynomial.Polynomial([0.0]), p, 1.0
    for _ in range(len(coefs)):
        q, d, sign = q + sign * d, d.deriv(), -sign
    return q(lam_t) + np.exp(-(lam_t - lam_s)) * (x_s - q(lam_s))


@pytest.mark.parametrize("variant", ["bh1", "bh2"])
@pytest.mark.parametrize("order", [2, 3])
def test_unipc_steps_are_exact_for_polynomial_estimates(variant, order):
    """UniPC's order conditions, checked against calculus for both variants: with x0 a polynomial in λ, the
    corrector of order k is exact up to degree k, the order-3 predictor up to degree 2 (the order-2 predictor's fixed
    weight ½ is only exact for constants), and neither is exact one degree higher."""
    from pipeline.samplers import unipc_corrector, unipc_predictor

    lams, lam_t, x_s = [0.1, 0.35, 0.5][-order:], 0.8, 1.3
    c = unipc_coefficients(lams, lam_t, variant)
    ratio = np.exp(-(lam_t - lams[-1]))
    for degree in range(order + 2):
        p = np.polynomial.Polynomial([0.3, -0.7, 0.4, 0.25, -0.2][:degree + 1])
        m0 = p(lams[-1])
        diffs = [(p(lam) - m0) / r for lam, r in zip(reversed(lams[:-1]), c.r)]
        exact = _exact_step(list(p.coef), lams[-1], lam_t, x_s)
        corrected = unipc_corrector(x_s, ratio, m0, diffs, p(lam_t), c)
        predicted = unipc_predictor(x_s, ratio, m0, diffs, c)
        assert (abs(corrected - exact) < 1e-12) == (degree <= order), (degree, corrected - exact)
        predictor_degree = order - 1 if order == 3 else 0
        assert (abs(predicted - exact) < 1e-12) == (degree <= predictor_degree), (degree, predicted - exact)


def test_unipc_variants_differ_only_where_a_correction_is_used(reference):
    """With 1 or 2 steps no B(h)-weighted term reaches the result, so bh1 and bh2 agree; from 3 steps on they differ."""
    tensors, _ = reference
    model = AnalyticModel(tensors["W"], tensors["b"])
    mu = shift_mu(9, 8, 8)
    for steps, same in ((1, True), (2, True), (3, False), (8, False)):
        bh1 = run(sample_unipc, model, tensors["noise"].clone(), flow_sigmas(steps, mu))[1]
        bh2 = run(sample_unipc, model, tensors["noise"].clone(), flow_sigmas(steps, mu), variant="bh2")[1]
        assert ((bh1 - bh2).abs().max() == 0) == same, steps


@pytest.mark.parametrize("steps", [1, 3, 25])
def test_euler_and_schedule_match_diffusers(reference, steps):
    from diffusers import FlowMatchEulerDiscreteScheduler

    tensors, _ = reference
    mu = shift_mu(9, 80, 80)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, time_shift_type="exponential")
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, steps + 1)[:-1], mu=mu)
    torch.testing.assert_close(flow_sigmas(steps, mu), scheduler.sigmas.float(), atol=1e-7, rtol=0)

    model = AnalyticModel(tensors["W"], tensors["b"])
    x = tensors["noise"].clone()
    for i, t in enumerate(scheduler.timesteps):
        sigma = float(scheduler.sigmas[i])
        velocity = (x - model(x, sigma)) / sigma
        x = scheduler.step(velocity, t, x, return_dict=False)[0]
    ours = run(sample_euler, model, tensors["noise"].clone(), flow_sigmas(steps, mu))[1]
    torch.testing.assert_close(ours, x, atol=1e-5, rtol=0)


class VelocityField:
    """A denoiser stand-in with the denoiser's interface (dtype, (x, timestep, branch) -> velocity) that records
    what it was given."""

    def __init__(self, dtype: torch.dtype):
        self.dtype, self.seen = dtype, []

    def __call__(self, x, timestep, branch="cond"):
        self.seen.append((x, timestep, branch))
        return (torch.sin(x.to(self.dtype).float() * 3.0) + timestep.float()[:, None] / 1000.0).to(self.dtype)


def test_framepack_rounding_of_the_model_wrapper():
    x = torch.randn(1, 64) * 2.0
    sigma = 0.9871                                                          # 987.1 is not a bf16 number
    field = VelocityField(torch.bfloat16)
    x0 = x0_model(field, framepack_rounding=True)(x, sigma)
    (_, timestep, branch), = field.seen
    assert timestep.dtype == torch.bfloat16 and branch == "cond"
    assert float(timestep[0]) == float(torch.tensor(sigma * 1000.0).to(torch.bfloat16)) != pytest.approx(987.1)
    v = field(x, timestep).float()
    torch.testing.assert_close(x0, x.to(torch.bfloat16).float() - v * sigma, atol=0, rtol=0)
    assert (x0 - (x - v * sigma)).abs().max() > 1e-4                        # the rounding is really there

    plain = VelocityField(torch.bfloat16)
    x0_plain = x0_model(plain, framepack_rounding=False)(x, sigma)
    (_, t_plain, _), = plain.seen
    assert t_plain.dtype == torch.float32 and float(t_plain[0]) == pytest.approx(987.1, abs=1e-3)
    torch.testing.assert_close(x0_plain, x - plain(x, t_plain).float() * sigma, atol=0, rtol=0)


def test_model_wrapper_guidance_and_stop():
    from common.errors import JobStopped

    field = VelocityField(torch.float32)
    x = torch.randn(1, 16)
    x0 = x0_model(field, cfg=3.0)(x, 0.5)
    assert [b for _, _, b in field.seen] == ["cond", "uncond"]              # the same field for both branches
    torch.testing.assert_close(x0, x - field(x, field.seen[0][1]) * 0.5)

    def stop():
        raise JobStopped()

    with pytest.raises(JobStopped):
        x0_model(field, check_stop=stop)(x, 0.5)

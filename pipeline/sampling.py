"""The sampling loop of one section: FramePack's schedule, a sampler from pipeline/samplers.py, the denoiser as x0.

Sigmas: linspace(1, 0, steps + 1) time-shifted with mu from the window's token count, capped at ln 7 (effectively
shift 7 at the 640 buckets), as in FramePack and diffusers' FramePack pipeline (`samplers.flow_sigmas`).
Samplers (configs.generation.SAMPLERS):
- `unipc` (default): FramePack's flow-matching UniPC, bh1, with FramePack's model wrapper (timestep and x0 rounded
  as its `fm_wrapper` does, see `x0_model`): the sampler of the original app.
- `unipc_bh2`: the same with B(h) = e^{−h} − 1.
- `euler`: flow-match Euler as in diffusers' `HunyuanVideoFramepackPipeline` (float32 timestep, unrounded x0).
"""
from __future__ import annotations

from typing import Callable, Generator

import torch

from pipeline.samplers import SAMPLERS, Model, flow_sigmas, shift_mu

# Samplers that run with FramePack's model wrapper (its dtype rounding); the others with diffusers' conventions.
FRAMEPACK_SAMPLERS = ("unipc", "unipc_bh2")


def rescale_guidance(guided: torch.Tensor, positive: torch.Tensor, amount: float) -> torch.Tensor:
    """CFG rescale: pull the guided prediction's spread back towards the positive one's."""
    if amount <= 0:
        return guided
    dims = list(range(1, guided.ndim))
    factor = positive.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True).clamp_min(1e-12)
    return guided * (amount * factor + (1.0 - amount))


def x0_model(denoiser, *, cfg: float = 1.0, rescale: float = 0.0, framepack_rounding: bool = False,
             check_stop: Callable[[], None] | None = None) -> Model:
    """The denoiser (a velocity predictor) as the samplers' model of x0, with real CFG and CFG rescale.

    `framepack_rounding`: round as FramePack's k-model (`fm_wrapper`) does. The transformer gets the timestep
    σ·1000 in the model's dtype (bf16 for the real weights: steps of 4 near 1000), and x0 = x' − σ·v with x' the
    latents rounded to that dtype (the tensor the transformer saw). Without it (diffusers' pipeline) the timestep
    stays float32 and x0 = x − σ·v. With a float32 model (tiny preset, CPU) the two are the same.
    `check_stop` is called before every model call (it raises to stop the job).
    """
    dtype = denoiser.dtype

    def model(x: torch.Tensor, sigma: float) -> torch.Tensor:
        if check_stop is not None:
            check_stop()
        timestep = torch.full((x.shape[0],), sigma * 1000.0, dtype=torch.float32, device=x.device)
        if framepack_rounding:
            timestep = timestep.to(dtype)
        velocity = denoiser(x, timestep, "cond").float()
        if cfg > 1.0:
            negative = denoiser(x, timestep, "uncond").float()
            guided = negative + cfg * (velocity - negative)
            velocity = rescale_guidance(guided, velocity, rescale)
        seen = x.to(dtype).float() if framepack_rounding else x.float()
        return seen - velocity * sigma

    return model


StepResult = tuple[int, int, torch.Tensor]   # (step, 1-based; steps; the model's clean-latent estimate)


@torch.no_grad()
def sample_section(denoiser, noise: torch.Tensor, *, sampler: str, steps: int, cfg: float = 1.0,
                   rescale: float = 0.0, check_stop: Callable[[], None] | None = None
                   ) -> Generator[StepResult, None, torch.Tensor]:
    """Denoise one section's window from `noise` (float32, (1, C, T, H, W)).

    A generator: yields after every step (for previews and progress) and returns the float32 latents
    (`latents = yield from sample_section(...)`). `check_stop` raises to stop; it is called before every step.
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: {sampler!r} is not one of {', '.join(SAMPLERS)}")
    _, _, t, h, w = noise.shape
    sigmas = flow_sigmas(steps, shift_mu(t, h, w, denoiser.transformer.config.patch_size))
    model = x0_model(denoiser, cfg=cfg, rescale=rescale, framepack_rounding=sampler in FRAMEPACK_SAMPLERS,
                     check_stop=check_stop)
    run = SAMPLERS[sampler](model, noise.float(), sigmas)
    while True:
        try:
            i, estimate = next(run)
        except StopIteration as done:
            return done.value.float()
        yield i + 1, steps, estimate

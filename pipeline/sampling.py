"""The sampling loop of one section over a diffusers flow-matching scheduler.

Sigmas are linspace(1, 0, steps + 1)[:-1], time-shifted with mu from the window's token count, capped at ln 7
(so effectively shift 7 at the 640 buckets), exactly like FramePack and diffusers' FramePack pipeline.
Samplers: `unipc` (FramePack's flow-matching UniPC, bh1) and `euler` (diffusers' reference pipeline).
"""
from __future__ import annotations

import math
from typing import Callable, Generator

import numpy as np
import torch

SHIFT_CONFIG = dict(base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5, max_shift=1.15)
MAX_SHIFT = 7.0


def _flow_unipc_class():
    from diffusers import UniPCMultistepScheduler

    class FlowUniPC(UniPCMultistepScheduler):
        """diffusers' UniPC (flow sigmas, bh1) with its last step to sigma 0 made finite.

        With bh1, the predictor's B(h) = −h is infinite when the target sigma is 0, and multiplying it by the zero
        residual of a first-order step gives NaN. The limit of that step is the model's clean estimate m0
        (sigma_t/sigma_s · x − alpha_t·(e^{−h} − 1)·m0 with sigma_t = 0, alpha_t = 1), which is returned instead.
        """

        def multistep_uni_p_bh_update(self, model_output, *args, sample=None, order=None, **kwargs):
            if float(self.sigmas[self.step_index + 1]) == 0.0:
                return self.model_outputs[-1]
            return super().multistep_uni_p_bh_update(model_output, *args, sample=sample, order=order, **kwargs)

    return FlowUniPC


def make_scheduler(sampler: str):
    """A fresh scheduler (they keep per-run state)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    if sampler == "euler":
        return FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, time_shift_type="exponential",
                                               **SHIFT_CONFIG)
    if sampler == "unipc":
        return _flow_unipc_class()(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=1.0,
                                   use_dynamic_shifting=True, time_shift_type="exponential",
                                   solver_type="bh1", solver_order=2, lower_order_final=True,
                                   final_sigmas_type="zero", predict_x0=True)
    raise ValueError(f"sampler: {sampler!r} is not one of 'unipc', 'euler'")


def shift_mu(latent_frames: int, height: int, width: int, patch: int = 2) -> float:
    """FramePack's mu: linear in the window's token count, capped at ln 7."""
    seq = latent_frames * height * width / patch ** 2
    c = SHIFT_CONFIG
    slope = (c["max_shift"] - c["base_shift"]) / (c["max_image_seq_len"] - c["base_image_seq_len"])
    mu = seq * slope + c["base_shift"] - slope * c["base_image_seq_len"]
    return min(mu, math.log(MAX_SHIFT))


def rescale_guidance(guided: torch.Tensor, positive: torch.Tensor, amount: float) -> torch.Tensor:
    """CFG rescale: pull the guided prediction's spread back towards the positive one's."""
    if amount <= 0:
        return guided
    dims = list(range(1, guided.ndim))
    factor = positive.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True).clamp_min(1e-12)
    return guided * (amount * factor + (1.0 - amount))


StepResult = tuple[int, int, torch.Tensor]   # (step, 1-based; steps; the model's clean-latent estimate)


@torch.no_grad()
def sample_section(denoiser, noise: torch.Tensor, *, sampler: str, steps: int, cfg: float = 1.0,
                   rescale: float = 0.0, check_stop: Callable[[], None] | None = None
                   ) -> Generator[StepResult, None, torch.Tensor]:
    """Denoise one section's window from `noise` (float32, (1, C, T, H, W)).

    A generator: yields after every step (for previews and progress) and returns the float32 latents
    (`latents = yield from sample_section(...)`). `check_stop` raises to stop; it is called before every step.
    """
    scheduler = make_scheduler(sampler)
    _, _, t, h, w = noise.shape
    mu = shift_mu(t, h, w, denoiser.transformer.config.patch_size)
    sigmas = np.linspace(1.0, 0.0, steps + 1)[:-1]
    scheduler.set_timesteps(sigmas=sigmas, mu=mu, device=noise.device)
    latents = noise
    for i, timestep in enumerate(scheduler.timesteps):
        if check_stop is not None:
            check_stop()
        sigma = scheduler.sigmas[i].to(latents.device)
        # The transformer takes sigma·1000 (UniPC's own timesteps are rounded to integers).
        model_t = timestep if timestep.is_floating_point() else sigma * 1000.0
        velocity = denoiser(latents, model_t, "cond").float()
        if cfg > 1.0:
            negative = denoiser(latents, model_t, "uncond").float()
            guided = negative + cfg * (velocity - negative)
            velocity = rescale_guidance(guided, velocity, rescale)
        estimate = latents - sigma * velocity
        latents = scheduler.step(velocity, timestep, latents, return_dict=False)[0]
        yield i + 1, steps, estimate
    return latents.float()

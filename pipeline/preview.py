"""Latent preview: FramePack's fixed linear map from the 16 latent channels to RGB (no VAE needed)."""
from __future__ import annotations

import numpy as np
import torch

# One row per latent channel: its contribution to (R, G, B).
LATENT_RGB = (
    (-0.0395, -0.0331, 0.0445), (0.0696, 0.0795, 0.0518), (0.0135, -0.0945, -0.0282), (0.0108, -0.0250, -0.0765),
    (-0.0209, 0.0032, 0.0224), (-0.0804, -0.0254, -0.0639), (-0.0991, 0.0271, -0.0669), (-0.0646, -0.0422, -0.0400),
    (-0.0696, -0.0595, -0.0894), (-0.0799, -0.0208, -0.0375), (0.1166, 0.1627, 0.0962), (0.1165, 0.0432, 0.0407),
    (-0.2315, -0.1920, -0.1355), (-0.0270, 0.0401, -0.0821), (-0.0616, -0.0997, -0.0727), (0.0249, -0.0469, -0.1703),
)
LATENT_RGB_BIAS = (0.0259, -0.0192, -0.0761)


def latents_to_rgb(latents: torch.Tensor) -> torch.Tensor:
    """(B, 16, T, H, W) latents -> (B, 3, T, H, W) in [0, 1]."""
    weight = torch.tensor(LATENT_RGB, dtype=torch.float32, device=latents.device)       # (16, 3)
    bias = torch.tensor(LATENT_RGB_BIAS, dtype=torch.float32, device=latents.device)
    rgb = torch.einsum("bcthw,cr->brthw", latents.float(), weight) + bias.view(1, 3, 1, 1, 1)
    return rgb.clamp(0.0, 1.0)


def preview_image(latents: torch.Tensor) -> np.ndarray:
    """All frames of the first batch item side by side: H × (T·W) × 3 uint8."""
    rgb = latents_to_rgb(latents[:1])[0]                                   # (3, T, H, W)
    c, t, h, w = rgb.shape
    strip = rgb.permute(2, 1, 3, 0).reshape(h, t * w, c)                  # (H, T·W, 3)
    return (strip * 255.0 + 0.5).to(torch.uint8).cpu().numpy()

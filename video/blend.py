"""Joining clips along time: the linear cross-fade between sections (FramePack's soft_append_bcthw)."""
from __future__ import annotations

import torch


def soft_append(before: torch.Tensor, after: torch.Tensor, overlap: int) -> torch.Tensor:
    """Join two clips along time (dim 2) with a linear cross-fade over `overlap` frames."""
    if overlap <= 0:
        return torch.cat([before, after], dim=2)
    if before.shape[2] < overlap or after.shape[2] < overlap:
        raise ValueError(f"cannot cross-fade {overlap} frames between clips of {before.shape[2]} and "
                         f"{after.shape[2]} frames")
    w = torch.linspace(1, 0, overlap, dtype=before.dtype, device=before.device).view(1, 1, -1, 1, 1)
    blended = w * before[:, :, -overlap:] + (1 - w) * after[:, :, :overlap]
    return torch.cat([before[:, :, :-overlap], blended, after[:, :, overlap:]], dim=2)

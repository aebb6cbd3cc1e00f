"""Text-to-video: a job with no start image (the `start_from` control other than "image", configs/controls.py).

What it mirrors: FramePack-Studio (github.com/colinurbs/FramePack-Studio), its "Latent Image" choice used "as a
starting point if no image is provided" (modules/interface.py):
- "Noise" (modules/pipelines/worker.py, the T2V branch): the start latent is `torch.randn((1, 16, 1, h // 8,
  w // 8))` from the job's seeded generator, with no VAE encode; the image encoder (SigLIP) is given a black image,
  because, as its comment says, SigLIP does not understand noise and the model was not trained on zero embeddings.
- "Black", "White", "Green Screen" (modules/pipelines/original_pipeline.py `prepare_parameters`): a plain-colour
  image of the job's size (green screen = RGB 0, 177, 64) stands in for the start image: the VAE encodes it and
  SigLIP embeds it, as any start image.
Studio sizes it from its width/height controls' nearest bucket; here it is the resolution control's square bucket,
or the custom width × height.

Light: PIL only; torch is imported by the one function that makes a latent (called by the orchestrator)."""
from __future__ import annotations

from PIL import Image

COLOURS = {"black": (0, 0, 0), "white": (255, 255, 255), "green": (0, 177, 64)}


def is_text_to_video(start: str | None) -> bool:
    return start not in (None, "image")


def stand_in_image(start: str, height: int, width: int) -> Image.Image:
    """The image that stands for the missing start image: the plain colour (VAE encode and SigLIP), or for
    "noise" the black image that only SigLIP sees (Studio's worker.py)."""
    return Image.new("RGB", (width, height), COLOURS.get(start, (0, 0, 0)))


def noise_latent(generator, channels: int, latent_height: int, latent_width: int):
    """The start latent of a "noise" job, (1, C, 1, h, w) float32 on the CPU, drawn from the job's generator
    (seeded with the request's seed: the same request gives the same latent)."""
    import torch

    return torch.randn((1, channels, 1, latent_height, latent_width), generator=generator, dtype=torch.float32)

"""Optional speed settings for the VAE decode (configs.video.VaeDecodeSpeed), applied for one decode and undone.

They concern diffusers' decoder (the CPU's decode, or a GPU's with `streamed` off); a GPU's decode normally runs
the streamed decoder (memory/vae_stream.py), which does its own padding and GroupNorm and is chosen by the memory
manager's decode policy.

`cudnn_benchmark` and `channels_last` change which convolution kernels run, so the pixels may differ from the
default decode by rounding; tests/test_decode_speed.py bounds the difference and benchmarks/vae_decode.py measures
speed and difference on a GPU. `fast_pad` and `fast_group_norm` swap two of the decoder's operations for faster ones
(pipeline/vae_ops.py: the padding exact, the GroupNorm within a stated tolerance, on GPUs only). Nothing here changes the weights or their memory (memory/ owns them): channels-last is applied to each
convolution's input, which is enough for PyTorch to choose the channels-last (NDHWC) kernels.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import torch

from configs.video import VaeDecodeSpeed
from pipeline.vae_ops import fast_decoder

log = logging.getLogger(__name__)


def _channels_last_input(module, args):
    x = args[0]
    if x.dim() == 5:
        return (x.contiguous(memory_format=torch.channels_last_3d), *args[1:])
    return None


@contextlib.contextmanager
def decode_speed(vae, device: torch.device, settings: VaeDecodeSpeed) -> Iterator[None]:
    """Within the block, the VAE decodes with `settings`; everything is restored after."""
    handles = []
    benchmark = torch.backends.cudnn.benchmark
    nvidia = device.type == "cuda" and torch.version.hip is None
    try:
        if settings.cudnn_benchmark and nvidia:
            torch.backends.cudnn.benchmark = True
        if settings.channels_last:
            handles = [m.register_forward_pre_hook(_channels_last_input) for m in vae.decoder.modules()
                       if isinstance(m, torch.nn.Conv3d)]
        with fast_decoder(vae, fast_pad=settings.fast_pad,
                          fast_norm=settings.fast_group_norm and device.type == "cuda"):
            yield
    finally:
        for h in handles:
            h.remove()
        torch.backends.cudnn.benchmark = benchmark

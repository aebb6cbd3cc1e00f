"""The denoiser's step (pipeline/denoiser.py): it reads no value off the device (each read waits for the GPU to
finish what was queued, leaving it idle while the host catches up), and the prompt's padding is cut off by its mask
read once per section."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from tests.model_helpers import step_inputs


def test_a_step_reads_no_device_value_and_cuts_the_prompt_where_its_mask_ends(tiny_original):
    from pipeline.denoiser import FramepackDenoiser
    from pipeline.text import TextEmbeddings

    tr = tiny_original.transformer
    ctx, idx, shape, image, texts, noise = step_inputs(tr)
    text = texts["cond"]
    padded = TextEmbeddings(text.llama.clone(), text.mask.clone(), text.pooled)
    padded.mask[:, 200:] = 0
    padded.llama[:, 200:] = 50.0            # what padding holds must not reach the blocks
    cut = TextEmbeddings(text.llama[:, :200], text.mask[:, :200], text.pooled)
    outs = {}
    for name, prompt in (("padded", padded), ("cut", cut)):
        den = FramepackDenoiser(tr)
        den.begin_section(ctx, idx, shape, image, {"cond": prompt}, 10.0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            outs[name] = den(noise, torch.tensor([900.0]))
        den.end_section()
        reads = [e.name for e in prof.events() if e.name in ("aten::item", "aten::_local_scalar_dense")]
        assert reads == [], f"{name}: the step read {len(reads)} values off the device"
    torch.testing.assert_close(outs["padded"], outs["cut"], atol=1e-5, rtol=1e-5)
    assert outs["padded"].abs().max() > 0

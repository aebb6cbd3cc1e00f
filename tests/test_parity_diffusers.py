"""Our pipeline against a reference nobody here wrote: diffusers' HunyuanVideoFramepackPipeline.

Same tiny components, same seed, flow-match Euler, fp32 on the CPU: the final latents must agree to 1e-4, in the
original (inverted anti-drifting) mode and in F1 (diffusers' "vanilla"), for two window sizes and 1, 2 and 5
sections, and with an end frame.
"""
from __future__ import annotations

import pytest
import torch

from tests.conftest import make_image, run_job

SEED = 1234
STEPS = 3


def diffusers_euler_scheduler():
    """diffusers' flow-match Euler with FramePack's shift: mu linear in the token count between (256, 0.5) and
    (4096, 1.15), exponential time shift (the pipeline caps mu at ln 7 itself)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, time_shift_type="exponential",
                                           base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5,
                                           max_shift=1.15)


def reference_latents(components, image, prompt, *, mode, window, sections, end_image=None, seed=SEED):
    from diffusers import HunyuanVideoFramepackPipeline

    from pipeline.text import PROMPT_TEMPLATE
    from pipeline.tiny import build_tiny_llama

    c = components
    # diffusers takes hidden_states[-3] itself: the whole Llama (ours is trimmed, memory/llama_trim.py)
    pipe = HunyuanVideoFramepackPipeline(
        text_encoder=build_tiny_llama(c.preset), tokenizer=c.tokenizer, transformer=c.transformer, vae=c.vae,
        scheduler=diffusers_euler_scheduler(), text_encoder_2=c.text_encoder_2, tokenizer_2=c.tokenizer_2,
        image_encoder=c.image_encoder, feature_extractor=c.feature_extractor)
    pipe.set_progress_bar_config(disable=True)
    frames_per_section = (window - 1) * 4 + 1
    out = pipe(image=image, last_image=end_image, prompt=prompt, height=image.height, width=image.width,
               num_frames=sections * frames_per_section, latent_window_size=window, num_inference_steps=STEPS,
               guidance_scale=10.0, generator=torch.Generator().manual_seed(seed), output_type="latent",
               prompt_template={"template": PROMPT_TEMPLATE, "crop_start": c.crop_start},
               sampling_type="inverted_anti_drifting" if mode == "original" else "vanilla", return_dict=False)[0]
    return out[-1]


def our_latents(components, image, prompt, tmp_path, *, mode, window, sections, end_image=None,
                end_embed_weight=0.0):
    from jobfolder.checkpoint import load_checkpoint
    from pipeline.events import Done
    from pipeline.request import Request

    # A length that makes `sections` sections (lengths start at 1 s: a shorter one is made 1 s at a lower frame rate,
    # which changes nothing but the video's timing)
    seconds, fps = sections * window * 4 / 30, 30
    if seconds < 1:
        seconds, fps = 1.0, sections * window * 4
    req = Request(image=image, prompt=prompt, end_image=end_image, seconds=seconds, seed=SEED, steps=STEPS,
                  gs=10.0, latent_window=window, mode=mode, sampler="euler", teacache=0.0, resolution=64,
                  end_embed_weight=end_embed_weight, fps=fps)
    from memory.manager import MemoryManager

    events, last = run_job(req, components, tmp_path, memory=MemoryManager(device="cpu"))   # fp32 on the CPU
    assert isinstance(last, Done), getattr(last, "detail", last)
    tensors, meta = load_checkpoint(last.job_dir)
    assert meta["sections_done"] == sections
    return tensors["real"], last


# every section count with both windows and both modes (6 of the 12 combinations: each pair of values appears)
@pytest.mark.parametrize("sections,window,mode", [(1, 9, "original"), (1, 5, "f1"), (2, 9, "f1"), (2, 5, "original"),
                                                  (5, 9, "original"), (5, 5, "f1")])
def test_final_latents_match_diffusers(mode, window, sections, tiny_original, tiny_f1, tmp_path):
    components = tiny_original if mode == "original" else tiny_f1
    image = make_image(64, 64, seed=sections + window)
    prompt = "a red fox jumps over a log"
    ours, done = our_latents(components, image, prompt, tmp_path, mode=mode, window=window, sections=sections)
    ref = reference_latents(components, image, prompt, mode=mode, window=window, sections=sections)
    assert ours.shape == ref.shape
    assert ours.abs().mean() > 0.1                     # a real signal, not zeros
    torch.testing.assert_close(ours, ref.float(), atol=1e-4, rtol=0)


def test_end_frame_latent_matches_diffusers(tiny_original, tmp_path):
    """The end image's latent takes the first generated section's post slot, as in diffusers."""
    image, end = make_image(64, 64, seed=1), make_image(64, 64, seed=2)
    prompt = "a door slowly opens"
    ours, _ = our_latents(tiny_original, image, prompt, tmp_path, mode="original", window=9, sections=2,
                          end_image=end, end_embed_weight=0.0)
    ref = reference_latents(tiny_original, image, prompt, mode="original", window=9, sections=2, end_image=end)
    torch.testing.assert_close(ours, ref.float(), atol=1e-4, rtol=0)
    without_end = reference_latents(tiny_original, image, prompt, mode="original", window=9, sections=2)
    assert (ref - without_end).abs().max() > 1e-3      # the end frame changes the result


def test_end_frame_embedding_is_blended(tiny_original, tmp_path):
    """Our decision: the image conditioning is (1 − a)·start + a·end (a = 0.5 by default), where diffusers
    computes the blend and then ignores it."""
    from memory.manager import MemoryManager
    from pipeline.request import Request

    image, end = make_image(64, 64, seed=3), make_image(64, 64, seed=4)
    seen = []
    hook = tiny_original.transformer.image_projection.register_forward_pre_hook(
        lambda mod, args: seen.append(args[0].detach().clone()))
    try:
        req = Request(image=image, end_image=end, prompt="x", seconds=1.2, steps=2, sampler="euler",
                      teacache=0.0, resolution=64)
        assert req.end_embed_weight == 0.5
        events, last = run_job(req, tiny_original, tmp_path, memory=MemoryManager(device="cpu"))
    finally:
        hook.remove()
    from pipeline.images import to_model_tensor

    def siglip(img):
        fe = tiny_original.feature_extractor
        inputs = fe(images=(to_model_tensor(img) + 1) / 2, return_tensors="pt", do_rescale=False)
        return tiny_original.image_encoder(**inputs).last_hidden_state

    expected = 0.5 * siglip(image) + 0.5 * siglip(end)
    assert seen, "the transformer never received image embeddings"
    torch.testing.assert_close(seen[0], expected, atol=1e-5, rtol=1e-5)
    assert (siglip(image) - expected).abs().max() > 1e-3

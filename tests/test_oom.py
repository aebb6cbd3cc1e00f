"""Out-of-memory at every stage, injected with forward hooks on the real modules: recovered where possible
(transformer: more streaming and the step again; VAE: smaller tiles, then the conv fallback), otherwise a clean
failure that says what to change, keeps the video so far and leaves the slot empty for the next job."""
from __future__ import annotations

import json

import pytest
import torch

from jobfolder.checkpoint import load_checkpoint
from memory.manager import MemoryManager
from pipeline.events import Done, Failed, LogLine
from pipeline.request import Request
from tests.conftest import make_image, run_job
from video.mp4 import read_frames


def _request(**kw):
    base = dict(image=make_image(96, 80), prompt="rain on a window", seconds=2.4, steps=3, seed=21, teacache=0.0,
                resolution=64)
    base.update(kw)
    return Request(**base)


class OOMHook:
    """A forward pre-hook that raises torch.OutOfMemoryError on chosen calls (1-based)."""

    def __init__(self, module, calls):
        self.calls, self.count = set(calls), 0
        self.handle = module.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.count += 1
        if self.count in self.calls or "all" in self.calls:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")

    def remove(self):
        self.handle.remove()


def _planned_memory():
    # The cap's plan applied on the CPU, so the transformer can be re-planned (a 10 MB cap fits the tiny model).
    return MemoryManager(device="cpu", cap_gb=0.01, preserved_gb=0.001, plan_on_cpu=True)


def test_transformer_oom_is_recovered_by_streaming_more(tiny_original, tmp_path):
    _, clean = run_job(_request(), tiny_original, tmp_path / "clean", memory=_planned_memory())
    memory = _planned_memory()
    hook = OOMHook(tiny_original.transformer.single_transformer_blocks[0], calls=[2])
    try:
        events, last = run_job(_request(), tiny_original, tmp_path / "oom", memory=memory)
    finally:
        hook.remove()
    assert isinstance(last, Done), getattr(last, "detail", last)
    assert memory.preserved_gb > 0.001                                   # re-planned: more preserved, more streamed
    assert any(isinstance(e, LogLine) and "retrying the step" in e.message for e in events)
    torch.testing.assert_close(load_checkpoint(last.job_dir)[0]["real"], load_checkpoint(clean.job_dir)[0]["real"],
                               atol=0, rtol=0)


def test_transformer_oom_that_streaming_cannot_fix_fails_cleanly_keeping_the_video(tiny_original, tmp_path):
    memory = _planned_memory()
    steps_per_section = 3
    hook = OOMHook(tiny_original.transformer.single_transformer_blocks[0],
                   calls=range(steps_per_section + 1, 1000))                # from section 2 on, always
    try:
        events, last = run_job(_request(), tiny_original, tmp_path, memory=memory)
    finally:
        hook.remove()
    assert isinstance(last, Failed)
    assert last.message.startswith("Out of GPU memory in transformer")
    assert "preserved memory" in last.message and "resolution" in last.message and "kept" in last.message
    assert read_frames(last.partial_video).shape[0] == 33                # section 1's video survives
    info = json.loads((last.job_dir / "job.json").read_text())
    assert info["status"] == "failed" and info["error"].startswith("Out of GPU memory")
    assert memory.loaded() == []                                         # the slot is empty for the next job
    _, again = run_job(_request(seconds=1.2), tiny_original, tmp_path, memory=memory)
    assert isinstance(again, Done)


@pytest.mark.parametrize("stage,module", [
    ("text encoders", lambda c: c.text_encoder),
    ("VAE encode", lambda c: c.vae.encoder),
    ("image encoder", lambda c: c.image_encoder),
])
def test_oom_in_an_encoder_stage_fails_with_advice_then_the_next_job_runs(tiny_original, tmp_path, stage, module):
    memory = MemoryManager(device="cpu")
    hook = OOMHook(module(tiny_original), calls=["all"])
    try:
        _, last = run_job(_request(), tiny_original, tmp_path, memory=memory)
    finally:
        hook.remove()
    assert isinstance(last, Failed)
    assert last.message.startswith(f"Out of GPU memory in {stage}")
    assert last.partial_video is None and not list(last.job_dir.glob("*.mp4"))
    assert memory.loaded() == []
    _, again = run_job(_request(seconds=1.2), tiny_original, tmp_path, memory=memory)
    assert isinstance(again, Done)


def test_vae_decode_oom_once_is_recovered(tiny_original, tmp_path):
    memory = MemoryManager(device="cpu")
    hook = OOMHook(tiny_original.vae.decoder, calls=[1])
    try:
        _, last = run_job(_request(), tiny_original, tmp_path, memory=memory)
    finally:
        hook.remove()
    assert isinstance(last, Done) and last.frames == 73
    decode_records = [r for r in memory.records if r.name == "VAE decode"]
    assert len(decode_records[0].vae_attempts) >= 2 and not decode_records[0].vae_attempts[0]["ok"]


def test_vae_decode_oom_everywhere_fails_keeping_the_first_section(tiny_original, tmp_path):
    """Section 2's decode runs out of memory at every tile size and in the conv fallback too."""
    memory = MemoryManager(device="cpu")

    def fail_after_first_decode(module, args):
        if any(r.name == "VAE decode" for r in memory.records):       # the first decode has finished
            raise torch.OutOfMemoryError("HIP out of memory. Tried to allocate 7.70 GiB (injected)")

    handle = tiny_original.vae.decoder.register_forward_pre_hook(fail_after_first_decode)
    try:
        _, last = run_job(_request(), tiny_original, tmp_path, memory=memory)
    finally:
        handle.remove()
    assert isinstance(last, Failed) and last.message.startswith("Out of GPU memory in VAE decode")
    assert read_frames(last.partial_video).shape[0] == 33
    attempts = [r for r in memory.records if r.name == "VAE decode"][-1].vae_attempts
    assert attempts[-1]["fallback"] and not attempts[-1]["ok"]            # the conv fallback was tried last


def test_vae_decode_conv_oom_goes_to_smaller_tiles_first_then_the_conv_tiers(tiny_original, tmp_path):
    """Every native (tier-1) conv3d of the decoder runs out of memory. The first tries let the OOM reach the tile
    policy (no tier change, no verdict); the last try hands it to the conv fallback, whose tier 2 answers."""
    from rocm import Fault, FaultPlan

    memory = MemoryManager(device="cpu")
    fallback = memory.conv_fallback                         # the job's fallback, passed explicitly (no global)
    real_decode = memory.decode_vae

    def decode_with_faults(vae, z):
        with fallback.injecting(FaultPlan([Fault(tier=1, kind="hip_oom", op="conv3d")])):
            return real_decode(vae, z)

    memory.decode_vae = decode_with_faults
    _, last = run_job(_request(seconds=1.2), tiny_original, tmp_path, memory=memory)
    assert isinstance(last, Done), getattr(last, "detail", last)
    attempts = [r for r in memory.records if r.name == "VAE decode"][0].vae_attempts
    assert [a["ok"] for a in attempts][-1] is True and attempts[-1]["fallback"]
    assert all(not a["ok"] and not a["fallback"] for a in attempts[:-1]) and len(attempts) >= 2
    stats = fallback.stats()
    assert stats.calls_per_tier.get(2, 0) > 0                            # the decode finished on tier 2

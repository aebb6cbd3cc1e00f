"""The same job twice in one process (as the app runs jobs, and as benchmarks/hostram.py's b2 does): the second
job takes its prompt from the prompt cache (no text encoders), gets a new memory manager, re-reads the once-per-job
models from the weight files, and must still give the same video, bit for bit.

The models are the tiny preset saved as safetensors in the real repos' layout and loaded through the real path, in
the real preset's dtypes (float16 text encoders, VAE and image encoder; bfloat16 transformer), under the smallest
host budget (every chunk read from the files) with the transformer's blocks streamed, so the second job goes
through every copy path again: file → stage buffer, file → RAM for a streamed block, and the cached embeddings.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from common.units import GIB
from configs.presets import HUNYUAN
from memory.hostpack import HostPack
from memory.hostplan import FRAMEPACK_STAGES, HostBudgetError
from memory.manager import MemoryManager
from pipeline.components import _dtype, load_components
from pipeline.events import Done
from pipeline.request import Request
from pipeline.tiny import build_tiny_llama
from tests.conftest import make_image, run_job

REAL_DTYPES = dataclasses.replace(HUNYUAN, default_resolution=64)     # the real dtypes at the tiny resolution
OVERHEAD = GIB // 2                   # injected: the budget below is then exact (a job measures its own otherwise)


@pytest.fixture(scope="module")
def saved_in_load_dtypes(tmp_path_factory):
    """The tiny models in the real repos' layout, each saved in the dtype the real preset loads it in."""
    comps = load_components("tiny", "original")
    root = tmp_path_factory.mktemp("models")
    for role, src in HUNYUAN.sources("original").items():
        part = build_tiny_llama(comps.preset) if role == "text_encoder" else getattr(comps, role)   # saved whole
        if isinstance(part, torch.nn.Module):
            part.to(_dtype(src.dtype))
        folder = root / src.repo / (src.subfolder or "")
        folder.mkdir(parents=True, exist_ok=True)
        part.save_pretrained(folder)
    return root


def _frames_hash(last) -> str:
    info = json.loads((last.job_dir / "job.json").read_text())
    return hashlib.sha256("".join(s["frames_sha256"] for s in info["sections"]).encode()).hexdigest()


def test_the_same_job_twice_in_one_process_gives_the_same_video(saved_in_load_dtypes, tmp_path, monkeypatch):
    monkeypatch.setenv("STEADYFRAME_PROMPT_CACHE", str(tmp_path / "prompts"))
    comps = load_components(REAL_DTYPES, "original", model_dir=saved_in_load_dtypes)
    assert comps.text_encoder.dtype == torch.float16 and comps.vae.dtype == torch.float16
    assert comps.image_encoder.dtype == torch.float16 and comps.transformer.dtype == torch.bfloat16
    tr = HostPack.of(comps.transformer)
    cap_gb = (tr.rest.nbytes + tr.blocks[0].nbytes) / GIB            # one block resident, the others streamed

    def manager(host_ram_gb):                                       # a new manager per job, as the app makes
        return MemoryManager(device="cpu", cap_gb=cap_gb, preserved_gb=0, plan_on_cpu=True,
                             host_ram_gb=host_ram_gb, host_overhead=OVERHEAD)

    with pytest.raises(HostBudgetError) as refused:
        manager(0.001).arrange_host(comps.models(), FRAMEPACK_STAGES, 1, 37)
    tight = refused.value.minimum / GIB                              # the smallest budget: everything in the files
    request = Request(image=make_image(64, 64), prompt="a red fox runs through fresh snow", seconds=1.2, steps=2,
                      teacache=0.0, seed=31337)
    runs = []
    for job in (1, 2):
        mm = manager(tight)
        _, last = run_job(request, comps, tmp_path / "outputs", memory=mm)
        assert isinstance(last, Done), getattr(last, "detail", last)
        runs.append((mm, last))
    (first, a), (second, b) = runs
    assert "text encoders" in first.load_order() and "text encoders" not in second.load_order()   # cache hit
    for role in ("text_encoder", "image_encoder", "vae"):           # not kept in RAM between stages
        assert HostPack.of(getattr(comps, role)).host_bytes == 0, role
    image = [r for r in second.records if r.name == "image encoder"]
    assert image and image[0].file_bytes > 0                        # re-read from the files in job 2
    assert any("streamed" in p for r in second.records if r.name == "transformer" for p in r.placement.values())
    latents = [load_file(str(last.job_dir / "latents.safetensors")) for last in (a, b)]
    for key in latents[0]:
        assert torch.equal(latents[0][key], latents[1][key]), key
    assert _frames_hash(a) == _frames_hash(b)

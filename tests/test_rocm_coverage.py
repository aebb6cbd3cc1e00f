"""Every convolution of a job runs inside the conv fallback: the VAE's, the transformer's Conv3d patch embedders
and SigLIP's Conv2d patch embedding (RDNA1 promises convolutions without MIOpen: all of them)."""

from __future__ import annotations

import pytest
from torch import nn

from memory.manager import MemoryManager
from pipeline.events import Done
from pipeline.request import Request
from rocm.conv_fallback import ConvFallback
from rocm.faults import Fault, FaultPlan
from tests.conftest import make_image, run_job


@pytest.fixture
def failing_tier1():
    """A fallback (in memory only) whose tier 1 fails like MIOpen for every convolution."""
    return ConvFallback(persist=False, probe=None, fault_plan=FaultPlan([Fault(tier=1, kind="miopen_unknown")]))


def test_every_convolution_of_a_job_goes_through_the_fallback(tiny_original, tmp_path, failing_tier1):
    request = Request(image=make_image(96, 80), prompt="a lamp flickers", seconds=1.2, steps=2, seed=3,
                      teacache=0.0, resolution=64)
    memory = MemoryManager(device="cpu", conv_fallback=failing_tier1)     # the job's fallback, passed explicitly
    _, last = run_job(request, tiny_original, tmp_path, memory=memory)
    assert isinstance(last, Done), getattr(last, "detail", last)
    stats = failing_tier1.stats()
    assert 1 not in stats.calls_per_tier and stats.exhausted == 0        # every conv was answered by tier 2
    fell_back = " | ".join(ev.signature for ev in stats.fell_back)
    convs = {f"{role}.{name}": tuple(m.weight.shape)
             for role in ("transformer", "image_encoder", "vae")
             for name, m in getattr(tiny_original, role).named_modules() if isinstance(m, (nn.Conv2d, nn.Conv3d))}
    for role in ("transformer.x_embedder.proj", "transformer.clean_x_embedder.proj",
                 "image_encoder.embeddings.patch_embedding"):
        assert role in convs
    missing = [name for name, shape in convs.items() if f"w {shape}" not in fell_back]
    assert missing == [], f"convolutions that bypassed the fallback: {missing}"
    assert stats.calls_per_op.get("conv2d", {}).get(2, 0) > 0            # SigLIP's patch embedding


def test_a_gpu_fault_in_a_convolution_fails_the_job_and_the_next_job_runs(tiny_original, tmp_path):
    """Issue 40: a transient GPU fault (an 'illegal memory access' in the first convolution) fails that job with a
    message saying so, records no verdict, and the next job on the same fallback runs every convolution on tier 1."""
    from pipeline.events import Failed

    fallback = ConvFallback(cache_dir=tmp_path / "verdicts", probe=None,
                            fault_plan=FaultPlan([Fault(tier=1, kind="illegal_access", times=1)]))
    request = Request(image=make_image(96, 80), prompt="a lamp flickers", seconds=1.0, steps=1, seed=3,
                      resolution=64)
    _, first = run_job(request, tiny_original, tmp_path / "a", memory=MemoryManager(device="cpu",
                                                                                    conv_fallback=fallback))
    assert isinstance(first, Failed) and "GPU faulted while running a convolution in VAE encode" in first.message
    assert "next job tries this convolution again" in first.message
    _, second = run_job(request, tiny_original, tmp_path / "b", memory=MemoryManager(device="cpu",
                                                                                     conv_fallback=fallback))
    assert isinstance(second, Done), getattr(second, "detail", second)
    stats = fallback.stats()
    assert set(stats.calls_per_tier) == {1} and not stats.fell_back          # no tier moved, nothing pinned

"""The single model slot: the load order of a real (tiny) job, recorded and asserted at every stage boundary."""
from __future__ import annotations

import json

import pytest
import torch

from memory.manager import MemoryManager
from memory.snapshot import MemorySnapshot
from pipeline.events import Done
from pipeline.request import Request
from tests.conftest import make_image, run_job

STAGE_MODELS = {"text encoders": ("text_encoder", "text_encoder_2"), "VAE encode": ("vae",),
                "image encoder": ("image_encoder",), "transformer": ("transformer",), "VAE decode": ("vae",)}


@pytest.fixture
def trims(monkeypatch):
    import rocm

    seen = []
    real = rocm.trim
    monkeypatch.setattr(rocm, "trim", lambda label="", device=None, **kw: (seen.append(label), real(label, device, **kw))[1])
    return seen


def test_job_load_order_and_every_boundary(tiny_original, tmp_path, trims):
    mm = MemoryManager(device="cpu")
    req = Request(image=make_image(96, 80), prompt="a boat", seconds=2.4, steps=2, teacache=0.0, resolution=64)
    _, last = run_job(req, tiny_original, tmp_path, memory=mm)
    assert isinstance(last, Done)
    order = ["text encoders", "VAE encode", "image encoder", "transformer", "VAE decode", "transformer",
             "VAE decode"]
    assert mm.load_order() == order
    assert trims == [f"after {name}" for name in order] + ["after the job"]
    boundaries = [s for s in mm.timeline if s.label.split(" ", 1)[0] in ("before", "in", "after")]
    assert [s.label for s in boundaries] == [f"{w} {n}" for n in order for w in ("before", "in", "after")]
    for snap in boundaries:
        kind, name = snap.label.split(" ", 1)
        # exactly one stage's models in the slot, nothing before or after it
        assert snap.loaded == (STAGE_MODELS[name] if kind == "in" else ())
    for record in mm.records:
        assert record.models == STAGE_MODELS[record.name]
        assert record.before.host_rss > 0 and record.after.host_rss > 0
        assert record.ended >= record.started
    assert mm.loaded() == []
    info = json.loads((last.job_dir / "job.json").read_text())
    assert [s["name"] for s in info["memory"]["stages"]] == order
    assert {"switch_s", "host_rss", "peak_reserved", "pin_host_memory"} <= set(info["memory"])
    assert {"load_s", "unload_s", "pin_s", "placement", "host_rss_before", "host_rss_after"} \
        <= set(info["memory"]["stages"][0])


def test_a_failing_stage_still_unloads_and_the_next_one_starts(tiny_original, trims):
    mm = MemoryManager(device="cpu")
    with pytest.raises(ValueError, match="boom"):
        with mm.stage("VAE decode", vae=tiny_original.vae):
            raise ValueError("boom")
    assert mm.loaded() == [] and mm.load_order() == ["VAE decode"] and trims == ["after VAE decode"]
    with mm.stage("image encoder", image_encoder=tiny_original.image_encoder):
        pass
    assert mm.load_order() == ["VAE decode", "image encoder"]


def test_only_one_stage_at_a_time(tiny_original):
    mm = MemoryManager(device="cpu")
    with mm.stage("VAE encode", vae=tiny_original.vae):
        with pytest.raises(RuntimeError, match="still holds vae"):
            with mm.stage("image encoder", image_encoder=tiny_original.image_encoder):
                pass
    assert mm.load_order() == ["VAE encode"]


def test_status_line_format():
    snap = MemorySnapshot("before VAE decode", 0.0, "cuda:0", allocated=5 * 2**30, reserved=6 * 2**30,
                          peak_allocated=0, peak_reserved=0, free=10 * 2**30, cap=20 * 2**30, host_rss=2**30)
    assert snap.status_line() == ("[before VAE decode] free 10.00 GB | allocated 5.00 GB (25% of cap) | "
                                  "reserved 6.00 GB | host RSS 1.00 GB")
    cpu = MemorySnapshot("after transformer", 0.0, "cpu", 0, 0, 0, 0, None, None, 3 * 2**30)
    assert cpu.status_line().startswith("[after transformer] CPU run") and "3.00 GB" in cpu.status_line()


def test_budget_and_workload_are_explicit(tiny_original):
    a = MemoryManager(device="cpu", cap_gb=20, preserved_gb=6)
    b = MemoryManager(device="cpu", cap_gb=12, preserved_gb=8, prefetch_depth=2, plan_on_cpu=True)
    assert a.budget.cap_bytes is None                  # a CPU run has no cap unless asked to plan as if it had
    assert b.budget.cap_bytes == 12 * 2**30 and b.budget.preserved_bytes == 8 * 2**30
    assert b.budget.slot_count == 3
    b.set_workload(608, 640, 18)
    assert b.budget.workload.tokens > a.budget.workload.tokens


def test_the_pinning_flag_decides_whether_host_copies_are_pinned(tiny_original, monkeypatch):
    """Observed without a GPU: what the manager asks the host packs for. With the flag on and a GPU device they
    are asked to pin; with it off (--no-pin), or on a CPU run, never."""
    from memory.hostpack import HostPack

    asked = []
    monkeypatch.setattr(HostPack, "set_pinned", lambda self, pinned: asked.append(pinned) or 0.0)
    vae = tiny_original.vae
    on = MemoryManager(device="cuda:0", pin_host_memory=True)
    on.prepare(vae=vae)
    assert asked == [True] and on.pin
    off = MemoryManager(device="cuda:0", pin_host_memory=False)
    off.prepare(vae=vae)
    cpu = MemoryManager(device="cpu", pin_host_memory=True)
    cpu.prepare(vae=vae)
    assert asked == [True] and not off.pin and not cpu.pin
    assert off.summary()["pin_host_memory"] is False and on.summary()["pin_host_memory"] is True


def test_prepare_packs_ahead():
    from memory.hostpack import _ATTR, HostPack

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    assert _ATTR not in model.__dict__                     # not packed yet
    mm = MemoryManager(device="cpu")
    seconds = mm.prepare(model=model)
    pack = model.__dict__[_ATTR]
    assert pack.intact() and seconds >= pack.pack_s > 0     # packed now, and the time says so
    mm.prepare(model=model)
    assert HostPack.of(model) is pack                       # packed once: a later stage finds it ready

"""No hidden globals: what is patched is visible in one registry, only inside a stage, and undone however the stage
ends; the conv fallback is passed explicitly (never looked up); the VRAM cap is an explicit call."""
from __future__ import annotations

import contextlib
import types

import pytest
import torch
import torch.nn.functional as F

from common import patches
from memory.manager import MemoryManager
from memory.vae import VaeDecodePolicy
from pipeline.events import Done, Failed
from pipeline.request import Request
from rocm.sdpa import AttentionGuard
from tests.conftest import make_image, run_job

ORIGINAL = {"conv2d": F.conv2d, "conv3d": F.conv3d, "scaled_dot_product_attention": F.scaled_dot_product_attention}


def _untouched():
    assert patches.active_patches() == {}
    for name, fn in ORIGINAL.items():
        assert getattr(F, name) is fn, name


def _request(**kw):
    base = dict(image=make_image(96, 80), prompt="a lamp", seconds=1.2, steps=2, seed=3, teacache=0.0, resolution=64)
    base.update(kw)
    return Request(**base)


def test_nested_patches_of_one_attribute_restore_in_turn():
    target = types.SimpleNamespace(f="original")
    outer = patches.patch(target, "f", "outer", "test outer")
    inner = patches.patch(target, "f", "inner", "test inner")
    assert patches.active_patches() == {"SimpleNamespace.f": "test inner"}
    patches.restore(inner)
    assert target.f == "outer" and patches.active_patches() == {"SimpleNamespace.f": "test outer"}
    patches.restore(outer)
    assert target.f == "original" and patches.active_patches() == {}


def test_patches_of_two_threads_may_end_in_any_order():
    """Two jobs' conv fallbacks (two threads, two MemoryManagers) patch F.conv2d in turn; the first one ends first.
    The attribute stays the second one's until that ends too, then it is the original again (it used to be left
    pointing at the first fallback for good)."""
    target = types.SimpleNamespace(f="original")
    first = patches.patch(target, "f", "first", "job 1")
    second = patches.patch(target, "f", "second", "job 2")
    patches.restore(first)
    assert target.f == "second" and patches.active_patches() == {"SimpleNamespace.f": "job 2"}
    patches.restore(second)
    patches.restore(second)                                  # a second restore changes nothing
    assert target.f == "original" and patches.active_patches() == {}


def test_two_conv_fallbacks_active_in_overlapping_blocks_leave_nothing_patched():
    one, two = MemoryManager(device="cpu").conv_fallback, MemoryManager(device="cpu").conv_fallback
    a, b = one.active(), two.active()
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert F.conv2d is not ORIGINAL["conv2d"]                # the second block still runs through its fallback
    b.__exit__(None, None, None)
    _untouched()


def test_a_stage_that_raises_leaves_nothing_patched(tiny_original):
    memory = MemoryManager(device="cpu")
    seen = {}
    with pytest.raises(RuntimeError, match="inside the stage"):
        with memory.stage("VAE encode", vae=tiny_original.vae), memory.conv_fallback.active():
            seen.update(patches.active_patches())
            raise RuntimeError("inside the stage")
    assert seen == {"torch.nn.functional.conv2d": "rocm.ConvFallback",
                    "torch.nn.functional.conv3d": "rocm.ConvFallback"}
    _untouched()
    assert memory.loaded() == []


def test_the_attention_guard_is_undone_after_an_exception():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="boom"):
        with AttentionGuard(torch.device("cpu"), force_chunked=True, label="transformer"):
            assert patches.active_patches() == {
                "torch.nn.functional.scaled_dot_product_attention": "memory.AttentionGuard (transformer)"}
            F.scaled_dot_product_attention(q, q, q)
            raise ValueError("boom")
    _untouched()


def test_a_job_failing_in_a_stage_leaves_nothing_patched(tiny_original, tmp_path):
    """A failure inside the VAE decode (while the conv fallback is patched in): the job fails cleanly and nothing
    stays patched; between stages nothing was patched either."""
    during, between = [], []
    memory = MemoryManager(device="cpu")
    real_snapshot = memory.snapshot

    def snapshot(label):
        if label.startswith("before ") or label.startswith("after "):
            between.append(dict(patches.active_patches()))
        return real_snapshot(label)

    def fail(module, args):
        during.append(dict(patches.active_patches()))
        raise RuntimeError("decoder exploded (injected)")

    memory.snapshot = snapshot
    handle = tiny_original.vae.decoder.register_forward_pre_hook(fail)
    try:
        _, last = run_job(_request(), tiny_original, tmp_path, memory=memory)
    finally:
        handle.remove()
    assert isinstance(last, Failed) and "decoder exploded" in last.message
    assert during and "torch.nn.functional.conv3d" in during[0]
    assert between and all(p == {} for p in between)
    _untouched()


def test_the_job_uses_its_managers_conv_fallback_never_the_module_default(tiny_original, tmp_path, monkeypatch):
    import rocm.api

    def no_default():
        raise AssertionError("the module default conv fallback was looked up")

    monkeypatch.setattr(rocm.api, "get_default_fallback", no_default)
    monkeypatch.setattr(rocm, "get_default_fallback", no_default, raising=False)
    memory = MemoryManager(device="cpu")
    # issue 31 item 5: the job keeps the hang probe's child warm from before its first stage (the GPU still empty)
    order, stage, warm_probe = [], memory.stage, memory.conv_fallback.warm_probe

    def stage_seen(name, *args, **kwargs):
        order.append(name)
        return stage(name, *args, **kwargs)

    @contextlib.contextmanager
    def warm_seen(device, enabled=None):
        order.append(f"warm probe on {device}")
        with warm_probe(device, enabled):
            yield
        order.append("warm probe ends")

    monkeypatch.setattr(memory, "stage", stage_seen)
    monkeypatch.setattr(memory.conv_fallback, "warm_probe", warm_seen)
    _, last = run_job(_request(), tiny_original, tmp_path, memory=memory)
    assert isinstance(last, Done), getattr(last, "detail", last)
    assert sum(memory.conv_fallback.stats().calls_per_tier.values()) > 0      # its convolutions went through it
    assert order[0] == "warm probe on cpu" and order[-1] == "warm probe ends" and "VAE encode" in order, order


def test_the_vae_policy_uses_the_conv_fallback_it_is_given(tiny_original):
    scopes = []

    class Conv:
        @contextlib.contextmanager
        def active(self):
            scopes.append("active")
            yield

        @contextlib.contextmanager
        def passing_oom(self):
            scopes.append("passing_oom")
            yield

    with torch.no_grad():
        VaeDecodePolicy().decode(tiny_original.vae, torch.randn(1, 16, 2, 8, 8), available=None, conv=Conv())
    assert scopes == ["passing_oom"]


def test_building_a_manager_sets_no_memory_fraction(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d)))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=24 << 30))
    memory = MemoryManager(device="cuda:0", cap_gb=12)
    assert calls == [] and not memory.cap_applied
    memory.apply_cap()
    assert calls == [(0.5, torch.device("cuda", 0))] and memory.cap_applied


def test_a_job_applies_the_cap_once_when_it_starts(tiny_original, tmp_path):
    memory = MemoryManager(device="cpu")
    applied = []
    memory.apply_cap = lambda: applied.append(list(memory.load_order()))
    _, last = run_job(_request(), tiny_original, tmp_path, memory=memory)
    assert isinstance(last, Done)
    assert applied == [[]]                     # once, before the first stage loaded anything

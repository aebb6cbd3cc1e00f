"""Threads: tier 2 never flips the process-wide MIOpen/cuDNN switch, and ``active()`` blocks are counted."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from rocm_helpers import assert_close_scaled

from rocm.conv_fallback import ConvFallback


class _RecordingProp:
    """Stands in for ``torch.backends.cudnn.enabled``'s descriptor and records every assignment."""

    def __init__(self, original):
        self.original, self.sets = original, []

    def __get__(self, obj, objtype=None):
        return self.original.__get__(obj, objtype)

    def __set__(self, obj, value):
        self.sets.append(value)
        self.original.__set__(obj, value)


@pytest.fixture
def flag_sets(monkeypatch):
    cls = type(torch.backends.cudnn)
    recorder = _RecordingProp(cls.__dict__["enabled"])
    monkeypatch.setattr(cls, "enabled", recorder)
    return recorder.sets


CASES = [("conv3d", (2, 4, 6, 7, 7), (6, 2, 3, 3, 3), dict(stride=(2, 1, 2), padding=(1, 2, 0), dilation=(1, 2, 1),
                                                             groups=2)),
         ("conv2d", (2, 4, 9, 8), (4, 1, 3, 3), dict(stride=2, padding=1, groups=4)),
         ("conv2d", (1, 3, 9, 9), (5, 3, 3, 2), dict(dilation=(2, 1)))]


@pytest.mark.parametrize("tier,vendor", [(2, True), (3, False)])
@pytest.mark.parametrize("op,xs,ws,kw", CASES)
def test_vendor_off_tiers_never_touch_the_global_flag(flag_sets, tier, vendor, op, xs, ws, kw):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(xs, generator=g, requires_grad=True)
    w = torch.randn(ws, generator=g, requires_grad=True)
    b = torch.randn(ws[0], generator=g, requires_grad=True)
    fb = ConvFallback(tiers=(tier,), vendor_in_decomposition=vendor, persist=False, probe=None)
    out = getattr(fb, op)(x, w, b, **kw)
    ref = getattr(F, op)(x, w, b, **kw)
    assert fb.last_tier == tier
    assert_close_scaled(out, ref)
    grad = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad(out, (x, w, b), grad), torch.autograd.grad(ref, (x, w, b), grad)):
        assert_close_scaled(got, want)
    assert flag_sets == []          # no process-wide switch was flipped, forward or backward


def test_active_blocks_are_counted_across_threads():
    saved = F.conv2d, F.conv3d
    fb = ConvFallback(persist=False, probe=None)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with fb.active():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def second():
        a_in.wait(10)
        with fb.active():
            b_in.set()
            a_out.wait(10)              # the first block has ended while this one still runs
            seen["patched_inside"] = F.conv3d is not saved[1]
            with torch.no_grad():
                torch.nn.Conv3d(2, 2, 1)(torch.randn(1, 2, 2, 2, 2))

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"patched_inside": True}
    assert fb.stats().calls_per_tier == {1: 1}          # the second block's conv went through the fallback
    assert (F.conv2d, F.conv3d) == saved and not fb.installed


def test_install_holds_the_patch_past_blocks_and_uninstall_waits_for_them():
    saved = F.conv3d
    fb = ConvFallback(persist=False, probe=None)
    fb.install()
    with fb.active():
        with fb.active():
            pass
        assert fb.installed
    assert fb.installed and F.conv3d is not saved      # install() still holds it
    with fb.active():
        fb.uninstall()                                  # a block is running: the patch stays until it ends
        assert fb.installed
    assert not fb.installed and F.conv3d is saved

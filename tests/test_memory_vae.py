"""VAE decode inside the budget: tile choice arithmetic, OOM retry by fault injection, the rocm hand-over."""
from __future__ import annotations

import contextlib

import pytest
import torch

from memory.manager import MemoryManager
from memory.vae import VaeDecodePolicy, VaeTiling, candidates, is_oom, memory_estimate, scratch_estimate, work
from tests.model_helpers import oom_above

REAL = (9, 76, 80)          # 33 frames at 608×640, in latents


class _RealVaeConfig:       # what the policy reads of the full-size VAE (no weights needed)
    class config:
        block_out_channels = (128, 256, 512, 512)
    dtype = torch.float16


def test_work_counts_overlap_like_diffusers_loops():
    # measured on the H100: 256px/16-frame tiles took 3.6 s, whole frames/16-frame 1.7 s (BENCHMARKS.md)
    assert work(VaeTiling(256, 16), REAL) == (5 + 5 + 3) * (32 + 32 + 28 + 4) * (32 + 32 + 32 + 8) == 129792
    assert work(VaeTiling(0, 16), REAL) == 13 * 76 * 80 == 79040
    assert work(VaeTiling(0, 0), REAL) == 9 * 76 * 80          # no overlap at all
    assert VaeTiling(256, 16).stride == 192 and VaeTiling(256, 16).frame_stride == 12


def test_memory_estimate_matches_the_h100_measurement():
    # measured peaks (fp16, full-size VAE): 3.92 GB, 22.56 GB, 16.27 GB
    for tiling, measured in ((VaeTiling(256, 16), 3.92e9), (VaeTiling(0, 16), 22.56e9), (VaeTiling(384, 0), 16.27e9)):
        est = memory_estimate(tiling, REAL)
        assert measured <= est <= 1.1 * measured


def test_plan_takes_least_work_that_fits_then_clearly_smaller():
    policy = VaeDecodePolicy()
    order = policy.plan(_RealVaeConfig, REAL, available=int(20.4e9))
    assert order[0] == VaeTiling(384, 0)                    # whole frames/16 (22.6 GB) does not fit in 20 GB
    mems = [memory_estimate(t, REAL) for t in order]
    assert all(b < 0.7 * a for a, b in zip(mems, mems[1:]))
    assert order[-1].size == 32 or mems[-1] == min(memory_estimate(t, REAL) for t in candidates(REAL))
    roomy = policy.plan(_RealVaeConfig, REAL, available=None)
    assert roomy[0] == VaeTiling(0, 0)                      # no limit: no tiling, no recomputed overlap


def test_cudnn_workspace_reserve_leaves_room_beside_the_tiles():
    available = int(19.0 * 2**30)
    plain = VaeDecodePolicy().plan(_RealVaeConfig, REAL, available)[0]
    reserve = int(4.5 * 2**30)
    kept = VaeDecodePolicy(workspace_reserve=reserve).plan(_RealVaeConfig, REAL, available)[0]
    assert memory_estimate(plain, REAL) + reserve > available                 # today's 384 px tiles leave < 4.5 GB
    assert memory_estimate(kept, REAL) + reserve <= available                  # the reserve is kept free
    assert work(kept, REAL) >= work(plain, REAL)                               # (paid for with some overlap work)
    # at most a quarter of what is free, and dropped when no tiling fits with it
    tight = int(2.0 * 2**30)
    with_reserve = VaeDecodePolicy(workspace_reserve=reserve).plan(_RealVaeConfig, REAL, tight)[0]
    assert memory_estimate(with_reserve, REAL) + tight // 4 <= tight
    tiny_room = min(memory_estimate(t, REAL) for t in candidates(REAL)) + 1
    assert VaeDecodePolicy(workspace_reserve=reserve).plan(_RealVaeConfig, REAL, tiny_room)[0] == \
        VaeDecodePolicy().plan(_RealVaeConfig, REAL, tiny_room)[0]


def test_rocm_limits_miopen_scratch():
    policy = VaeDecodePolicy(scratch_limit=int(7.29e9))
    first = policy.plan(_RealVaeConfig, REAL, available=int(20.4e9))[0]
    assert scratch_estimate(first, REAL) <= 7.29e9 < scratch_estimate(VaeTiling(256, 16), REAL)


def test_oom_retries_with_smaller_tiles(tiny_original):
    vae = tiny_original.vae
    z = torch.randn(1, 16, 3, 8, 8)
    before = (vae.use_tiling, vae.use_framewise_decoding, vae.tile_sample_min_height)
    seen = []
    policy = VaeDecodePolicy(fault=oom_above(32, seen))
    with torch.no_grad():
        pixels = policy.decode(vae, z, available=None)
    assert pixels.shape == (1, 3, 9, 64, 64) and torch.isfinite(pixels).all()
    assert seen[0].size == 0 and seen[-1].size == 32          # whole frames first, then smaller until it fits
    assert [a["ok"] for a in policy.attempts] == [False] * (len(seen) - 1) + [True]
    assert not any(a["fallback"] for a in policy.attempts)
    assert (vae.use_tiling, vae.use_framewise_decoding, vae.tile_sample_min_height) == before


def test_out_of_memory_at_the_smallest_tiles_hands_over_to_the_conv_fallback(tiny_original):
    entered = []

    @contextlib.contextmanager
    def fallback():
        entered.append(True)
        policy.fault = None                                    # the fallback path has the memory it needs
        yield

    policy = VaeDecodePolicy(fault=oom_above(0, []), fallback=fallback)
    with torch.no_grad():
        pixels = policy.decode(tiny_original.vae, torch.randn(1, 16, 2, 8, 8), available=None)
    assert entered == [True] and pixels.shape[2] == 5
    assert policy.attempts[-1]["fallback"] and policy.attempts[-1]["ok"]


def test_other_errors_are_not_retried(tiny_original):
    def fault(tiling):
        raise ValueError("a shape bug")

    policy = VaeDecodePolicy(fault=fault)
    with pytest.raises(ValueError):
        policy.decode(tiny_original.vae, torch.randn(1, 16, 2, 8, 8), available=None)
    assert len(policy.attempts) == 1


def test_oom_texts():
    assert is_oom(torch.OutOfMemoryError("x"))
    assert is_oom(RuntimeError("HIP out of memory. Tried to allocate 7.70 GiB."))
    assert is_oom(RuntimeError("HSA exception: MemoryRegion::BlockAllocator::alloc failed"))
    assert not is_oom(RuntimeError("shape mismatch"))


def test_manager_decode_records_attempts(tiny_original):
    mm = MemoryManager(device="cpu")
    seen = []
    mm.vae_policy.fault = oom_above(32, seen)
    with mm.stage("VAE decode", vae=tiny_original.vae) as rec, torch.no_grad():
        pixels = mm.decode_vae(tiny_original.vae, torch.randn(1, 16, 2, 8, 8))
    assert pixels.shape == (1, 3, 5, 64, 64)
    assert len(rec.vae_attempts) == len(seen) >= 2 and rec.vae_attempts[-1]["ok"]
    assert mm.summary()["stages"][0]["vae_attempts"][-1]["tiling"].startswith("32px")


@pytest.mark.parametrize("gfx, limited", [("gfx942", True), ("gfx1100", False), ("gfx1030", False),
                                          ("gfx1201", False), ("gfx1010", False)])
def test_the_miopen_3d_scratch_limit_applies_only_where_conv3d_reaches_miopen_3d(gfx, limited):
    """Issue 31, item 9: RDNA starts conv3d at the 2D decomposition (tier 3; RDNA1 keeps MIOpen off): the 3D scratch
    limit only cut their streamed decoder's chunks. CDNA (gfx942) runs conv3d on MIOpen: the limit holds there."""
    from memory.vae import MIOPEN_SCRATCH_LIMIT, miopen_scratch_limit
    from rocm.arch import Runtime, arch_family

    runtime = Runtime("rocm", gfx, arch_family(gfx), "2.11.0+rocm7.0", "7.0", None, "AMD GPU", 24 * 2**30, (gfx,))
    assert miopen_scratch_limit(runtime) == (MIOPEN_SCRATCH_LIMIT if limited else None)
    cuda = Runtime("cuda", "sm_90", None, "2.11.0+cu130", None, "13.0", "H100", 80 * 2**30, ())
    assert miopen_scratch_limit(cuda) is None

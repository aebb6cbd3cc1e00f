"""The budget's arithmetic for the real model sizes, without a GPU (the real transformer is built on meta)."""
from __future__ import annotations

import pytest

from common.units import GIB
from configs.presets import HUNYUAN, TINY
from memory.estimate import describe_preserved, transformer_device_sizes
from memory.plan import activation_bytes, framepack_tokens, plan_residency


@pytest.fixture(scope="module")
def real_sizes():
    """(bytes per block, bytes of the rest) of the real transformer in bf16, as the estimate and the size check
    count them (memory/estimate.py)."""
    chunks, _ = transformer_device_sizes(HUNYUAN)
    return chunks[1:], chunks[0]


def _plan(sizes, cap_gb, preserved_gb, **kw):
    blocks, other = sizes
    return plan_residency(blocks, other, int(cap_gb * GIB), int(preserved_gb * GIB), min_resident=1, **kw)


def test_real_transformer_sizes(real_sizes):
    blocks, other = real_sizes
    assert len(blocks) == 60                                  # 20 dual + 40 single blocks
    assert len(set(blocks[:20])) == 1 and len(set(blocks[20:])) == 1
    assert blocks[0] == pytest.approx(0.633 * GIB, rel=0.01)   # a dual block in bf16
    assert blocks[20] == pytest.approx(0.264 * GIB, rel=0.01)  # a single block
    assert other == pytest.approx(0.771 * GIB, rel=0.01)       # embedders, refiner, output layers
    assert (sum(blocks) + other) / 1e9 == pytest.approx(25.7, abs=0.1)


def test_cap_20_preserved_6_keeps_block_zero_and_the_last_blocks(real_sizes):
    plan = _plan(real_sizes, 20, 6)
    # budget for blocks: 20 − 6 − 0.77 = 13.23 GiB → block 0 (0.63), then from the last block backwards: the 40
    # single blocks (10.56) and the dual blocks 19, 18, 17 (1.90); the dual blocks 1–16 are streamed
    assert plan.resident == (0, *range(17, 60))
    assert plan.streamed == tuple(range(1, 17))
    assert plan.resident_bytes <= 14 * GIB
    assert plan.streamed_bytes / GIB == pytest.approx(10.1, abs=0.05)
    assert not plan.fully_resident


def test_cap_12_preserved_6_keeps_block_zero_and_the_last_seventeen(real_sizes):
    plan = _plan(real_sizes, 12, 6)
    assert plan.resident == (0, *range(43, 60))
    assert plan.streamed_bytes / GIB == pytest.approx(18.1, abs=0.05)


def test_the_resident_blocks_are_the_last_ones_whatever_their_sizes():
    plan = plan_residency([5, 1, 1, 3, 2], 0, 8, 0, min_resident=1)
    assert plan.resident == (0, 4) and plan.streamed == (1, 2, 3)      # 5 + 2; block 3 (3) no longer fits
    assert plan_residency([5, 1, 1, 3, 2], 0, 8, 0).resident == (1, 2, 3, 4)   # none forced: 2 + 3 + 1 + 1
    assert plan_residency([5, 1], 0, 2, 0, min_resident=1).resident == (0,)   # forced even above the budget


def test_large_cap_is_fully_resident_and_preserved_at_cap_keeps_block_zero(real_sizes):
    assert _plan(real_sizes, 80, 6).fully_resident
    plan = _plan(real_sizes, 20, 20)
    assert plan.resident == (0,)            # TeaCache reads block 0's norm outside the block: always resident
    assert len(plan.streamed) == 59


def test_more_preserved_means_fewer_resident_blocks(real_sizes):
    counts = [len(_plan(real_sizes, 20, p).resident) for p in (6, 8, 10, 12, 16)]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]


def test_tokens_and_activation_estimate():
    # 608×640 → latent 76×80 → 38×40 patches; window 9 + clean 2 frames + 2x (19×20) + 4x (4 × 10×10)
    # + 729 SigLIP + 256 text tokens
    assert framepack_tokens(608, 640, 9) == 9 * 1520 + 2 * 1520 + 380 + 400 + 729 + 256 == 18485
    act = activation_bytes(framepack_tokens(608, 640, 9))
    assert 1.5 * GIB < act < 3 * GIB
    assert activation_bytes(framepack_tokens(608, 640, 18)) > act


def test_working_set_and_warnings(real_sizes):
    act = activation_bytes(framepack_tokens(608, 640, 9))
    ok = _plan(real_sizes, 20, 6, activation_bytes=act, slot_count=2)
    assert ok.slot_bytes == 2 * real_sizes[0][1]          # slots are sized by the largest *streamed* block (dual)
    assert ok.peak_estimate <= 20 * GIB and not ok.warnings()
    tight = _plan(real_sizes, 20, 1, activation_bytes=act)
    assert tight.warnings() and "preserved memory" in tight.warnings()[0]


def test_describe_preserved_for_the_ui():
    text = describe_preserved(HUNYUAN, 20, 6, "cuda")
    assert "44/60 blocks" in text and "streamed" in text and "Warning" not in text
    assert "CPU run" in describe_preserved(HUNYUAN, 20, 6, "cpu")
    assert "blocks" in describe_preserved(TINY, 20, 6, "cuda")


def test_the_estimate_before_a_job_and_the_planner_as_it_runs_give_the_same_plan():
    """One fit rule (memory/plan.py): for the same request (cap, preserved memory, bucket and window) the estimate the
    pre-flight and the page use (memory/estimate.py, from the config alone) and the planner of the running job
    (memory/budget.py, from the packed model) keep the same blocks resident and expect the same working set."""
    from memory.budget import MemoryBudget
    from memory.estimate import nominal_models, nominal_transformer_plan
    from memory.hostpack import HostPack
    from memory.plan import Workload
    from pipeline.components import load_components

    transformer = load_components("tiny", "original").transformer
    pack = HostPack(transformer)
    blocks = [c.nbytes for c in pack.blocks]
    preserved = 1 << 20
    cap = (pack.rest.nbytes + blocks[0] + blocks[-1] // 2 + preserved) // 1024 * 1024   # the last block streamed
    for workload in (Workload(), Workload(320, 512, 5)):
        planner = MemoryBudget(cap, preserved, workload=workload).transformer_plan(transformer, pack)
        estimate = nominal_transformer_plan(TINY, cap / GIB, preserved / GIB, workload)
        assert planner == estimate
        assert planner.streamed == (len(blocks) - 1,) and planner.activation_bytes > 0
        host = next(m for m in nominal_models(TINY, "original", cap / GIB, preserved / GIB, "cuda",
                                              workload=workload) if m.name == "transformer")
        assert host.streamed == frozenset(i + 1 for i in planner.streamed)     # what the host plan streams


def test_the_estimate_sizes_fp8_computes_weights_as_the_planner_does():
    """--fp8-compute keeps the blocks' Linears in fp8 on the GPU and in RAM (memory/chunk.py): the estimate (from the
    config, `fp8_compute=True`) gives the planner's plan of the model so converted, and the host plan's chunk bytes
    are the pack's."""
    from diffusers import HunyuanVideoFramepackTransformer3DModel

    from configs.presets import PRESETS
    from memory.budget import MemoryBudget
    from memory.estimate import nominal_models, nominal_transformer_plan
    from memory.hostpack import HostPack
    from memory.plan import Workload
    from pipeline.compiled import use_fp8_compute

    transformer = HunyuanVideoFramepackTransformer3DModel(**PRESETS["tiny"].tiny_configs["transformer"]).eval()
    plain = [c.nbytes for c in HostPack.of(transformer).blocks]
    assert use_fp8_compute(transformer) > 0
    pack = HostPack.of(transformer)
    blocks = [c.nbytes for c in pack.blocks]
    assert all(a < b for a, b in zip(blocks, plain))                 # the kept weights in their own size
    preserved = 1 << 20
    cap = (pack.rest.nbytes + blocks[0] + blocks[-1] // 2 + preserved) // 1024 * 1024   # the last block streamed
    workload = Workload()
    planner = MemoryBudget(cap, preserved, workload=workload).transformer_plan(transformer, pack)
    assert planner == nominal_transformer_plan(TINY, cap / GIB, preserved / GIB, workload, fp8_compute=True)
    assert planner != nominal_transformer_plan(TINY, cap / GIB, preserved / GIB, workload)      # bf16's sizes
    assert planner.streamed == (len(blocks) - 1,)
    host = next(m for m in nominal_models(TINY, "original", cap / GIB, preserved / GIB, "cuda", workload=workload,
                                          fp8_compute=True) if m.name == "transformer")
    assert host.streamed == frozenset(i + 1 for i in planner.streamed)
    assert tuple(host.chunk_bytes) == tuple(c.host_nbytes for c in [pack.rest, *pack.blocks])


def test_the_page_says_what_fp8_compute_keeps_on_the_gpu():
    """At full size under the 20 GB cap with 6 GB preserved: 44 of 60 blocks stay resident in bf16, 56 with
    --fp8-compute (the placement the H200 run logged, BENCHMARKS.md), on the page's memory plan."""
    import torch

    from configs.runtime import Config
    from ui.context import preserved_text

    assert "(44/60 blocks)" in describe_preserved(HUNYUAN, 20, 6, "cuda")
    text = describe_preserved(HUNYUAN, 20, 6, "cuda", fp8_compute=True)
    assert "15.6 GB transformer resident (56/60 blocks), 1.7 GB streamed per step" in text, text
    page = preserved_text(HUNYUAN, Config(fp8_compute=True, vram_cap_gb=20), torch.device("cuda"), 6, 20)
    assert "(56/60 blocks)" in page


def test_a_split_share_keeps_more_and_the_largest_blocks_resident(real_sizes):
    """A share of a job split over N GPUs (pipeline/split.py) holds 1/N of the tokens in its blocks: the activations
    it does not need and the smaller streaming slots go to resident blocks (less streamed per step, never more than
    they free), and the dual blocks stay resident while the single blocks (2.4× fewer bytes for a block's compute)
    are streamed, the resident single blocks spread among them. One GPU's plan is as before."""
    from memory.plan import Workload, transformer_residency

    blocks, other = real_sizes
    plans = {n: transformer_residency(blocks, other, 20 * GIB, 6 * GIB, Workload(processes=n), 3072, 2)
             for n in (1, 2, 4)}
    assert plans[1].streamed == tuple(range(1, 17)) and plans[1].streamed_bytes == pytest.approx(10.1 * GIB, rel=0.01)
    tokens = Workload().tokens
    for n in (2, 4):
        plan = plans[n]
        assert plan.activation_bytes == activation_bytes(-(-tokens // n))
        assert plan.slot_bytes == 2 * blocks[20] < plans[1].slot_bytes               # slots for single blocks
        freed = plans[1].working_bytes - plan.working_bytes                         # activations and slots
        assert plans[1].resident_bytes < plan.resident_bytes <= 20 * GIB - 6 * GIB + freed
        assert plan.peak_estimate <= plans[1].peak_estimate             # no more than one GPU's peak
        assert set(range(20)) <= set(plan.resident)                       # every dual block
        assert min(plan.streamed) >= 20 and 59 in plan.resident
        kept = [i for i in plan.resident if i >= 20]                      # resident single blocks, spread
        assert len(kept) >= 2 and max(b - a for a, b in zip(kept, kept[1:])) <= 2 * 40 // len(kept)
    assert plans[1].streamed_bytes > plans[2].streamed_bytes > plans[4].streamed_bytes

"""The host plan's arithmetic (pure, no model loaded): any budget is obeyed or refused naming the minimum."""
from __future__ import annotations

import pytest

from common.units import GIB
from configs.presets import HUNYUAN, TINY
from memory.estimate import describe_preserved, nominal_models
from memory.hostbudget import cgroup_memory_limit, default_host_budget, job_working_bytes
from memory.hostplan import FRAMEPACK_STAGES, PER_JOB, HostBudgetError, ModelHost, StageUse, plan_host

OVERHEAD, RESERVE = int(3.0 * GIB), int(1.5 * GIB)


def _real(storage="native", cap=20, preserved=6):
    return nominal_models(HUNYUAN, "original", cap, preserved, "cuda", storage)


def _plan(models, budget_gb, sections=4):
    return plan_host(models, FRAMEPACK_STAGES, sections, int(budget_gb * GIB), OVERHEAD, RESERVE)


def _fits(plan):
    return all(plan.stage_peak(s) + plan.reserve <= plan.budget for s in plan.stages)


@pytest.mark.parametrize("storage", ["native", "fp8"])
def test_every_budget_is_obeyed_or_refused_naming_the_minimum(storage):
    models = _real(storage)
    seen_plan = seen_refusal = False
    for tenth in range(0, 640, 5):                       # 0 … 64 GB in 0.5 GB steps
        budget = tenth / 10
        try:
            plan = _plan(models, budget)
        except HostBudgetError as e:
            seen_refusal = True
            assert e.minimum > budget * GIB
            assert f"at least {e.minimum / GIB:.1f} GB" in str(e) and "--host-ram-gb" in str(e)
            continue
        seen_plan = True
        assert _fits(plan), (budget, plan.describe())
        assert plan.peak <= plan.budget - plan.reserve
    assert seen_plan and seen_refusal


def test_the_minimum_is_exact_and_is_the_streamed_part_plus_overhead():
    models = _real()
    with pytest.raises(HostBudgetError) as info:
        _plan(models, 1)
    minimum = info.value.minimum
    streamed = sum(m.chunk_bytes[i] for m in models for i in m.streamed)
    assert streamed / GIB == pytest.approx(10.1, abs=0.05)                   # 16 streamed blocks under a 20 GB cap
    assert minimum == OVERHEAD + RESERVE + streamed
    plan = plan_host(models, FRAMEPACK_STAGES, 4, minimum, OVERHEAD, RESERVE)
    # the streamed blocks stay in RAM (no stage is higher for it, and they are not re-read per section); the rest
    # is read from the files
    assert _fits(plan) and plan.persistent_bytes == plan.streamed_ram_bytes == streamed
    with pytest.raises(HostBudgetError):
        plan_host(models, FRAMEPACK_STAGES, 4, minimum - 1, OVERHEAD, RESERVE)
    fp8 = _real("fp8")
    with pytest.raises(HostBudgetError) as info:
        _plan(fp8, 1)
    assert info.value.minimum - OVERHEAD - RESERVE == pytest.approx(streamed / 2, rel=0.01)   # fp8: half


def test_more_budget_keeps_more_in_ram_and_reads_less():
    models = _real()
    held = reads = None
    for budget in (16, 20, 24, 28, 32, 40, 48):
        plan = _plan(models, budget)
        if held is not None:
            assert plan.persistent_bytes >= held and plan.file_reads_per_job <= reads
        held, reads = plan.persistent_bytes, plan.file_reads_per_job
    assert reads == 0 and held == sum(m.nbytes for m in models)           # 48 GB: everything in RAM


def test_priorities_streamed_blocks_then_per_section_models_then_encoders():
    plan = _plan(_real(), 24)
    tr = plan.model("transformer")
    homes = plan.homes("transformer")
    assert all(homes[i] == "ram" for i in tr.streamed)                       # never read from disk per section
    assert plan.homes("vae") == ("ram",)                                     # used every section
    llama = plan.model("text_encoder")                     # its rest holds no weights (memory/llama_trim.py)
    assert {h for h, b in zip(plan.homes("text_encoder"), llama.chunk_bytes) if b} == {"file"}   # 13 GB per job
    assert "ram" in homes and "file" in homes                                # part of the resident part from disk
    per_job, per_section = plan.file_reads("transformer")
    assert per_section > 0 and per_job == 4 * per_section


def test_a_streamed_chunk_read_from_the_files_needs_ram_while_its_stage_runs():
    llama = ModelHost("text_encoder", (GIB, 4 * GIB, 4 * GIB), (GIB, 4 * GIB, 4 * GIB), (0, 4 * GIB, 0), frozenset({1}))
    stages = (StageUse("text", ("text_encoder",), PER_JOB),)
    plan = plan_host([llama], stages, 1, 9 * GIB, GIB, GIB)
    assert plan.transient_bytes(stages[0]) + plan.ram_bytes() >= 4 * GIB        # chunk 1 in RAM one way or another
    with pytest.raises(HostBudgetError) as info:
        plan_host([llama], stages, 1, 5 * GIB, GIB, GIB)
    assert info.value.minimum == 6 * GIB and "text weights that must sit in RAM" in str(info.value)


def test_models_without_files_always_stay_in_ram():
    models = nominal_models(TINY, "original", 20, 6, "cuda")
    assert not any(m.file_backed for m in models)
    plan = plan_host(models, FRAMEPACK_STAGES, 2, 8 * GIB, OVERHEAD, RESERVE)
    assert plan.persistent_bytes == sum(m.nbytes for m in models) and plan.file_reads_per_job == 0
    with pytest.raises(HostBudgetError, match="no weight files"):
        plan_host(models, FRAMEPACK_STAGES, 2, OVERHEAD + RESERVE, OVERHEAD, RESERVE)


def test_the_plan_says_host_x_of_y_gb():
    plan = _plan(_real(), 24)
    assert plan.short() == f"host: {plan.peak / GIB:.1f} of 24.0 GB"
    text = plan.describe()
    assert text.startswith(plan.short()) and "pinned" in text and "per section" in text and "per job" in text
    hint = describe_preserved(HUNYUAN, 20, 6, "cuda", 24)
    assert "44/60 blocks" in hint and "Host: " in hint and " of 24.0 GB" in hint
    refused = describe_preserved(HUNYUAN, 20, 6, "cuda", 8)
    assert "Host RAM: host RAM budget 8.0 GB is too small" in refused and "at least" in refused


def test_default_budget_leaves_a_margin_and_respects_a_cgroup_limit():
    b32, why = default_host_budget(total=32 * GIB, limit=None)
    assert b32 == int(32 * GIB * 0.8) and "32.0 GB of RAM" in why and "--host-ram-gb" in why
    assert default_host_budget(total=16 * GIB, limit=None)[0] == 12 * GIB        # at least 4 GB for the OS
    assert default_host_budget(total=256 * GIB, limit=None)[0] == 240 * GIB      # at most 16 GB
    limited, why = default_host_budget(total=128 * GIB, limit=24 * GIB)
    assert limited == int(23.5 * GIB) and "cgroup" in why


def test_cgroup_limits_v1_and_v2(tmp_path):
    v2 = tmp_path / "v2"
    (v2 / "a" / "b").mkdir(parents=True)
    (v2 / "a" / "memory.max").write_text(str(24 * GIB))
    (v2 / "a" / "b" / "memory.max").write_text("max")
    assert cgroup_memory_limit("0::/a/b", v2) == 24 * GIB                     # the parent's limit applies
    v1 = tmp_path / "v1"
    (v1 / "memory" / "x").mkdir(parents=True)
    (v1 / "memory" / "x" / "memory.limit_in_bytes").write_text(str(16 * GIB))
    assert cgroup_memory_limit("4:memory:/x\n0::/", v1) == 16 * GIB
    (v1 / "memory" / "x" / "memory.limit_in_bytes").write_text("9223372036854771712")   # v1's "no limit"
    assert cgroup_memory_limit("4:memory:/x", v1) is None
    assert cgroup_memory_limit("", v1) is None


def test_job_working_set_grows_with_the_video():
    assert job_working_bytes(145, 608, 640, 9) < job_working_bytes(1800, 608, 640, 9)
    assert 0.5 * GIB < job_working_bytes(145, 608, 640, 9) < 2 * GIB

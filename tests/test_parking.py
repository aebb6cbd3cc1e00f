"""memory/parking.py: the transformer's file-homed resident blocks stay on the device between its stages; the next
transformer stage binds them instead of reading them (same results bit for bit), a VAE decode keeps its tiles and
releases the latest blocks for its room, any other stage and the job's end release them. (CPU, the tiny transformer
saved in the real layout, the GPU plan applied on the CPU.)"""
from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLHunyuanVideo

from memory.hostpack import HostPack
from memory.parking import ParkedBlocks
from memory.vae import VaeDecodePolicy, memory_estimate
from pipeline.components import load_components
from tests.model_helpers import HOST_OVERHEAD as OVERHEAD
from tests.model_helpers import (
    HUNYUAN_FP32,
    file_transformer,
    frames_hash,
    oom_above,
    resident_manager,
    step_inputs,
    two_steps,
)


def test_the_next_transformer_stage_binds_the_parked_blocks_instead_of_reading_them(saved):  # noqa: F811
    reference = load_components("tiny", "original").transformer
    inputs = step_inputs(reference, seed=7)
    expected = two_steps(reference, inputs)
    tr, pack = file_transformer(saved)
    total = sum(c.file_bytes for c in pack.chunks)
    mm = resident_manager(pack, late=True)
    with mm.stage("transformer", transformer=tr) as first:
        out = two_steps(tr, inputs)
    assert first.file_bytes == total and first.parked_bytes == 0
    assert len(mm._parked) == len(pack.chunks) and pack.intact()          # parked, yet the model is idle
    with mm.stage("VAE decode", beside_parked=True, vae=torch.nn.Linear(4, 4)):
        assert len(mm._parked) == len(pack.chunks)
    with mm.stage("transformer", transformer=tr) as second:
        again = two_steps(tr, inputs)
    assert second.file_bytes == 0 and second.parked_bytes == total      # nothing read again
    assert all(torch.equal(a, b) for a, b in zip(out, expected))
    assert all(torch.equal(a, b) for a, b in zip(again, expected))
    assert len(mm._parked) == len(pack.chunks)                           # parked again for the next section
    with mm.stage("text encoders", text_encoder=torch.nn.Linear(4, 4)):
        assert not mm._parked                                            # any other stage: released first
    with mm.stage("transformer", transformer=tr) as third:
        two_steps(tr, inputs)
    assert third.file_bytes == total and third.parked_bytes == 0
    assert mm.release_parked("test") > 0 and not mm._parked
    assert pack.intact() and all(c.home == "file" for c in pack.chunks)


def test_parking_can_be_turned_off(saved):  # noqa: F811
    tr, pack = file_transformer(saved)
    mm = resident_manager(pack, late=True)
    mm.park = False
    for _ in range(2):
        with mm.stage("transformer", transformer=tr) as rec:
            pass
        assert not mm._parked and rec.file_bytes == sum(c.file_bytes for c in pack.chunks)


def test_fit_releases_the_latest_blocks_first(saved):  # noqa: F811
    _, pack = file_transformer(saved)
    park = ParkedBlocks()
    park.park("transformer", [(i - 1, c, torch.empty(c.nbytes, dtype=torch.uint8)) for i, c in enumerate(pack.chunks)])
    sizes = [-(-c.nbytes // 512) * 512 for c in pack.chunks]
    assert park.nbytes == sum(sizes)
    keep = sum(sizes[:2]) + 1                                           # room for the rest chunk and block 0
    assert park.fit(keep) == sum(sizes[2:])
    assert park.take(pack.rest) is not None and park.take(pack.blocks[0]) is not None
    assert not park and park.kept_bytes == pack.rest.file_bytes + pack.blocks[0].file_bytes
    assert park.fit(0) == 0


def test_the_decode_keeps_its_tiles_and_takes_its_room_from_the_park(saved, monkeypatch):  # noqa: F811
    tr, pack = file_transformer(saved)
    mm = resident_manager(pack, late=False)
    with mm.stage("transformer", transformer=tr):
        pass
    parked = mm._parked.nbytes
    assert parked > 0
    keep = sum(-(-c.nbytes // 512) * 512 for c in pack.chunks[:2]) + 1     # room for the rest chunk and block 0
    seen = {}

    def room(vae, shape, available):
        seen["room"] = available
        return available - keep

    def decode(vae, z, available, conv=None):
        seen["decode"] = available
        return z
    monkeypatch.setattr(mm.vae_policy, "room", room)
    monkeypatch.setattr(mm.vae_policy, "decode", decode)
    with mm.stage("VAE decode", beside_parked=True, vae=torch.nn.Linear(4, 4)):
        mm.decode_vae(None, torch.zeros(1, 4, 2, 4, 4))
    assert seen["decode"] == seen["room"]                  # the tiles are chosen as if nothing were parked
    assert 0 < mm._parked.nbytes <= keep < parked          # the latest blocks made room, the earliest stay
    assert mm._parked.take(pack.rest) is not None and mm._parked.take(pack.blocks[0]) is not None
    assert not mm._parked


def test_room_is_the_first_tilings_peak_and_its_workspace():
    with torch.device("meta"):
        vae = AutoencoderKLHunyuanVideo().to(torch.float16)
    gib = 1 << 30
    policy = VaeDecodePolicy(streamed=True, workspace_reserve=4 * gib)
    shape = (18, 76, 80)
    first = policy.plan(vae, shape, int(19.5 * gib))[0]
    peak = memory_estimate(first, shape, 128, 2, policy.act_factor)
    assert policy.room(vae, shape, int(19.5 * gib)) == peak + 4 * gib
    assert int(19.5 * gib) - policy.room(vae, shape, int(19.5 * gib)) < 2 * gib    # little left for parking here
    small = int(9 * gib)
    assert policy.room(vae, shape, small) <= small


def test_a_job_binds_the_parked_blocks_in_its_next_section_and_gives_the_same_video(saved, tmp_path,  # noqa: F811
                                                                                   monkeypatch):
    from common.units import GIB
    from memory.hostplan import FRAMEPACK_STAGES, HostBudgetError
    from memory.manager import MemoryManager
    from pipeline.events import Done
    from pipeline.request import Request
    from tests.conftest import make_image, run_job

    comps = load_components(HUNYUAN_FP32, "original", model_dir=saved)
    tr = HostPack.of(comps.transformer)
    cap_gb = (tr.rest.nbytes + tr.blocks[0].nbytes) / GIB + 1e-6         # block 0 resident, the others streamed

    def manager(host_ram_gb, park=True):
        return MemoryManager(device="cpu", cap_gb=cap_gb, preserved_gb=0, plan_on_cpu=True, host_ram_gb=host_ram_gb,
                             host_overhead=OVERHEAD, park=park)

    with pytest.raises(HostBudgetError) as refused:
        manager(0.001).arrange_host(comps.models(), FRAMEPACK_STAGES, 1, 37)
    request = Request(image=make_image(64, 64), prompt="a paper boat on a puddle", seconds=2.2, steps=2,
                      teacache=0.0, seed=7)
    runs = {}
    for park in ("1", "0"):
        mm = manager(refused.value.minimum / GIB, park=park == "1")
        _, last = run_job(request, comps, tmp_path / park, memory=mm)
        assert isinstance(last, Done), getattr(last, "detail", last)
        sections = [r for r in mm.records if r.name == "transformer"]
        assert len(sections) >= 2 and not mm._parked                   # released when the job ended
        read = [r.file_bytes for r in sections]
        parked = [r.parked_bytes for r in sections]
        if park == "1":
            assert parked[0] == 0 and all(p > 0 for p in parked[1:])   # every later section bound them
            assert all(r < read[0] for r in read[1:])
        else:
            assert not any(parked) and len(set(read)) == 1
        runs[park] = frames_hash(last)
    assert runs["1"] == runs["0"]


def test_a_decode_that_runs_out_of_memory_releases_the_park_before_its_next_try(saved):  # noqa: F811

    tr, pack = file_transformer(saved)
    vae = load_components("tiny", "original").vae
    mm = resident_manager(pack, late=False)
    with mm.stage("transformer", transformer=tr):
        pass
    assert mm._parked
    seen, parked = [], []
    oom = oom_above(32, seen)

    def fault(tiling):
        parked.append(len(mm._parked))
        oom(tiling)
    mm.vae_policy.fault = fault
    with mm.stage("VAE decode", beside_parked=True, vae=vae), torch.no_grad():
        pixels = mm.decode_vae(vae, torch.randn(1, 16, 2, 8, 8))
    assert pixels.shape == (1, 3, 5, 64, 64) and len(seen) >= 2
    assert parked[0] == len(pack.chunks) and not any(parked[1:])     # beside the park first, then without it
    assert not mm._parked and mm.vae_policy.before_retry is None

"""Weights read from the safetensors files in place (the real repos' layout), placed by the host plan: nothing is
read at load time, every budget gives the same video, a budget too small is refused before any weight is read,
and a model's RAM really goes back after its stage (RSS of a child process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from common.units import GIB
from memory.hostpack import HostPack
from memory.hostplan import FRAMEPACK_STAGES, HostBudgetError, StageUse
from memory.manager import MemoryManager
from pipeline.components import MODEL_ROLES, load_components
from pipeline.events import Done, Failed
from pipeline.request import Request
from tests.conftest import ROOT, make_image, run_job
from tests.model_helpers import HOST_OVERHEAD as OVERHEAD
from tests.model_helpers import HUNYUAN_FP32, frames_hash, step_inputs, two_steps

RESERVE = int(1.5 * GIB)                 # configs/memory.py host_reserve_gb


def _request(**kw):
    return Request(image=make_image(96, 80), prompt="a red kite over the dunes", seconds=1.2, steps=2, teacache=0.0,
                   **kw)


def _job(saved, outputs, **memory_kw):
    comps = load_components(HUNYUAN_FP32, "original", model_dir=saved)
    mm = MemoryManager(device="cpu", host_overhead=OVERHEAD, **memory_kw)
    _, last = run_job(_request(), comps, outputs, memory=mm)
    return comps, mm, last


def test_loading_reads_no_weights(saved):
    comps = load_components(HUNYUAN_FP32, "original", model_dir=saved)
    for role in MODEL_ROLES:
        pack = HostPack.of(getattr(comps, role))
        assert pack.files is not None and pack.host_bytes == 0, role          # every chunk's home: the files
        assert all(c.home == "file" for c in pack.chunks)


def test_every_budget_gives_the_same_video(saved, tmp_path):
    _, roomy, a = _job(saved, tmp_path / "a", host_ram_gb=64)
    assert isinstance(a, Done), getattr(a, "detail", a)
    plan = roomy.host_plan
    assert plan.file_reads_per_job == 0 and plan.persistent_bytes > 0        # everything kept in RAM
    with pytest.raises(HostBudgetError) as info:            # the minimum, from the plan's own refusal
        MemoryManager(device="cpu", host_ram_gb=0.1, host_overhead=OVERHEAD).arrange_host(
            load_components(HUNYUAN_FP32, "original", model_dir=saved).models(), FRAMEPACK_STAGES, 1, 37)
    minimum = info.value.minimum
    # a CPU stage reads its file-homed weights into a buffer for the stage: the largest stage's model counts
    assert minimum == OVERHEAD + RESERVE + roomy.host_plan.model("transformer").nbytes
    comps, tight, b = _job(saved, tmp_path / "b", host_ram_gb=minimum / GIB)
    assert isinstance(b, Done), getattr(b, "detail", b)
    low = tight.host_plan
    assert low.persistent_bytes < plan.persistent_bytes and low.file_reads_per_job > 0
    for role, model in comps.models().items():                                # the packs are where the plan says
        assert HostPack.of(model).host_bytes == low.ram_bytes(role), role
    assert set(low.homes("text_encoder")) == {"file"} and sum(r.file_bytes for r in tight.records) > 0
    assert frames_hash(a) == frames_hash(b)                                  # bit-identical videos
    info = json.loads((b.job_dir / "job.json").read_text())
    assert info["memory"]["host"]["plan"]["persistent"] == low.persistent_bytes
    assert info["memory"]["host"]["plan"]["text"].startswith("host: ")


def test_streamed_blocks_from_the_files_get_ram_for_their_stage_only(saved):
    ref_tr = load_components("tiny", "original").transformer
    inputs = step_inputs(ref_tr, seed=4)
    reference = two_steps(ref_tr, inputs)
    tr = load_components(HUNYUAN_FP32, "original", model_dir=saved).transformer
    pack = HostPack.of(tr)
    cap_gb = (pack.rest.nbytes + pack.blocks[0].nbytes) / GIB
    mm = MemoryManager(device="cpu", cap_gb=cap_gb, preserved_gb=0, plan_on_cpu=True)
    with mm.stage("transformer", transformer=tr) as rec:
        assert pack.blocks[1].home == "ram" and pack.blocks[0].home == "file"   # the streamed block, for now
        out = two_steps(tr, inputs)
    assert "1/2 blocks" in rec.placement["transformer"] and rec.file_bytes > 0
    assert all(torch.equal(a, b) for a, b in zip(out, reference))
    assert all(c.home == "file" for c in pack.chunks) and pack.host_bytes == 0 and pack.intact()


def test_a_budget_too_small_fails_before_any_weight_is_read(saved, tmp_path):
    comps = load_components(HUNYUAN_FP32, "original", model_dir=saved)
    mm = MemoryManager(device="cpu", host_ram_gb=1.0, host_overhead=OVERHEAD)
    _, last = run_job(_request(), comps, tmp_path, memory=mm)
    assert isinstance(last, Failed)
    assert "host RAM budget 1.0 GB is too small" in last.message and "at least 2.0 GB" in last.message
    assert "--host-ram-gb" in last.message
    assert mm.records == []                                                   # no stage ran
    assert all(HostPack.of(m).host_bytes == 0 for m in comps.models().values())   # nothing read
    with pytest.raises(HostBudgetError) as info:
        mm.arrange_host(comps.models(), [StageUse("VAE encode", ("vae",))])
    assert info.value.minimum == OVERHEAD + RESERVE + HostPack.of(comps.vae).nbytes


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "cli", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=300)


def test_cli_refuses_a_budget_too_small_before_loading(tmp_path):
    image = tmp_path / "in.png"
    make_image(100, 100).save(image)
    # issue 33 item 8: what is missing first (the folder, then the weights), then what does not fit
    r = _cli("generate", "--image", image, "--model-dir", tmp_path / "no-models", "--out", tmp_path / "o",
             "--host-ram-gb", 0.5)
    assert r.returncode == 2 and "--model-dir: no such folder" in r.stderr and "host RAM" not in r.stderr
    models = tmp_path / "models"
    models.mkdir()
    r = _cli("generate", "--image", image, "--model-dir", models, "--out", tmp_path / "o", "--host-ram-gb", 0.5)
    assert r.returncode == 2 and "not on this computer yet" in r.stderr and "--preset tiny" in r.stderr
    assert "host RAM" not in r.stderr
    from configs.presets import get_preset

    for src in get_preset("hunyuan").sources("original").values():    # the weights' folders (their configs only)
        folder = models / src.repo / (src.subfolder or "")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text("{}")
    r = _cli("generate", "--image", image, "--model-dir", models, "--out", tmp_path / "o", "--host-ram-gb", 0.5)
    assert r.returncode == 2, r.stderr
    assert "--host-ram-gb: host RAM budget 0.5 GB is too small" in r.stderr and "at least" in r.stderr
    assert not (tmp_path / "o").exists()
    r = _cli("generate", "--image", image, "--preset", "tiny", "--out", tmp_path / "o", "--host-ram-gb", 0)
    assert r.returncode == 2 and "--host-ram-gb: must be more than 0" in r.stderr


def test_app_flags_and_the_check_at_start():
    from ui.launch import host_budget_problem, parse_args

    config = parse_args(["--host-ram-gb", "24", "--fp8"])
    assert config.host_ram_gb == 24 and config.weight_storage == "fp8"
    assert parse_args([]).host_ram_gb is None and parse_args([]).weight_storage == "native"
    with pytest.raises(SystemExit):
        parse_args(["--host-ram-gb", "-1"])
    problem = host_budget_problem(parse_args(["--host-ram-gb", "6"]), "cuda")
    assert "--host-ram-gb: host RAM budget 6.0 GB is too small" in problem and "--fp8" in problem
    assert host_budget_problem(parse_args(["--host-ram-gb", "24"]), "cuda") is None
    # issue 33 item 8: without a GPU the cap, preserved memory and --fp8 change nothing: no advice to use them
    for argv in (["--host-ram-gb", "6"], ["--host-ram-gb", "6", "--fp8"], ["--host-ram-gb", "6", "--vram-cap-gb",
                                                                              "100"]):
        cpu = host_budget_problem(parse_args(argv), "cpu")
        assert "too small" in cpu and "--preset tiny" in cpu and "--fp8" not in cpu and "preserved" not in cpu
        assert "try the app" not in cpu         # issue 44 item 8: the same line for the CLI ("try the app" was wrong there)


def test_a_model_gives_its_ram_back_after_its_stage(tmp_path):
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    llama = LlamaModel(LlamaConfig(vocab_size=263, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024))
    llama.save_pretrained(tmp_path / "text_encoder")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-m", "tests.host_rss_child", str(tmp_path / "text_encoder")], env=env,
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    rss = json.loads(r.stdout.strip().splitlines()[-1])
    size = rss["model_bytes"]
    assert size > 100e6
    assert set(rss["homes_tight"]) == {"f"} and set(rss["homes_roomy"]) == {"r"}
    mib = 2 ** 20

    def grew(a, b, kind):
        return (rss[b][kind] - rss[a][kind]) / size

    # loading reads nothing: no anonymous copy, no mapped pages
    assert grew("start", "loaded", "anon") < 0.1 and grew("start", "loaded", "file") < 0.1, rss
    # the stage reads the weights for itself (a CPU stage: into a buffer), and they are gone again after it
    assert grew("arranged in the files", "in the stage", "anon") > 0.8, rss
    assert abs(grew("arranged in the files", "after the stage", "anon")) < 0.1, rss
    assert abs(grew("arranged in the files", "after the stage", "file")) < 0.1, rss
    # kept in RAM: one anonymous copy; given back to the files: the copy is freed
    assert grew("after the stage", "kept in RAM", "anon") > 0.9, rss
    assert abs(grew("after the stage", "given back", "anon")) < 0.1, rss
    assert rss["given back"]["anon"] < rss["kept in RAM"]["anon"] - size + 16 * mib

"""`python -m rocm doctor` on a machine without GPU: runs quickly, says "no GPU", JSON parses, warnings show."""

from __future__ import annotations

import json
import time

import pytest
import torch
from rocm_helpers import run_python

DOCTOR = "import sys; from rocm.__main__ import main; sys.exit(main(sys.argv[1:]))"


def _run(*args, env=None):
    code = f"import sys; sys.argv = ['rocm'] + {list(args)!r}; " + DOCTOR
    result = run_python(code, env=env, timeout=180)
    assert result.returncode == 0, result.stderr
    return result


def _doctor(*args, env=None):
    started = time.monotonic()
    result = _run(*args, env=env)
    return result.stdout, time.monotonic() - started


GPU = torch.cuda.is_available()


def test_text_report():
    # on CPU the default skips the probe table; on a GPU we skip it explicitly to stay quick
    args = ("doctor", "--no-probe") if GPU else ("doctor",)
    out, seconds = _doctor(*args, env={"MIOPEN_FIND_TIME_LIMIT": "5", "MIOPEN_FIND_MODE": "1"})
    assert "MIOPEN_FIND_TIME_LIMIT=5: does not exist" in out and "1 is NORMAL" in out
    assert "recommendations" in out
    if GPU:
        assert "backend      cuda" in out or "backend      rocm" in out
        assert "probe table  skipped: disabled" in out and "verdicts:" in out
    else:
        assert "backend      cpu  (no GPU)" in out and "No GPU visible" in out
        assert "probe table  skipped: no GPU (--probe" in out and "no GPU: probe table skipped" not in out
        # nothing GPU-only is listed as if it applied: no conv tiers, no cuDNN/MIOpen flags, no arch source
        assert "conv tiers   not used without a GPU" in out
        assert "  fp8 attention: off here: fp8 attention needs an NVIDIA GPU" in out and "package_cudnn=" in out
        for gpu_only in ("tier 1: native", "cudnn/MIOpen enabled", "arch from", "wheel arches", "KFD arch"):
            assert gpu_only not in out, gpu_only
    assert seconds < 30


def test_json_report_with_small_probe_and_attention_shows_progress():
    result = _run("doctor", "--json", "--probe", "--small", "--attention", "--probe-timeout", "20")
    rep = json.loads(result.stdout)
    if not GPU:
        assert rep["backend"] == "cpu" and rep["gpu"]["arch"] == "cpu" and rep["environment"]["profile"] is None
        assert rep["gpu"]["arch_source"] == "torch"
    probe = rep["probe"]
    assert probe["ran"] and probe["small_shapes"] and probe["device"] == rep["backend"]
    assert {(r["tier"], r["outcome"]) for r in probe["rows"]} == {(1, "ok"), (2, "ok"), (3, "ok"), (4, "ok")}
    assert rep["conv_plan"]["tiers"] == [1, 2, 3, 4, 5]
    # progress while it works (stderr, so the JSON stays clean): one line per probe and per attention backend
    progress = [line for line in result.stderr.splitlines() if line.startswith("doctor: ")]
    assert "doctor: probe 1/8: tier 1 on small 8ch @ 16x16, 3 frames (up to 20 s)" in progress
    assert sum("doctor: probe " in line for line in progress) == 8
    assert "doctor: attention no mask: flash" in progress and "doctor: attention with mask: math" in progress
    # the attention backends, timed on the transformer's attention shape (small here), and the app's choice
    check = rep["attention"]["check"]
    assert check["ran"] and check["shape"]["head_dim"] == 128 and check["shape"]["dtype"] == "bfloat16"
    assert [c["masked"] for c in check["cases"]] == [False, True]
    for case in check["cases"]:
        assert set(case["backends"]) == {"flash", "memory-efficient", "cudnn", "math"}
        assert case["backends"]["math"]["ran"] and case["backends"]["math"]["ms"] > 0
        assert all(b["ran"] or b["reason"] for b in case["backends"].values())
        assert case["app"]["uses"] and case["app"]["ms"] > 0


def test_probe_rows_never_claim_a_verdict_the_table_did_not_write():
    from rocm.doctor import _recommendations

    rep = {"backend": "rocm", "kfd_arch": "gfx1100", "gpu": {"family": "rdna3", "arch": "gfx1100"},
           "environment": {"warnings": []}, "torch_settings": {}, "attention": {},
           "probe": {"ran": True, "rows": [{"tier": 1, "outcome": "timeout", "shape": "up block 3", "message": ""}]}}
    text = "\n".join(_recommendations(rep))
    assert "tier 1 timeout on up block 3" in text and "writes no verdicts" in text
    assert "skips that tier for that shape" not in text


def test_rdna1_probe_table_skips_tier_1(tmp_path):
    from rocm_helpers import make_topology

    from rocm.arch import DeviceFacts, detect_arch, resolve_runtime
    from rocm.conv_plan import conv_plan
    from rocm.doctor import planned_probe_tiers

    kfd = detect_arch(make_topology(tmp_path / "kfd", "gfx1010"))
    facts = DeviceFacts("rocm", "gfx1030", 0, "RX 5700 XT", 8 * 2**30, ("gfx1030",), "2.13", "6.4", None, None)
    plan = conv_plan(resolve_runtime(facts, kfd, {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}))
    tiers, skipped = planned_probe_tiers(plan, (1, 2, 3))
    assert tiers == [3] and list(skipped) == ["1", "2"] and "RDNA1 plan" in skipped["1"]
    assert "starts 3D convolutions at tier 3" in skipped["2"]          # conv3d never runs tier 2 there either
    # without the topology torch's gfx1030 (RDNA2) is planned: conv3d from tier 3 there too (item 6)
    assert planned_probe_tiers(conv_plan(resolve_runtime(facts, None, {})), (1, 2, 3))[0] == [3]


def test_rdna1_recommendation_explains_tiers():
    from rocm.doctor import _recommendations

    rep = {"backend": "rocm", "kfd_arch": "gfx1010", "gpu": {"family": "rdna1", "arch": "gfx1010",
           "wheel_has_arch": False, "wheel_arches": ["gfx1030", "gfx1100"], "total_memory_gib": 8.0},
           "environment": {"warnings": []}, "torch_settings": {"cudnn_benchmark": False},
           "attention": {"sdpa_mem_efficient_enabled": True}, "probe": {"ran": False}}
    text = "\n".join(_recommendations(rep))
    assert "tiers 2-3" in text and "MIOpen off" in text and "aperture" in text
    assert "no kernels for gfx1010" in text


def _rdna1_override_report(wheel_arches):
    return {"backend": "rocm", "kfd_arch": "gfx1010",
            "gpu": {"family": "rdna1", "arch": "gfx1010", "reported_arch": "gfx1030", "wheel_has_arch": True,
                    "wheel_arches": wheel_arches, "total_memory_gib": 8.0},
            "environment": {"warnings": []}, "torch_settings": {}, "attention": {}, "probe": {"ran": False}}


def test_rdna1_override_advice_follows_the_real_arch_in_the_wheel():
    """Issue 31, item 7: "has kernels for this arch: True" is about gfx1030 (the override); unsetting it helps only
    where the wheel has gfx101x kernels."""
    from rocm.doctor import _recommendations

    official = "\n".join(_recommendations(_rdna1_override_report(["gfx1030", "gfx1100"])))
    assert "no gfx1010 kernels" in official and "keep it" in official and "unset the override" not in official
    own_build = "\n".join(_recommendations(_rdna1_override_report(["gfx1010", "gfx1030"])))
    assert "unset the override" in own_build and "keep it" not in own_build


@pytest.mark.parametrize("gfx", ["gfx1031", "gfx1032", "gfx1103"])
def test_an_override_on_cards_reported_to_page_fault_is_warned(gfx):
    from rocm.env import check_environment

    found = [w for w in check_environment({"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}, gfx=gfx)
             if w.variable == "HSA_OVERRIDE_GFX_VERSION"]
    assert found and found[0].severity == "warning" and "page-fault" in found[0].message
    from rocm.doctor import _recommendations

    rep = _rdna1_override_report(["gfx1030"])
    rep["gpu"].update(family="rdna3" if gfx == "gfx1103" else "rdna2", arch=gfx)
    assert "page-fault inside MIOpen" in "\n".join(_recommendations(rep))


@pytest.mark.parametrize("gfx, tiers", [("gfx1100", [3]), ("gfx1030", [3]), ("gfx1201", [3]),
                                        ("gfx942", [1, 2, 3])])
def test_the_doctor_probes_only_the_tiers_the_app_uses_for_3d_convolutions(tmp_path, gfx, tiers):
    """Issue 31, item 6: on RDNA2-4 the app starts conv3d at tier 3; the doctor ran MIOpen 3D and vol2col anyway."""
    from rocm_helpers import make_topology

    from rocm.arch import DeviceFacts, detect_arch, resolve_runtime
    from rocm.conv_plan import conv_plan
    from rocm.doctor import planned_probe_tiers

    kfd = detect_arch(make_topology(tmp_path / "kfd", gfx))
    facts = DeviceFacts("rocm", gfx, 0, "AMD GPU", 24 * 2**30, (gfx,), "2.11.0+rocm7.0", "7.0", None, None)
    planned, skipped = planned_probe_tiers(conv_plan(resolve_runtime(facts, kfd, {})), (1, 2, 3))
    assert planned == tiers
    if tiers == [3]:
        assert "starts 3D convolutions at tier 3" in skipped["1"] and "starts 3D" in skipped["2"]


def _simulated_facts(reported, index=0, torch_version="2.11.0+rocm7.0", driver=None):
    from rocm.arch import DeviceFacts

    return DeviceFacts("rocm", reported, index, f"simulated {reported}", 24 << 30, ("gfx1030", "gfx1100", "gfx1201"),
                       torch_version, "7.0", None, driver)


@pytest.mark.parametrize("machine", ["windows", "wsl2", "igpu+dgpu", "igpu+dgpu selected", "rdna1+override"])
def test_the_doctor_on_simulated_machines(tmp_path, monkeypatch, machine):
    """Issue 31, "Done when": `python -m rocm doctor` under a simulated Windows (no os.uname, no KFD), WSL2 (no KFD,
    a +rocm torch), an iGPU + dGPU machine and an RDNA1 card with the override gives correct, useful output."""
    import os
    import platform

    from rocm_helpers import make_topology

    from rocm.arch import driver_version
    from rocm.doctor import collect
    from rocm.doctor_text import render_text

    env = {"STEADYFRAME_CACHE_DIR": str(tmp_path / "c")}
    nodes = tmp_path / "no-kfd"
    if machine == "windows":
        monkeypatch.delattr(os, "uname")
        monkeypatch.setattr(platform, "system", lambda: "Windows")
        monkeypatch.setattr(platform, "release", lambda: "11")
        facts = _simulated_facts("gfx1100", torch_version="2.9.0+rocm7.1", driver=driver_version("rocm"))
    elif machine == "wsl2":
        facts = _simulated_facts("gfx1100")
    elif machine.startswith("igpu"):
        nodes = make_topology(tmp_path / "kfd", "gfx1036", "gfx1100")
        if machine.endswith("selected"):
            env["HIP_VISIBLE_DEVICES"] = "1"
        facts = _simulated_facts("gfx1100" if machine.endswith("selected") else "gfx1036")
    else:
        nodes = make_topology(tmp_path / "kfd", "gfx1010")
        env["HSA_OVERRIDE_GFX_VERSION"] = "10.3.0"
        facts = _simulated_facts("gfx1030")
    rep = collect(probe=False, attention=False, topology_nodes=nodes, environ=env, device_facts=facts)
    text, recs = render_text(rep), "\n".join(rep["recommendations"])
    profile = rep["environment"]
    if machine in ("windows", "wsl2"):
        assert rep["gpu"]["arch"] == "gfx1100" and profile["profile"] == "rdna3"
        assert profile["profile_applied"] == "after torch starts (no KFD topology)"
        assert profile["profile_would_set"]["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == "1"
        assert not any(k.startswith("PYTORCH_") for k in profile["profile_would_set"])      # no allocator setting
        assert "No KFD topology (Windows, WSL2 or a container)" in recs
        if machine == "windows":
            assert rep["gpu"]["driver"] == "windows-11" and "drv-windows-11" in rep["conv_plan"]["verdict_file"]
    elif machine == "igpu+dgpu":
        assert rep["gpu"]["arch"] == "gfx1036" and "gfx1036 (integrated) <- the jobs run here, gfx1100" in text
        assert "HIP_VISIBLE_DEVICES=1" in recs
    elif machine == "igpu+dgpu selected":
        assert rep["gpu"]["arch"] == "gfx1100" and profile["profile"] == "rdna3" and "integrated GPU" not in recs
        assert "gfx1100 <- the jobs run here   selected by HIP_VISIBLE_DEVICES=1" in text
        assert profile["profile_would_set"]["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == "1"
    else:
        assert (rep["gpu"]["arch"], rep["conv_plan"]["tiers"]) == ("gfx1010", [2, 3, 5])
        assert "has kernels for gfx1030 (the ISA the override loads): True" in text
        assert "no gfx1010 kernels" in recs and "keep it" in recs and "Fix or unset" not in recs

"""One architecture, from the hardware, for the profile, the conv fallback and doctor (simulated KFD topologies).

An RX 5700 XT (gfx1010) is usually run with HSA_OVERRIDE_GFX_VERSION=10.3.0, under which torch reports gfx1030.
The KFD topology still says gfx1010, and everything must plan for that.
"""

from __future__ import annotations

import pytest
import torch
from rocm_helpers import make_topology

from rocm.arch import DeviceFacts, detect_arch, resolve_runtime
from rocm.conv_fallback import ConvFallback
from rocm.signature import ConvSpec

OVERRIDE = {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
WHEEL = ("gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1201")

# (case, KFD arch, what torch reports, environment, expected family, conv2d tier, conv3d tier)
CASES = [
    ("gfx1010", "gfx1010", "gfx1010", {}, "rdna1", 2, 3),
    ("gfx1010 + override", "gfx1010", "gfx1030", OVERRIDE, "rdna1", 2, 3),
    ("gfx1030", "gfx1030", "gfx1030", {}, "rdna2", 1, 3),
    ("gfx1100", "gfx1100", "gfx1100", {}, "rdna3", 1, 3),
    ("gfx1201", "gfx1201", "gfx1201", {}, "rdna4", 1, 3),
    ("gfx942", "gfx942", "gfx942", {}, "cdna", 1, 1),
]


def _facts(reported: str) -> DeviceFacts:
    """A simulated ROCm device, with a ROCm torch whatever build runs the tests (a CUDA one made the doctor's
    profile 'not ROCm')."""
    rocm_torch = torch.__version__.partition("+")[0] + "+rocm7.2"
    return DeviceFacts("rocm", reported, 0, f"simulated {reported}", 24 * 2**30, WHEEL, rocm_torch,
                       "6.4.43482", None, "amdgpu-6.12.12")


@pytest.mark.parametrize("case,kfd_gfx,reported,env,family,tier2d,tier3d", CASES, ids=[c[0] for c in CASES])
def test_runtime_arch_comes_from_the_kfd_topology(tmp_path, case, kfd_gfx, reported, env, family, tier2d, tier3d):
    kfd = detect_arch(make_topology(tmp_path / "kfd", kfd_gfx))
    rt = resolve_runtime(_facts(reported), kfd, env)
    assert (rt.arch, rt.family, rt.reported_arch) == (kfd_gfx, family, reported)
    assert rt.arch_source.startswith("KFD topology")
    assert rt.overridden == (reported != kfd_gfx)
    if env:
        assert "HSA_OVERRIDE_GFX_VERSION=10.3.0" in rt.arch_source and "gfx1030" in rt.arch_source
    # the wheel question is about the ISA the runtime loads kernels for: the overridden one
    assert rt.wheel_has_arch == (reported in WHEEL)


@pytest.mark.parametrize("case,kfd_gfx,reported,env,family,tier2d,tier3d", CASES, ids=[c[0] for c in CASES])
def test_conv_fallback_plans_for_the_hardware_arch(tmp_path, case, kfd_gfx, reported, env, family, tier2d,
                                                   tier3d):
    kfd = detect_arch(make_topology(tmp_path / "kfd", kfd_gfx))
    fb = ConvFallback(persist=False, probe=None, runtime_for=lambda device: resolve_runtime(_facts(reported), kfd,
                                                                                            env))
    with torch.no_grad():
        out2 = fb.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), padding=1)
        assert fb.last_tier == tier2d
        x, w = torch.randn(1, 2, 4, 5, 5), torch.randn(3, 2, 3, 3, 3)
        out3 = fb.conv3d(x, w, padding=1)
        assert fb.last_tier == tier3d
    assert out2.shape == (1, 3, 5, 5)
    torch.testing.assert_close(out3, torch.nn.functional.conv3d(x, w, padding=1), atol=1e-5, rtol=1e-5)
    sig = fb.signature("conv3d", x, w, ConvSpec("conv3d", (1, 1, 1), (1, 1, 1), (1, 1, 1), 1))
    assert sig.arch == kfd_gfx and fb.verdict(sig).ok_tier == tier3d     # verdicts are keyed by the real arch


def test_several_different_gpus_behind_a_selection_variable(tmp_path):
    kfd = detect_arch(make_topology(tmp_path / "kfd", "gfx1100", "gfx1030"), {})
    plain = resolve_runtime(_facts("gfx1030"), kfd, {})
    assert plain.arch == "gfx1100"               # device 0 = first GPU node when nothing reorders devices
    hidden = resolve_runtime(_facts("gfx1030"), kfd, {"HIP_VISIBLE_DEVICES": "1"})
    assert hidden.arch == "gfx1030" and hidden.arch_source.startswith("KFD topology")    # the variable read
    unknown = resolve_runtime(_facts("gfx1030"), kfd, {"ROCR_VISIBLE_DEVICES": "GPU-0123456789abcdef"})
    assert unknown.arch == "gfx1030" and unknown.arch_source.startswith("torch")     # a UUID the topology lacks
    nothing = resolve_runtime(_facts("gfx1030"), None, OVERRIDE)
    assert nothing.arch == "gfx1030" and "may not be the real card" in nothing.arch_source


def test_cuda_and_cpu_keep_torch_arch():
    facts = DeviceFacts("cuda", "sm_90", 0, "H100", 80 * 2**30, ("sm_90",), "2.13", None, "12.8", "nvidia-580")
    rt = resolve_runtime(facts, None, OVERRIDE)
    assert (rt.arch, rt.family, rt.arch_source, rt.overridden) == ("sm_90", None, "torch", False)


@pytest.mark.parametrize("override", [False, True])
def test_doctor_uses_the_hardware_arch_and_warns_about_the_override_on_rdna1(tmp_path, override):
    from rocm.doctor import collect
    from rocm.doctor_text import render_text

    nodes = make_topology(tmp_path / "kfd", "gfx1010")
    env = {"STEADYFRAME_CACHE_DIR": str(tmp_path / "c"), **(OVERRIDE if override else {})}
    rep = collect(probe=False, topology_nodes=nodes, environ=env,
                  device_facts=_facts("gfx1030" if override else "gfx1010"), attention=False)
    gpu = rep["gpu"]
    assert gpu["arch"] == "gfx1010" and gpu["family"] == "rdna1" and rep["conv_plan"]["tiers"] == [2, 3, 5]
    assert gpu["arch_source"].startswith("KFD topology")
    warned = [w for w in rep["environment"]["warnings"] if w["variable"] == "HSA_OVERRIDE_GFX_VERSION"]
    recs = "\n".join(rep["recommendations"])
    if override:
        assert gpu["reported_arch"] == "gfx1030" and "10.3.0" in gpu["arch_source"]
        assert warned and warned[0]["severity"] == "warning" and "crash" in warned[0]["message"]
        assert "look like gfx1030" in recs
        assert "arch from    KFD topology; HSA_OVERRIDE_GFX_VERSION=10.3.0" in render_text(rep)
    else:
        assert not warned and "look like" not in recs


def test_doctor_rdna2_plan_starts_conv3d_at_tier_3(tmp_path):
    from rocm.doctor import collect

    rep = collect(probe=False, topology_nodes=make_topology(tmp_path / "kfd", "gfx1030"),
                  environ={"STEADYFRAME_CACHE_DIR": str(tmp_path / "c")}, device_facts=_facts("gfx1030"),
                  attention=False)
    assert rep["conv_plan"]["conv3d_first_tier"] == 3 and rep["conv_plan"]["tiers"] == [1, 2, 3, 4, 5]
    assert rep["environment"]["profile"] == "rdna2"


def test_the_driver_version_needs_no_posix_call(monkeypatch):
    """Windows has no os.uname: the in-tree driver's version comes from `platform` (issue 31, item 1)."""
    import os
    import platform

    from rocm import arch

    monkeypatch.delattr(os, "uname", raising=False)
    monkeypatch.setattr(arch, "_read_first_line", lambda path: None)      # no /sys/module/amdgpu/version
    monkeypatch.setattr(platform, "system", lambda: "Windows")
    monkeypatch.setattr(platform, "release", lambda: "11")
    assert arch.driver_version("rocm") == "windows-11"
    assert arch.driver_version("cpu") is None


def test_the_arch_table_knows_gfx1250_is_not_rdna4_and_gfx1153_is_an_igpu():
    """gfx1250 (Instinct MI455X class; LLVM's 'GCN GFX12.5', not RDNA4) takes the data-centre profile; gfx1153
    (Radeon 820M) is RDNA3.5 and integrated."""
    from rocm.arch import GpuNode, arch_family

    assert [arch_family(g) for g in ("gfx1250", "gfx1251", "gfx1200", "gfx1201", "gfx1153", "gfx950")] == [
        "cdna", "cdna", "rdna4", "rdna4", "rdna3", "cdna"]
    assert GpuNode(1, "gfx1153", 110503).integrated and not GpuNode(1, "gfx1250", 120500).integrated

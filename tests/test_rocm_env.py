"""The environment profile: verified variables only, user settings win, warnings, nothing on CUDA/CPU."""

from __future__ import annotations

import os

import pytest
from rocm_helpers import UNIQUE_ID, make_topology, run_python

# Allow-list written from docs/FACTS.md (ROCm) ("Variables" table and "PyTorch on ROCm"): the variables that
# exist, and the values they accept. HSA_OVERRIDE_GFX_VERSION exists but is a debug aid the profile must never set.
FIND_MODES = {"1", "2", "3", "5", "6", "7", "NORMAL", "FAST", "HYBRID", "DYNAMIC_HYBRID", "TRUST_VERIFY",
              "TRUST_VERIFY_FULL"}
BOOL = {"0", "1", "TRUE", "FALSE", "ON", "OFF", "YES", "NO", "ENABLE", "ENABLED", "DISABLE", "DISABLED"}
ALLOWED = {
    "MIOPEN_FIND_MODE": FIND_MODES,
    "MIOPEN_FIND_ENFORCE": {"1", "2", "3", "4", "5", "NONE", "DB_UPDATE", "SEARCH", "SEARCH_DB_UPDATE", "DB_CLEAN"},
    **{f"MIOPEN_DEBUG_3D_CONV_IMPLICIT_GEMM_HIP_{d}_XDLOPS": BOOL for d in ("FWD", "BWD", "WRW")},
    **{f"MIOPEN_DEBUG_CONV_DIRECT_NAIVE_CONV_{d}": BOOL for d in ("FWD", "BWD", "WRW")},
    "MIOPEN_DEBUG_CONV_IMMED_FALLBACK": BOOL, "MIOPEN_DEBUG_FORCE_IMMED_MODE_FALLBACK": BOOL,
    "MIOPEN_DEBUG_CONV_IMPLICIT_GEMM": BOOL, "MIOPEN_DEBUG_CONV_GEMM": BOOL, "MIOPEN_DISABLE_CACHE": BOOL,
    "MIOPEN_DEBUG_DISABLE_FIND_DB": BOOL, "MIOPEN_ENABLE_LOGGING_CMD": BOOL,
    "MIOPEN_LOG_LEVEL": {str(i) for i in range(8)},
    "MIOPEN_CUSTOM_CACHE_DIR": "path",
    "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": {"1"},      # PyTorch reads only 0/1 (c10::utils::check_env)
    "PYTORCH_HIP_ALLOC_CONF": "alloc", "PYTORCH_ALLOC_CONF": "alloc", "PYTORCH_CUDA_ALLOC_CONF": "alloc",
}
# MIOPEN_USER_DB_PATH exists, but under FIND_MODE=FAST it is inert and would hide the user's own find-db.
NEVER_SET = {"HSA_OVERRIDE_GFX_VERSION", "MIOPEN_FIND_TIME_LIMIT", "MIOPEN_DEBUG_AMD_ROCM_PRECOMPILED_BINARIES",
             "MIOPEN_USER_DB_PATH"}


def _valid_alloc_conf(text: str) -> bool:
    for item in text.split(","):
        key, _, value = item.partition(":")
        if key == "max_split_size_mb" and not (value.isdigit() and int(value) >= 20):
            return False
        if key == "garbage_collection_threshold" and not 0 < float(value) < 1:
            return False
        if key == "backend" and value not in ("native", "hipMallocAsync"):
            return False
        if key not in ("max_split_size_mb", "garbage_collection_threshold", "expandable_segments", "backend"):
            return False
    return True


def _check_allowed(var: str, value: str):
    assert var not in NEVER_SET, var
    assert var in ALLOWED, f"profile sets {var}, which docs/FACTS.md does not list"
    allowed = ALLOWED[var]
    if allowed == "alloc":
        assert _valid_alloc_conf(value), value
    elif allowed != "path":
        assert value.strip().upper() in allowed, (var, value)


FAMILIES = [("gfx1010", "rdna1"), ("gfx1030", "rdna2"), ("gfx1100", "rdna3"), ("gfx1151", "rdna3"),
            ("gfx90a", "cdna"), ("gfx942", "cdna"), ("gfx950", "cdna"), ("gfx906", "unknown"), ("gfx1201", "rdna4")]
AOTRITON_GATED = {"gfx1100", "gfx1151", "gfx1201", "gfx950"}


@pytest.mark.parametrize("gfx,family", FAMILIES)
def test_profile_sets_only_verified_variables(tmp_path, gfx, family):
    nodes = make_topology(tmp_path / "kfd", gfx)
    env = {"STEADYFRAME_CACHE_DIR": str(tmp_path / "cache")}
    report = rocm_apply(env, nodes)
    assert report.applied and report.gfx == gfx and report.family == family
    assert report.set, "a ROCm profile sets something"
    for var, value in report.set.items():
        _check_allowed(var, value)
        assert env[var] == value
    assert env["MIOPEN_FIND_MODE"] == "2"      # FAST, never 1 (= NORMAL)
    folder = env["MIOPEN_CUSTOM_CACHE_DIR"]
    assert folder.startswith(str(tmp_path / "cache")) and (tmp_path / folder).is_dir()
    assert "MIOPEN_USER_DB_PATH" not in env      # inert under FAST; setting it would hide the user's find-db
    assert env.get("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL") == ("1" if gfx in AOTRITON_GATED else None)
    assert not [w for w in report.warnings if w.severity == "warning"], report.warnings


def test_profile_data_only_verified_variables():
    from configs.rocm_profiles import ALLOC_CONF_VAR, PROFILES

    assert set(PROFILES) == {"rdna1", "rdna2", "rdna3", "rdna4", "cdna", "unknown"}
    for profile in PROFILES.values():
        for var, value in profile.env.items():
            _check_allowed(var, value)
        _check_allowed(ALLOC_CONF_VAR, profile.alloc_conf)
        assert set(profile.conv_tiers) <= {1, 2, 3, 4, 5}
    assert 1 not in PROFILES["rdna1"].conv_tiers and not PROFILES["rdna1"].vendor_convs_in_decomposition
    # MIOpen has no fast 3D solver on any RDNA card (CK's 3D solvers need XDLOPS): conv3d starts at tier 3 there
    assert {f: PROFILES[f].conv3d_first_tier for f in PROFILES} == {
        "rdna1": 3, "rdna2": 3, "rdna3": 3, "rdna4": 3, "cdna": 1, "unknown": 1}


ROCM_TORCH = "2.13.0+rocm7.2"     # the simulated machines run a ROCm build, whatever build runs the tests


CUDA_TORCH = "2.13.0+cu130"       # ... or, on the NVIDIA/CPU machines they simulate, a CUDA build


def rocm_apply(env, nodes, torch_version=ROCM_TORCH):
    from rocm.env import apply_env_profile

    return apply_env_profile(env, topology_nodes=nodes, torch_version=torch_version)


def test_user_settings_win(tmp_path):
    nodes = make_topology(tmp_path / "kfd", "gfx1100")
    env = {"MIOPEN_FIND_MODE": "3", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256",
           "MIOPEN_USER_DB_PATH": str(tmp_path / "mydb"), "MIOPEN_CUSTOM_CACHE_DIR": str(tmp_path / "kc"),
           "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "0", "STEADYFRAME_CACHE_DIR": str(tmp_path / "c")}
    before = dict(env)
    report = rocm_apply(env, nodes)
    for var, value in before.items():
        assert env[var] == value
    assert "PYTORCH_HIP_ALLOC_CONF" not in env and "PYTORCH_ALLOC_CONF" not in env
    assert report.kept["MIOPEN_FIND_MODE"] == ("3", "2")
    assert report.kept["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == ("0", "1")
    assert "PYTORCH_CUDA_ALLOC_CONF" in report.kept and "MIOPEN_CUSTOM_CACHE_DIR" in report.kept
    assert "MIOPEN_USER_DB_PATH" not in report.kept          # the profile has no opinion about the user's find-db
    assert "MIOPEN_FIND_MODE" not in report.set
    found = _warned(report.warnings, "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL")
    assert found and "math kernel" in found[0].message       # 0 on gfx1100 keeps flash attention off: say so


@pytest.mark.parametrize("topology", ["missing", "cpu_only"])
def test_no_amd_gpu_sets_only_the_cuda_allocator(tmp_path, topology):
    nodes = tmp_path / "nowhere" if topology == "missing" else make_topology(tmp_path / "kfd")
    env = {"PATH": "/bin", "STEADYFRAME_CACHE_DIR": str(tmp_path / "c")}
    before = dict(env)
    report = rocm_apply(env, nodes, CUDA_TORCH)
    assert not report.applied and "CUDA or CPU" in report.skipped_reason
    assert report.set == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert env == {**before, **report.set}
    assert not (tmp_path / "c").exists()


def test_the_users_allocator_setting_wins_on_nvidia_and_the_config_can_turn_ours_off(tmp_path, monkeypatch):
    import dataclasses

    from configs.memory import MEMORY

    nodes = tmp_path / "nowhere"
    env = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}
    report = rocm_apply(env, nodes, CUDA_TORCH)
    assert env == {"PYTORCH_ALLOC_CONF": "max_split_size_mb:128"} and report.set == {}
    assert report.kept["PYTORCH_ALLOC_CONF"] == ("max_split_size_mb:128", "expandable_segments:True")
    monkeypatch.setattr("rocm.env.MEMORY", dataclasses.replace(MEMORY, cuda_expandable_segments=False))
    env = {}
    assert rocm_apply(env, nodes, CUDA_TORCH).set == {} and env == {}


def test_switch_off(tmp_path):
    env = {"STEADYFRAME_ROCM_PROFILE": "off", "STEADYFRAME_CACHE_DIR": str(tmp_path)}
    before = dict(env)
    report = rocm_apply(env, make_topology(tmp_path / "kfd", "gfx1100"))
    assert env == before and not report.applied


def _warned(warnings, var, severity="warning"):
    return [w for w in warnings if w.variable == var and w.severity == severity]


@pytest.mark.parametrize("var,value,needle", [
    ("MIOPEN_FIND_TIME_LIMIT", "30", "does not exist"),
    ("MIOPEN_FIND_MODE", "1", "NORMAL"),
    ("MIOPEN_FIND_MODE", "DYNAMIC", "not a find mode"),
    ("MIOPEN_DEBUG_AMD_ROCM_PRECOMPILED_BINARIES", "1", "removed"),
    ("MIOPEN_FIND_ENFORCE", "DB_ONLY", "no DB_ONLY"),
    ("MIOPEN_FIND_ENFORCE", "SEARCH", "auto-tuning"),
    ("MIOPEN_DEBUG_CONV_GEMM", "2", "miopenStatusInvalidValue"),
    ("MIOPEN_DEBUG_CONV_IMPLICIT_GEMM", "maybe", "use 0/1"),
    ("MIOPEN_DEBUG_CONV_GEMM", " 1", "miopenStatusInvalidValue"),       # MIOpen does not strip spaces
    ("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "true", "only 0 or 1"),
    ("MIOPEN_LOG_LEVEL", "9", "0..7"),
    ("PYTORCH_HIP_ALLOC_CONF", "max_split_size_mb:10", ">= 20"),
    ("PYTORCH_HIP_ALLOC_CONF", "garbage_collection_threshold:1.5", "between 0 and 1"),
])
def test_warnings(var, value, needle):
    from rocm.env import check_environment

    found = _warned(check_environment({var: value}), var)
    assert found and needle in found[0].message, check_environment({var: value})


def test_hsa_override_on_rdna1_warns_through_the_profile(tmp_path):
    env = {"HSA_OVERRIDE_GFX_VERSION": "10.3.0", "STEADYFRAME_CACHE_DIR": str(tmp_path / "c")}
    report = rocm_apply(env, make_topology(tmp_path / "kfd", "gfx1010"))
    found = _warned(report.warnings, "HSA_OVERRIDE_GFX_VERSION")
    assert found and "crash" in found[0].message
    assert env["HSA_OVERRIDE_GFX_VERSION"] == "10.3.0"   # the user's, kept; we only warn


@pytest.mark.parametrize("word", ["0", "1", "true", "FALSE", "On", "off", "yes", "NO", "enable", "Enabled",
                                  "disable", "DISABLED"])
def test_every_boolean_word_miopen_accepts_is_valid(word):
    from rocm.env import check_environment

    warnings = check_environment({"MIOPEN_DEBUG_CONV_GEMM": word, "MIOPEN_DISABLE_CACHE": word})
    assert warnings == []


def test_boolean_words_count_as_on_for_the_info_notes():
    from rocm.env import check_environment

    infos = check_environment({"MIOPEN_DEBUG_CONV_DIRECT_NAIVE_CONV_FWD": "yes",
                               "MIOPEN_DEBUG_CONV_IMMED_FALLBACK": "Enabled",
                               "MIOPEN_DEBUG_CONV_DIRECT_NAIVE_CONV_BWD": "off"}, gfx="gfx1100")
    assert sorted(w.variable for w in infos) == ["MIOPEN_DEBUG_CONV_DIRECT_NAIVE_CONV_FWD",
                                                 "MIOPEN_DEBUG_CONV_IMMED_FALLBACK"]
    assert all(w.severity == "info" for w in infos)


def test_no_false_alarms_and_infos():
    from rocm.env import check_environment

    clean = {"MIOPEN_FIND_MODE": "FAST", "MIOPEN_FIND_ENFORCE": "NONE", "MIOPEN_DEBUG_CONV_GEMM": "0",
             "PYTORCH_HIP_ALLOC_CONF": "garbage_collection_threshold:0.8,max_split_size_mb:512",
             "HSA_OVERRIDE_GFX_VERSION": "10.3.0", "PATH": "/bin"}
    assert check_environment(clean, gfx="gfx1030") == []
    infos = check_environment({"MIOPEN_DEBUG_3D_CONV_IMPLICIT_GEMM_HIP_FWD_XDLOPS": "0",
                               "MIOPEN_DEBUG_CONV_DIRECT_NAIVE_CONV_FWD": "1",
                               "MIOPEN_DEBUG_CONV_IMMED_FALLBACK": "1"}, gfx="gfx1100")
    assert len(infos) == 3 and all(w.severity == "info" for w in infos)
    assert "no effect on RDNA" in infos[0].message


def test_arch_parsing():
    from rocm.arch import arch_family, gfx_from_target_version

    assert [gfx_from_target_version(v) for v in (110000, 90010, 100100, 90402, 110501, 120001, 0)] == [
        "gfx1100", "gfx90a", "gfx1010", "gfx942", "gfx1151", "gfx1201", None]
    assert arch_family("gfx1100:sramecc-:xnack-") == "rdna3" and arch_family("sm_90") is None
    assert arch_family("gfx1201") == "rdna4" and arch_family("gfx1200") == "rdna4"


def test_import_rocm_does_not_import_torch():
    code = ("import sys, rocm; r = rocm.apply_env_profile({}); import configs.rocm_profiles, rocm.env; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(r.applied)")
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_torch_settings_change_nothing_on_cpu():
    import torch

    from rocm.env import apply_torch_settings

    before = torch.backends.cudnn.benchmark
    assert apply_torch_settings() == [] and torch.backends.cudnn.benchmark == before


@pytest.mark.parametrize("version, level, says", [
    ("2.10.0+rocm6.4", "info", "no-op on ROCm with PyTorch 2.10.0+rocm6.4"),
    ("2.11.0+rocm6.4", "info", "no-op"),
    ("2.11.0+rocm7.0", "warning", "takes effect with PyTorch 2.11.0+rocm7.0; on ROCm it has open hang"),
    ("2.13.1+rocm7.1", "warning", "takes effect"),
])
def test_the_expandable_segments_message_follows_the_installed_build(version, level, says):
    """Issue 31, item 8: the message says what this torch build does with it, not one fixed sentence."""
    from rocm.env import check_environment

    warnings = check_environment({"PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True"}, gfx="gfx1100",
                                 torch_version=version)
    found = [w for w in warnings if "expandable_segments" in w.message]
    assert len(found) == 1 and found[0].severity == level and says in found[0].message


def test_a_rocm_build_without_kfd_gets_no_cuda_allocator_and_its_profile_once_torch_names_the_gpu(tmp_path,
                                                                                                monkeypatch):
    """Issue 31, item 2: WSL2 / Windows / a container: no /sys/class/kfd, a +rocm torch. Before, it was taken for
    NVIDIA: no MIOpen profile, no AOTriton gate, and expandable_segments:True on ROCm."""
    import torch

    from rocm import env as rocm_env

    env = {"STEADYFRAME_CACHE_DIR": str(tmp_path / "c")}
    report = rocm_env.apply_env_profile(env, topology_nodes=tmp_path / "nowhere", torch_version="2.11.0+rocm7.0")
    assert report.set == {} and env == {"STEADYFRAME_CACHE_DIR": str(tmp_path / "c")}
    assert "ROCm build" in report.skipped_reason and "no KFD topology" in report.skipped_reason
    # after torch starts: the profile of the arch torch names, without the allocator
    process_env = {k: v for k, v in os.environ.items() if not k.startswith(("MIOPEN_", "PYTORCH_", "TORCH_ROCM"))}
    process_env["STEADYFRAME_CACHE_DIR"] = str(tmp_path / "c")
    monkeypatch.setattr(os, "environ", process_env)          # what the late profile sets stays in this test
    monkeypatch.setattr(torch.version, "hip", "7.0.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: type("P", (), {"gcnArchName": "gfx1100:sramecc-:xnack-"})())
    monkeypatch.setattr(rocm_env, "detect_arch", lambda *a: None)
    monkeypatch.setattr(rocm_env, "_LATE", [])
    changed = rocm_env.apply_torch_settings()
    late = rocm_env._LATE[0]
    assert late.family == "rdna3" and late.set.get("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL") == "1"
    assert process_env["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == "1"
    assert not any(var.startswith("PYTORCH_") for var in late.set)          # no allocator setting, ever
    assert any("applied after torch started" in line for line in changed)
    rocm_env.apply_torch_settings()
    assert len(rocm_env._LATE) == 1                                           # once per process


def test_a_ryzen_igpu_beside_an_nvidia_card_keeps_nvidias_allocator(tmp_path):
    """Issue 31, item 3 (its NVIDIA half): a gfx1036 iGPU in the KFD topology and a CUDA build of torch: the jobs run
    on the NVIDIA card, so no ROCm profile, and NVIDIA's allocator setting."""
    from rocm.env import apply_env_profile

    nodes = make_topology(tmp_path / "kfd", "gfx1036")
    env = {"STEADYFRAME_CACHE_DIR": str(tmp_path / "c")}
    report = apply_env_profile(env, topology_nodes=nodes, torch_version="2.11.0+cu130")
    assert not report.applied and "CUDA build" in report.skipped_reason and "gfx1036" in report.skipped_reason
    assert report.set == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert not any(var.startswith("MIOPEN_") for var in env)


@pytest.mark.parametrize("version, backend", [("2.11.0+rocm7.0", "rocm"), ("2.9.1+cu128", "cuda"),
                                              ("2.13.0+cpu", "cpu"), ("2.11.0", None), (None, None)])
def test_the_build_says_rocm_or_cuda(version, backend):
    from rocm.env import build_backend

    assert build_backend(version) == backend


@pytest.mark.parametrize("build, backend", [({"cuda": "13.0", "hip": None}, "cuda"),      # PyPI's Linux wheel
                                            ({"cuda": None, "hip": "7.2.26015"}, "rocm"),
                                            ({"cuda": None, "hip": None}, "cpu")])     # PyPI's macOS/Windows wheel
def test_a_build_without_a_label_is_told_by_torch_version(build, backend, tmp_path, monkeypatch):
    """PyPI's torch has no +cu tag: its torch/version.py (torch.version.cuda / .hip, read as text, torch not
    imported) decides. A CUDA build beside a Ryzen iGPU's KFD node: no ROCm profile, expandable segments."""
    import importlib.util

    from rocm.env import apply_env_profile, build_backend, installed_torch_build

    assert build_backend("2.13.0", build) == backend
    site = tmp_path / "site" / "torch"
    site.mkdir(parents=True)
    quoted = {k: repr(v) for k, v in build.items()}
    (site / "version.py").write_text(f"from typing import Optional\n__version__ = '2.13.0'\n"
                                     f"cuda: Optional[str] = {quoted['cuda']}\nhip: Optional[str] = {quoted['hip']}\n")
    (site / "__init__.py").write_text("raise ImportError('torch must not be imported here')\n")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: _spec_at(site))
    assert installed_torch_build() == build
    env = {"STEADYFRAME_CACHE_DIR": str(tmp_path / "c")}
    report = apply_env_profile(env, topology_nodes=make_topology(tmp_path / "kfd", "gfx1036"),
                               torch_version="2.13.0", torch_build=build)
    if backend == "cuda":
        assert not report.applied and "CUDA build" in report.skipped_reason
        assert report.set == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    else:
        assert report.applied and report.gfx == "gfx1036"


def _spec_at(folder):
    import importlib.machinery

    spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    return spec


IGPU_FIRST = ("gfx1036", "gfx1100")      # a Ryzen 7000 iGPU listed before a 7900 XTX


@pytest.mark.parametrize("selection, device_index, gfx", [
    ({}, None, "gfx1036"),                                             # device 0 is the iGPU: advice below
    ({"HIP_VISIBLE_DEVICES": "1"}, None, "gfx1100"),
    ({"CUDA_VISIBLE_DEVICES": "1"}, None, "gfx1036"),                  # not a HIP selector: ignored, and said
    ({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}, None, "gfx1036"),    # HIP_... wins
    ({"ROCR_VISIBLE_DEVICES": "1"}, None, "gfx1100"),
    ({"ROCR_VISIBLE_DEVICES": f"GPU-{UNIQUE_ID + 2:016x}"}, None, "gfx1100"),      # by UUID
    ({"ROCR_VISIBLE_DEVICES": "1,0", "HIP_VISIBLE_DEVICES": "1"}, None, "gfx1036"),  # HIP indexes ROCR's list
    ({}, 1, "gfx1100"),                                                # --device cuda:1
])
def test_the_profile_follows_the_gpu_the_job_runs_on(tmp_path, selection, device_index, gfx):
    """Issue 31, item 3: the profile followed KFD node 0 whatever the device-selection variables said: an iGPU
    listed before a 7900 XTX gave the RDNA2 profile and no AOTriton gate to jobs running on the 7900 XTX."""
    from rocm.env import apply_env_profile

    nodes = make_topology(tmp_path / "kfd", *IGPU_FIRST)
    env = {"STEADYFRAME_CACHE_DIR": str(tmp_path / "c"), **selection}
    report = apply_env_profile(env, topology_nodes=nodes, torch_version="2.11.0+rocm7.0", device_index=device_index)
    assert report.gfx == gfx and report.family == {"gfx1036": "rdna2", "gfx1100": "rdna3"}[gfx]
    assert (env.get("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL") == "1") == (gfx == "gfx1100")
    advice = [w.message for w in report.warnings if "integrated GPU" in w.message and "HIP_VISIBLE_DEVICES=1" in
              w.message]
    chosen = any(k in selection for k in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"))
    assert bool(advice) == (gfx == "gfx1036" and not chosen)           # the iGPU chosen by default: say so
    ignored = [w for w in report.warnings if w.variable == "CUDA_VISIBLE_DEVICES"]
    assert bool(ignored) == (selection == {"CUDA_VISIBLE_DEVICES": "1"})   # CUDA_... alone: said it is not read
    assert not ignored or "HIP_VISIBLE_DEVICES" in ignored[0].message


def test_a_farm_worker_on_another_gpu_gets_its_own_profile(tmp_path):
    """Issue 31, item 3: a farm worker inherits the app's environment, profile included; Ray gives it one GPU through
    HIP_VISIBLE_DEVICES (ray/_private/accelerators/amd_gpu.py). Its own profile replaces what the app's set (never
    what the user set)."""
    from rocm.env import apply_env_profile

    nodes = make_topology(tmp_path / "kfd", "gfx1100", "gfx1030")
    app_env = {"STEADYFRAME_CACHE_DIR": str(tmp_path / "c"), "MIOPEN_FIND_ENFORCE": "NONE"}     # the user's own
    app = apply_env_profile(app_env, topology_nodes=nodes, torch_version="2.11.0+rocm7.0")
    assert app.family == "rdna3" and app_env["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == "1"
    worker_env = dict(app_env, HIP_VISIBLE_DEVICES="1")          # Ray's AMD workers: HIP_VISIBLE_DEVICES
    worker = apply_env_profile(worker_env, topology_nodes=nodes, torch_version="2.11.0+rocm7.0")
    assert worker.family == "rdna2" and "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL" not in worker_env
    assert worker.kept == {} and worker_env["MIOPEN_FIND_ENFORCE"] == "NONE"      # the app's values were not "yours"
    assert worker_env["MIOPEN_FIND_MODE"] == "2" and worker_env["STEADYFRAME_ROCM_PROFILE_SET"]
    back = apply_env_profile(dict(worker_env, HIP_VISIBLE_DEVICES="0"), topology_nodes=nodes,
                             torch_version="2.11.0+rocm7.0")
    assert back.family == "rdna3" and back.set["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == "1"


def test_the_runtime_arch_of_a_selected_device_comes_from_the_topology():
    """Behind HIP_VISIBLE_DEVICES the topology still names the card: an RX 5700 XT (gfx1010) run with the 10.3.0
    override beside an iGPU is RDNA1, not the gfx1030 torch reports (before: torch's arch once a variable was set)."""
    from rocm.arch import ArchInfo, DeviceFacts, GpuNode, resolve_runtime

    kfd = ArchInfo("gfx1036", "rdna2", (GpuNode(1, "gfx1036", 100306), GpuNode(2, "gfx1010", 100100)), "test")
    facts = DeviceFacts("rocm", "gfx1030", 0, "AMD Radeon RX 5700 XT", 8 << 30, ("gfx1030",), "2.11.0+rocm7.0",
                        "7.0", None, None)
    rt = resolve_runtime(facts, kfd, {"HIP_VISIBLE_DEVICES": "1", "HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert (rt.arch, rt.family, rt.arch_source.startswith("KFD topology")) == ("gfx1010", "rdna1", True)


def test_the_device_option_is_read_before_the_parser():
    from configs.options import requested_device_index

    assert [requested_device_index(a) for a in (["--device", "cuda:1"], ["--device=cuda:2", "--preset", "tiny"],
                                                 ["--device", "cpu"], ["--device", "cuda"], [])] == [1, 2, None,
                                                                                                    None, None]

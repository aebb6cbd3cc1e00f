"""Verdicts expire: keyed by torch, ROCm/HIP and driver version; a timeout is probed once more on a later run
before it is trusted; doctor lists them and ``--reset`` clears them."""

from __future__ import annotations

import json
from dataclasses import replace

import torch
from rocm_helpers import run_python

from rocm.arch import Runtime
from rocm.conv_fallback import ConvFallback
from rocm.faults import Fault, FaultPlan
from rocm.probe import HangProbe
from rocm.verdicts import VerdictStore

SHAPE = (1, 4, 5, 8, 8)
BUILD = Runtime("cpu", "cpu", None, "2.13.0+cpu", None, None, "CPU", None, (), "cpu", "torch",
                driver_version="drv-1")


def _conv(fb):
    with torch.no_grad():
        fb.conv3d(torch.randn(SHAPE), torch.randn(4, 4, 3, 3, 3), padding=1)
    fb.flush()
    return fb.last_tier


def _fallback(tmp_path, build, faults=(), probe=None):
    return ConvFallback(cache_dir=tmp_path, probe=probe, fault_plan=FaultPlan(list(faults)),
                        runtime_for=lambda device: build)


def test_verdict_files_are_keyed_by_torch_hip_and_driver(tmp_path):
    assert _conv(_fallback(tmp_path, BUILD, [Fault(tier=1, kind="no_algorithm")])) == 2
    tripwire = [Fault(tier=1, kind="error")]            # tier 1 must not be tried where the verdict applies
    assert _conv(_fallback(tmp_path, BUILD, tripwire)) == 2
    for changed in (replace(BUILD, driver_version="drv-2"), replace(BUILD, torch_version="2.14.0+cpu"),
                    replace(BUILD, hip_version="7.0.1")):
        assert _conv(_fallback(tmp_path, changed)) == 1     # another driver / wheel / ROCm: learnt again
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 4 and all("drv-" in n for n in names)
    saved = json.loads((tmp_path / names[0]).read_text())
    assert saved["format"] == 3 and set(saved["build"]) == {"arch", "torch", "hip", "cuda", "driver"}


def test_a_timeout_is_confirmed_only_by_a_second_run(tmp_path):
    path = tmp_path / "v.json"
    first = VerdictStore(path)
    first.record_failure("k", 1, "probe timeout: no result after 60 s", timeout=True)
    first.record_success("k", 2)
    first.flush()
    assert first.retry_tiers("k") == set() and 1 in first.get("k").failed   # trusted for the rest of this run

    second = VerdictStore(path)                          # a later run: tier 1 is probed once more
    assert second.retry_tiers("k") == {1}
    second.record_failure("k", 1, "probe timeout: no result after 60 s", timeout=True)
    assert second.retry_tiers("k") == set() and "confirmed" in second.get("k").failed[1]
    third = VerdictStore(path)
    assert third.retry_tiers("k") == set() and 1 in third.get("k").failed and third.get("k").ok_tier == 2

    other = VerdictStore(tmp_path / "w.json")
    other.record_failure("k", 1, "probe timeout", timeout=True)
    other.flush()
    recovered = VerdictStore(tmp_path / "w.json")
    assert recovered.retry_tiers("k") == {1}
    recovered.record_success("k", 1)                     # the re-probe passed: the tier is back
    recovered.flush()
    assert VerdictStore(tmp_path / "w.json").get("k").failed == {}


def test_a_reprobe_that_passes_brings_the_tier_back(tmp_path):
    hang = FaultPlan([Fault(tier=1, kind="hang", seconds=600)])
    first = _fallback(tmp_path, BUILD, [Fault(tier=1, kind="error")],
                      probe=HangProbe(timeout_s=1.5, warmup_timeout_s=1.5, fault_plan=hang))
    with first.probing(True):
        assert _conv(first) == 2
    # a later run without the hang: tier 1 is probed again, passes, and runs
    later = _fallback(tmp_path, BUILD, probe=HangProbe(timeout_s=20))
    with later.probing(True):
        assert _conv(later) == 1
    assert [(p["tier"], p["outcome"]) for p in later.stats().probes] == [(1, "ok")]
    settled = _fallback(tmp_path, BUILD, probe=HangProbe(timeout_s=20))
    with settled.probing(True):
        assert _conv(settled) == 1
    assert settled.stats().probes == []


def test_an_unconfirmed_timeout_is_trusted_where_no_probe_runs(tmp_path):
    first = _fallback(tmp_path, BUILD, [Fault(tier=1, kind="error")],
                      probe=HangProbe(timeout_s=1.5, warmup_timeout_s=1.5,
                                      fault_plan=FaultPlan([Fault(tier=1, kind="hang", seconds=600)])))
    with first.probing(True):
        assert _conv(first) == 2
    later = _fallback(tmp_path, BUILD, [Fault(tier=1, kind="error")])   # no probing block: cannot re-test safely
    assert _conv(later) == 2 and later.fault_plan.fired() == [0]


DOCTOR = "import sys; from rocm.__main__ import main; sys.exit(main(sys.argv[1:]))"


def _doctor(tmp_path, *args):
    code = f"import sys; sys.argv = ['rocm'] + {list(args)!r}; " + DOCTOR
    # the doctor reports on the device the verdicts were made on: the CPU, also on a GPU machine
    result = run_python(code, env={"STEADYFRAME_CACHE_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def test_doctor_lists_and_resets_verdicts(tmp_path):
    folder = tmp_path / "rocm"
    fb = ConvFallback(cache_dir=folder, probe=None, fault_plan=FaultPlan([Fault(tier=1, kind="no_algorithm")]))
    assert _conv(fb) == 2
    fb.flush()
    rep, _ = _doctor(tmp_path, "doctor", "--json", "--no-probe", "--no-attention")
    files = rep["verdicts"]["files"]
    assert len(files) == 1 and files[0]["current"] and files[0]["count"] == 1
    (key, verdict), = files[0]["verdicts"].items()
    assert key.startswith("conv3d|x=1x4x5x8x8") and verdict["ok_tier"] == 2 and "1" in verdict["failed"]
    assert rep["verdicts"]["reset"] is None

    rep, _ = _doctor(tmp_path, "doctor", "--json", "--no-probe", "--no-attention", "--reset")
    assert [p.rsplit("/", 1)[-1] for p in rep["verdicts"]["reset"]] == [files[0]["file"].rsplit("/", 1)[-1]]
    assert rep["verdicts"]["files"] == [] and list(folder.glob("conv_verdicts_*")) == []
    assert _conv(ConvFallback(cache_dir=folder, probe=None)) == 1          # re-learnt from tier 1


def test_an_older_format_is_replaced_quietly(tmp_path, caplog):
    path = tmp_path / "v.json"
    path.write_text(json.dumps({"format": 2, "verdicts": {"k": {"ok_tier": 4, "failed": {"1": "old"}}}}))  # 4: CPU
    with caplog.at_level("INFO", logger="rocm.verdicts"):
        store = VerdictStore(path)
    assert store.get("k") is None                                    # expired, not trusted
    assert [r.levelname for r in caplog.records] == ["INFO"] and "older format" in caplog.text
    store.record_failure("k", 1, "vendor: new")
    assert json.loads(path.read_text())["format"] == 3               # replaced by the current format
    path.write_text("{not json")
    caplog.clear()
    with caplog.at_level("INFO", logger="rocm.verdicts"):
        VerdictStore(path)
    assert [r.levelname for r in caplog.records] == ["WARNING"]      # damaged: worth a warning


def test_the_hsa_override_keeps_its_own_verdicts(tmp_path):
    """Issue 31, item 10: a 780M (gfx1103) with HSA_OVERRIDE_GFX_VERSION=11.0.0 runs gfx1100 kernels: its verdicts
    must not be the ones learned without the override (and the other way round)."""
    from rocm.arch import DeviceFacts, resolve_runtime
    from rocm.verdicts import verdict_path

    facts = DeviceFacts("rocm", "gfx1100", 0, "AMD Radeon 780M", None, ("gfx1100",), "2.11.0+rocm7.0", "7.0",
                        None, "drv-1")
    plain = resolve_runtime(replace(facts, reported_arch="gfx1103"), None, {})
    overridden = resolve_runtime(facts, None, {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"})
    assert plain.override is None and overridden.override == "11.0.0"
    assert verdict_path(tmp_path, plain) != verdict_path(tmp_path, overridden)
    assert "hsa-11.0.0" in verdict_path(tmp_path, overridden).name
    assert verdict_path(tmp_path, replace(BUILD)) == verdict_path(tmp_path, BUILD)     # CPU/CUDA: unchanged


def test_a_probe_crash_is_confirmed_only_by_a_second_run(tmp_path):
    """Issue 31, item 10: one crashed probe child does not pin a tier as broken for good."""
    first = _fallback(tmp_path, BUILD, [Fault(tier=1, kind="error")],
                      probe=HangProbe(timeout_s=20, fault_plan=FaultPlan([Fault(tier=1, kind="crash")])))
    with first.probing(True):
        assert _conv(first) == 2
    store = VerdictStore(next(tmp_path.glob("conv_verdicts_*.json")))
    key = next(iter(store.keys()))
    assert store.retry_tiers(key) == {1}                 # unconfirmed: a later run probes tier 1 once more
    store.record_failure(key, 1, "probe crash: the child died", timeout=True)
    assert store.retry_tiers(key) == set() and "confirmed" in store.get(key).failed[1]



def test_doctor_shows_and_resets_remembered_fallbacks(tmp_path):
    """A compile failure remembered for this machine (the CPU here, as the doctor reports it) and one of another
    GPU: both listed, this machine's marked; --reset forgets them."""
    from rocm import fallbacks

    folder = tmp_path / "rocm"
    here = fallbacks.gpu_label("CPU", "cpu")
    fallbacks.remember(fallbacks.COMPILE, here, torch.__version__, "DoubleStreamBlock: RuntimeError: triton", folder)
    fallbacks.remember(fallbacks.FP8, "AMD Instinct MI300X (gfx942)", "2.13.0+rocm7.2", "rowwise: no kernel", folder)
    rep, _ = _doctor(tmp_path, "doctor", "--json", "--no-probe", "--no-attention")
    listed = {(f["feature"], f["current"]) for f in rep["verdicts"]["fallbacks"]}
    assert listed == {("compiled blocks", True), ("fp8 compute", False)}
    assert "triton" in next(f["error"] for f in rep["verdicts"]["fallbacks"] if f["current"])
    code = "import sys; sys.argv = ['rocm', 'doctor', '--no-probe', '--no-attention']; " + DOCTOR
    text = run_python(code, env={"STEADYFRAME_CACHE_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""},
                      timeout=120).stdout
    assert "compiled blocks: off on CPU (cpu)" in text and "<- this machine now" in text
    rep, _ = _doctor(tmp_path, "doctor", "--json", "--no-probe", "--no-attention", "--reset")
    assert any(p.endswith("fallbacks.json") for p in rep["verdicts"]["reset"])
    assert rep["verdicts"]["fallbacks"] == [] and fallbacks.entries(folder) == {}


def test_a_gpu_fault_fails_the_call_and_is_never_a_verdict(tmp_path):
    """Issue 40: an 'illegal memory access' in a convolution was saved as that shape's verdict, so after a restart on
    a healthy GPU the shape still ran on a slower tier. Now: the call fails with a GpuFault saying the next job tries
    again, nothing is recorded (in memory or on disk), and the next job (same process, or a restart) runs tier 1.
    Only the algorithm search's failure ('no suitable algorithm') is a verdict; another HIP error or an OOM moves on
    for this process only."""
    import pytest

    from rocm.errors import GpuFault, classify_error

    fb = _fallback(tmp_path, BUILD, [Fault(tier=1, kind="illegal_access", times=1)])
    with pytest.raises(GpuFault, match="next job tries this convolution again.*illegal memory access"):
        _conv(fb)
    assert list(tmp_path.iterdir()) == [] or all(not json.loads(p.read_text()).get("verdicts")
                                                 for p in tmp_path.iterdir())
    assert _conv(fb) == 1                                   # the next job, same process: tier 1 again, and it works
    assert _conv(_fallback(tmp_path, BUILD)) == 1           # after a restart too
    # the kinds: a fault, a verdict, a library error held for this process only
    assert classify_error(RuntimeError("CUDA error: an illegal memory access was encountered")) == "fault"
    assert classify_error(RuntimeError("HIP error: unspecified launch failure")) == "fault"
    assert classify_error(RuntimeError("miopenStatusUnknownError")) == "vendor"
    assert classify_error(RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")) == "vendor"
    assert classify_error(RuntimeError("HIP error: invalid device function")) == "library"
    oom = _fallback(tmp_path / "oom", BUILD, [Fault(tier=1, kind="hip_oom")])
    assert _conv(oom) == 2 and _conv(_fallback(tmp_path / "oom", BUILD)) == 1     # not kept for later runs


def test_a_gpu_fault_in_the_probe_child_fails_the_job_and_saves_nothing(tmp_path):
    """The hang probe's child faults (an illegal memory access) on tier 1: the job stops with the GpuFault's
    message, no verdict is written, and the next probe starts a new child and runs tier 1 again."""
    import pytest

    from rocm.errors import GpuFault

    probe = HangProbe(timeout_s=20, fault_plan=FaultPlan([Fault(tier=1, kind="illegal_access")]))
    first = _fallback(tmp_path, BUILD, probe=probe)
    with first.probing(True), pytest.raises(GpuFault, match="next job tries this convolution again"):
        _conv(first)
    assert not any(json.loads(p.read_text()).get("verdicts") for p in tmp_path.glob("conv_verdicts_*.json"))
    later = _fallback(tmp_path, BUILD, probe=HangProbe(timeout_s=20))
    with later.probing(True):
        assert _conv(later) == 1

"""Hang probe: child processes with timeouts; hangs are cut, crashes survived, verdicts recorded."""

from __future__ import annotations

import sys
import time

import pytest
import torch
from rocm_helpers import live_group_members

from rocm.conv_fallback import ConvFallback
from rocm.faults import Fault, FaultPlan
from rocm.probe import HangProbe, ProbeJob
from rocm.signature import ConvSignature
from tests.server_helpers import wait_for

SHAPE = (1, 4, 5, 8, 8)


def _sig(shape=SHAPE, arch="cpu"):
    return ConvSignature("conv3d", shape, (4, 4, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1, "float32", "cpu",
                         arch)


def test_ok_and_miopen_error_in_one_child():
    plan = FaultPlan([Fault(tier=1, kind="miopen_unknown")])
    probe = HangProbe(timeout_s=20, fault_plan=plan)
    results = probe.run([ProbeJob(_sig(), 1), ProbeJob(_sig(), 2), ProbeJob(_sig(), 3)])
    assert [r.outcome for r in results] == ["error", "ok", "ok"]
    assert "miopenStatusUnknownError" in results[0].message
    assert len(probe.last_pids) == 1


@pytest.mark.parametrize("timeout_s", [1.5])
def test_hang_is_cut_within_timeout_and_leaves_no_process(timeout_s):
    plan = FaultPlan([Fault(tier=1, kind="hang", seconds=600, grandchild=True)])
    probe = HangProbe(timeout_s=timeout_s, fault_plan=plan, warmup_timeout_s=timeout_s)
    started = time.monotonic()
    results = probe.run([ProbeJob(_sig(), 1), ProbeJob(_sig(), 2)])
    wall = time.monotonic() - started
    assert [r.outcome for r in results] == ["timeout", "ok"]     # the next job ran in a fresh child
    assert timeout_s <= results[0].elapsed_s <= timeout_s + 1.0
    assert wall < 30
    assert len(probe.last_pids) == 2
    for pgid in probe.last_pids:                                  # child and grandchild are gone
        assert live_group_members(pgid) == []


def test_crash_is_a_verdict_and_the_rest_continues():
    plan = FaultPlan([Fault(tier=1, kind="crash")])
    results = HangProbe(timeout_s=20, fault_plan=plan).run([ProbeJob(_sig(), 1), ProbeJob(_sig(), 2)])
    assert [r.outcome for r in results] == ["crash", "ok"]
    assert "code" in results[0].message
    assert results[0].is_verdict


def test_fallback_probes_first_use_and_persists(tmp_path):
    probe = HangProbe(timeout_s=1.5, warmup_timeout_s=1.5,
                      fault_plan=FaultPlan([Fault(tier=1, kind="hang", seconds=600)]))
    # in-process tier 1 is a tripwire: if the fallback tried it after the probe's timeout, this would raise
    tripwire = FaultPlan([Fault(tier=1, kind="error")])
    fb = ConvFallback(cache_dir=tmp_path, probe=probe, fault_plan=tripwire)
    x, w = torch.randn(SHAPE), torch.randn(4, 4, 3, 3, 3)
    with torch.no_grad(), fb.probing(True):
        out = fb.conv3d(x, w, padding=1)
        fb.conv3d(x, w, padding=1)            # second use: verdict known, no new probe
    assert fb.last_tier == 2 and torch.equal(out, torch.nn.functional.conv3d(x, w, padding=1))
    probes = fb.stats().probes
    assert [(p["tier"], p["outcome"]) for p in probes] == [(1, "timeout"), (2, "ok")]

    # a later run: the timeout is probed once more before it is trusted; it hangs again -> confirmed
    again = ConvFallback(cache_dir=tmp_path,
                         probe=HangProbe(timeout_s=1.5, warmup_timeout_s=1.5, fault_plan=probe.fault_plan),
                         fault_plan=tripwire)
    with torch.no_grad(), again.probing(True):
        again.conv3d(x, w, padding=1)
    assert again.last_tier == 2
    assert [(p["tier"], p["outcome"]) for p in again.stats().probes] == [(1, "timeout")]   # tier 2 known: no probe

    fresh = ConvFallback(cache_dir=tmp_path, probe=HangProbe(timeout_s=1.5), fault_plan=tripwire)
    with torch.no_grad(), fresh.probing(True):
        fresh.conv3d(x, w, padding=1)
    assert fresh.last_tier == 2 and fresh.stats().probes == []   # straight to tier 2, no probe, no tier 1


def test_one_warm_child_per_probing_block(tmp_path):
    probe = HangProbe(timeout_s=20)
    fb = ConvFallback(cache_dir=tmp_path, probe=probe)
    with torch.no_grad(), fb.probing(True):
        for frames in (3, 4, 5):
            fb.conv3d(torch.randn(1, 4, frames, 8, 8), torch.randn(4, 4, 3, 3, 3), padding=1)
    assert [p["outcome"] for p in fb.stats().probes] == ["ok"] * 3
    assert len(probe.last_pids) == 1
    wait_for(lambda: live_group_members(probe.last_pids[0]) == [], timeout=10,      # killed: on a busy machine a
             what="the probe child's group to be gone")                          # member may take a moment to die


def test_probing_is_off_outside_rocm_by_default(tmp_path):
    fb = ConvFallback(cache_dir=tmp_path, probe=HangProbe(timeout_s=1))
    with torch.no_grad(), fb.probing():                 # enabled=None: ROCm only; this is CPU
        fb.conv3d(torch.randn(SHAPE), torch.randn(4, 4, 3, 3, 3), padding=1)
    assert fb.stats().probes == [] and fb.last_tier == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_probe_on_gpu():
    sig = ConvSignature("conv3d", (1, 64, 7, 34, 34), (64, 64, 3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1), 1,
                        "float16", "cuda", "gpu")
    plan = FaultPlan([Fault(tier=1, kind="hang", seconds=600)])
    probe = HangProbe(timeout_s=3, warmup_timeout_s=3, fault_plan=plan)
    results = probe.run([ProbeJob(sig, t) for t in (1, 2, 3, 4, 5)], device="cuda")
    assert [r.outcome for r in results] == ["timeout", "ok", "ok", "ok", "ok"]


APP = """
import sys, threading, time
from rocm.faults import Fault, FaultPlan
from rocm.probe import HangProbe, ProbeJob
from rocm.signature import ConvSignature
sig = ConvSignature("conv3d", (1, 4, 5, 8, 8), (4, 4, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1, "float32",
                    "cpu", "cpu")
probe = HangProbe(timeout_s=600, fault_plan=FaultPlan([Fault(tier=1, kind="hang", seconds=600, grandchild=True)]))
threading.Thread(target=probe.run, args=([ProbeJob(sig, 1)],), daemon=True).start()
while not probe.last_pids:
    time.sleep(0.05)
print(probe.last_pids[0], flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_probe_child_dies_with_the_app(sig):
    """Kill the app while its probe child hangs in a 'GPU call' (with a grandchild): nothing of the probe stays."""
    import os
    import signal
    import subprocess
    import sys

    from rocm_helpers import REPO

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    app = subprocess.Popen([sys.executable, "-c", APP], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        pgid = int(app.stdout.readline())
        deadline = time.monotonic() + 60
        while not _hang_started(pgid):                   # the child is inside its hung 'GPU call'
            assert time.monotonic() < deadline, "the probe child never reached its hang"
            time.sleep(0.1)
        app.send_signal(getattr(signal, sig))
        app.wait(10)
        deadline = time.monotonic() + 10
        while live_group_members(pgid):
            assert time.monotonic() < deadline, f"probe processes outlived the app: {live_group_members(pgid)}"
            time.sleep(0.1)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()


def test_undecided_probe_fails_with_advice_and_never_runs_the_tier_in_process(tmp_path):
    """A child that never becomes ready (a wedged GPU): no verdict, no in-process run of that tier."""
    from rocm.errors import ProbeUndecided, classify_error

    stuck = tmp_path / "python"
    stuck.write_text("#!/bin/sh\nexec sleep 60\n")
    stuck.chmod(0o755)
    probe = HangProbe(timeout_s=5, startup_timeout_s=1.0, python=str(stuck))
    tripwire = FaultPlan([Fault(tier=t, kind="error") for t in (1, 2, 3, 4, 5)])   # any in-process tier would raise
    fb = ConvFallback(cache_dir=tmp_path / "cache", probe=probe, fault_plan=tripwire)
    started = time.monotonic()
    with torch.no_grad(), fb.probing(True), pytest.raises(ProbeUndecided) as info:
        fb.conv3d(torch.randn(SHAPE), torch.randn(4, 4, 3, 3, 3), padding=1)
    assert time.monotonic() - started < 30
    message = str(info.value)
    assert "will not run this convolution inside the app" in message
    assert "python -m rocm doctor" in f"ProbeUndecided: {message}"[:300]          # what the app shows
    assert "did not become ready" in message
    assert classify_error(info.value) is None            # not a tier failure: the job fails with this advice
    assert tripwire.fired() == [0] * 5 and fb.stats().total_calls == 0
    assert fb.verdict(fb.signature("conv3d", torch.randn(SHAPE), torch.randn(4, 4, 3, 3, 3), _spec())) is None
    assert fb.current is None
    assert [live_group_members(p) for p in probe.last_pids] == [[]]


def _hang_started(pgid: int) -> bool:
    import psutil

    for pid in live_group_members(pgid):
        try:
            if "time.sleep(3600)" in " ".join(psutil.Process(pid).cmdline()):
                return True
        except psutil.Error:
            continue
    return False


def _spec():
    from rocm.signature import ConvSpec

    return ConvSpec("conv3d", (1, 1, 1), (1, 1, 1), (1, 1, 1), 1)


def _failing_python(tmp_path, last):
    """A "python" whose probe child dies while starting, its traceback ending in `last`."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n"
                      "echo 'Traceback (most recent call last):' >&2\n"
                      "echo '  File \"rocm/probe_child.py\", line 1, in <module>' >&2\n"
                      "echo '    torch.cuda.init()' >&2\n"
                      "echo '    ^^^^^^^^^^^^^^^^^' >&2\n"
                      f"echo '{last}' >&2\n"
                      "exit 1\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.skipif(sys.platform == "win32", reason="the fake interpreter is a POSIX shell script")
def test_an_out_of_memory_at_child_start_is_memory_not_a_wedged_gpu(tmp_path):
    """Issue 31, item 5: the child starts inside the VAE decode when the cap is full; HIP's context creation then
    fails with out-of-memory. Before: 'inconclusive' (the job stopped with "the GPU may be wedged") and the message
    was the first 160 characters of the traceback."""
    from rocm.probe import HangProbe, ProbeJob
    from rocm.signature import ConvSignature

    sig = ConvSignature("conv3d", (1, 4, 5, 8, 8), (4, 4, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1, "float32",
                        "cpu", "cpu")
    oom = "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 64.00 MiB"
    result = HangProbe(python=_failing_python(tmp_path, oom)).run([ProbeJob(sig, 1)], device="cpu")[0]
    assert result.outcome == "oom" and result.message.endswith(oom) and "^^^" not in result.message
    other = "RuntimeError: HIP error: invalid device function"
    result = HangProbe(python=_failing_python(tmp_path, other)).run([ProbeJob(sig, 1)], device="cpu")[0]
    assert result.outcome == "inconclusive" and result.message.endswith(other)


def test_a_slow_first_compile_is_not_a_hang():
    """Issue 31, item 4: MIOpen JIT-compiles a conv's kernels at its first use (minutes on an empty kernel cache,
    after an upgrade). The probe runs the conv once under its long warm-up limit, then times the second run. Before,
    the compile counted against the timeout and the shape went to the CPU for good."""
    compile_once = FaultPlan([Fault(tier=3, kind="hang", seconds=2.5, times=1)])    # the first run only
    probe = HangProbe(timeout_s=1.5, warmup_timeout_s=30, fault_plan=compile_once)
    result = probe.run([ProbeJob(_sig(), 3)])[0]
    assert result.outcome == "ok" and result.warmup_s >= 2.5 and result.elapsed_s < 1.5
    hung = HangProbe(timeout_s=1.5, warmup_timeout_s=2.0, fault_plan=FaultPlan([Fault(tier=3, kind="hang",
                                                                                        seconds=600)]))
    result = hung.run([ProbeJob(_sig(), 3)])[0]
    assert result.outcome == "timeout" and "first run" in result.message and 2.0 <= result.elapsed_s < 4


def test_a_tier_3_timeout_on_rdna_leaves_conv3d_on_the_gpu(tmp_path):
    """RDNA2-4's plan (conv3d from tier 3): a probe timeout in tier 3 is followed by tier 4 (MIOpen off, GPU), not
    the CPU (before, the only tier after 3)."""
    probe = HangProbe(timeout_s=1.5, warmup_timeout_s=1.5,
                      fault_plan=FaultPlan([Fault(tier=3, kind="hang", seconds=600)]))
    fb = ConvFallback(conv3d_first_tier=3, cache_dir=tmp_path, probe=probe)
    with torch.no_grad(), fb.probing(True):
        fb.conv3d(torch.randn(SHAPE), torch.randn(4, 4, 3, 3, 3), padding=1)
    assert fb.last_tier == 4
    assert [(p["tier"], p["outcome"]) for p in fb.stats().probes] == [(3, "timeout"), (4, "ok")]


def test_a_job_starts_the_probe_child_before_the_gpu_fills(tmp_path):
    """Issue 31, item 5: the child started lazily inside the VAE decode, when parked blocks and tiles filled the cap
    (a second HIP context then did not fit). ``warm_probe`` (held by the job from its start) starts it at once and
    keeps it for every decode of the job; where no probe runs it starts nothing."""
    probe = HangProbe(timeout_s=20)
    fb = ConvFallback(cache_dir=tmp_path, probe=probe)
    with fb.warm_probe("cpu"):                           # CPU: no probe there, nothing starts
        assert probe.last_pids == []
    with fb.warm_probe("cpu", enabled=True):
        assert len(probe.last_pids) == 1 and live_group_members(probe.last_pids[0])   # before any convolution
        for frames in (3, 4):                             # two decodes, each in its own probing block
            with torch.no_grad(), fb.probing(True):
                fb.conv3d(torch.randn(1, 4, frames, 8, 8), torch.randn(4, 4, 3, 3, 3), padding=1)
    assert [p["outcome"] for p in fb.stats().probes] == ["ok", "ok"]
    assert len(probe.last_pids) == 1                      # one child for the job's decodes, gone at the end (its group
    wait_for(lambda: live_group_members(probe.last_pids[0]) == [], timeout=10,      # killed: its members may take
             what="the probe child's process group to end")                        # a moment to end on a busy machine)

"""Child process of the hang probe (``python -m rocm.probe_child``): runs convolution jobs, one report per line.

Protocol, one JSON object per line. stdin: first ``{"device": "cuda:0"}``, then one job per line
``{"signature": {...}, "tier": N, "vendor_in_decomposition": bool}``; EOF ends the child. stdout: ``SFPROBE {json}``
lines: ``ready`` once torch and the GPU are initialised, then ``start``/``warm``/``done`` per job, ``finished`` at
EOF. A GPU job runs twice: the first run (reported by ``warm``) includes the kernels' first JIT compile (MIOpen
compiles a solver's kernels at first use, for minutes after a PyTorch or ROCm upgrade, when its kernel cache is
empty), which the parent gives a long limit of its own; the second is the one the probe's timeout measures. The
child stays warm between jobs (torch imported, GPU initialised, kernels compiled), so a probe costs about twice
the convolution itself. The fault-injection plan comes from ``STEADYFRAME_CONV_FAULTS``.

The child must not outlive the app, even when the app is killed (SIGKILL, SIGTERM) while the child is stuck in a
GPU call that nothing can interrupt. The parent hands the child the read end of a pipe (its fd number in
``STEADYFRAME_PROBE_LIFELINE``) and keeps the only write end; before anything else the child forks a tiny
*reaper* that blocks reading it. When the app dies, for whatever reason, the kernel closes the write end, the read
returns end-of-file and the reaper SIGKILLs the child's whole process group (the child, anything it started, and
itself). The reaper carries PR_SET_PDEATHSIG (Linux), so it also goes when the child exits on its own.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from common.environment import read_environment
from configs.rocm_profiles import CPU
from rocm.errors import classify_error
from rocm.faults import FaultPlan
from rocm.signature import ConvSignature

PREFIX = "SFPROBE "
_PR_SET_PDEATHSIG = 1       # linux/prctl.h


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL): this process is killed when the thread that forked it exits (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _reap_when_parent_dies(fd: int, child: int) -> None:
    """The reaper's whole life: wait for the lifeline to close, then kill the process group."""
    _die_with_parent()
    if os.getppid() != child:        # the probe child is gone already
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):            # let go of the child's pipes, so its parent sees their EOF when it exits
        os.dup2(devnull, std)
    while True:
        try:
            if not os.read(fd, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os.killpg(os.getpgid(0), signal.SIGKILL)


def start_reaper(environ=os.environ) -> int | None:
    """Fork the reaper (call first, while single-threaded); returns its pid, None without a lifeline."""
    value = read_environment(environ).probe_lifeline
    if not value or os.name != "posix":
        return None
    fd = int(value)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            _reap_when_parent_dies(fd, me)
        finally:
            os._exit(0)
    os.close(fd)
    return pid


def emit(event: dict) -> None:
    sys.stdout.write(PREFIX + json.dumps(event) + "\n")
    sys.stdout.flush()


def output_shape(sig) -> tuple[int, ...]:
    n, c_out = sig.input_shape[0], sig.weight_shape[0]
    sizes = []
    for size, k, s, p, d in zip(sig.input_shape[2:], sig.weight_shape[2:], sig.stride, sig.padding, sig.dilation):
        sizes.append((size + 2 * p - d * (k - 1) - 1) // s + 1)
    return (n, c_out, *sizes)


def run_job(job: dict, device, plan) -> dict:
    import torch

    from rocm import tiers

    sig = ConvSignature.from_dict(job["signature"])
    dtype = getattr(torch, sig.dtype)
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(sig.input_shape, generator=gen).to(device, dtype)
    fan_in = max(1, sig.weight_shape[1] * int(torch.tensor(sig.weight_shape[2:]).prod()))
    w = (torch.randn(sig.weight_shape, generator=gen) / fan_in ** 0.5).to(device, dtype)
    b = torch.zeros(sig.weight_shape[0]).to(device, dtype) if sig.bias else None
    if plan:
        plan.check(job["tier"], sig.base_op, sig.direction, sig.input_shape, in_child=True)
    vendor = job.get("vendor_in_decomposition", True)
    if sig.direction == "backward":
        grad = torch.randn(output_shape(sig), generator=gen).to(device, dtype)
        tiers.backward(job["tier"], sig.spec, x, w, b, grad, (True, True, b is not None),
                       vendor_in_decomposition=vendor)
    else:
        tiers.forward(job["tier"], sig.spec, x, w, b, vendor_in_decomposition=vendor)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"ok": True}


def main() -> int:
    start_reaper()
    header = json.loads(sys.stdin.readline())
    import torch


    plan = FaultPlan.from_env()
    device = torch.device(header.get("device", "cpu"))
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)
    emit({"event": "ready"})
    index = 0
    while True:
        line = sys.stdin.readline()
        if not line:
            break
        if not line.strip():
            continue
        job = json.loads(line)
        emit({"event": "start", "index": index})
        started = time.perf_counter()
        try:
            if job["tier"] != CPU:       # the untimed first run: kernels compiled, caches filled
                run_job(job, device, plan)
                emit({"event": "warm", "index": index, "elapsed_s": time.perf_counter() - started})
                started = time.perf_counter()
            result = run_job(job, device, plan)
        except Exception as exc:  # every failure is reported to the parent, which classifies it
            kind = classify_error(exc)
            result = {"ok": False, "kind": kind or "other", "message": f"{type(exc).__name__}: {exc}"[:500]}
        result.update(event="done", index=index, elapsed_s=time.perf_counter() - started)
        emit(result)
        index += 1
        if device.type == "cuda":
            torch.cuda.empty_cache()
    emit({"event": "finished"})
    return 0


if __name__ == "__main__":
    sys.exit(main())

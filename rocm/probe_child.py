"""Child process of the hang probe (``python -m rocm.probe_child``): runs convolution jobs, one report per line.

Protocol, one JSON object per line. stdin: first ``{"device": "cuda:0"}``, then one job per line
``{"signature": {...}, "tier": N, "vendor_in_decomposition": bool}``; EOF ends the child. stdout: ``SFPROBE {json}``
lines: ``ready`` once torch and the GPU are initialised, then ``start``/``done`` per job, ``finished`` at EOF.
The child stays warm between jobs (torch imported, GPU initialised, MIOpen kernels compiled), so a probe costs
about the convolution itself. The fault-injection plan comes from ``STEADYFRAME_CONV_FAULTS``.
"""

from __future__ import annotations

import json
import sys
import time

PREFIX = "SFPROBE "


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
    from rocm.signature import ConvSignature

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
    header = json.loads(sys.stdin.readline())
    import torch

    from rocm.errors import classify_error
    from rocm.faults import FaultPlan

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

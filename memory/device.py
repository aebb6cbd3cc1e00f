"""The one device of a process: `--device` (app, CLI, farm workers) checked before any model loads.

`chosen_device(name)` turns `--device` into the torch device every job of the process runs on, and makes it the
current CUDA/HIP device, so that everything that says just "cuda" (the models' loading, the pipeline's tensors, the
memory layer, the ROCm layer's checks) means that GPU too, not GPU 0. An unknown or unavailable device is an
InputError naming what this machine has (the command line exits 2, the app does not start). Only torch is imported
here: the check answers in the time torch takes to import, before diffusers and the models.
"""
from __future__ import annotations

import torch

from common.errors import InputError

FIELD = "--device"


def default_device() -> torch.device:
    """The GPU when there is one (ROCm shows up as "cuda"), else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def available_devices() -> list[str]:
    """What this machine offers, as --device accepts it: 'cpu', 'cuda:0 (NVIDIA H100 80GB HBM3)', 'mps', ..."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    return found


def _refuse(name: str | None, why: str) -> InputError:
    build = ("ROCm/HIP " + torch.version.hip if torch.version.hip else "CUDA " + torch.version.cuda
             if torch.version.cuda else "CPU-only")
    return InputError(FIELD, f"{name!r} {why}; this machine has: {', '.join(available_devices())} (PyTorch "
                             f"{torch.__version__}, {build} build). Pass one of those, or leave --device out")


def chosen_device(name: str | None) -> torch.device:
    """The device of `--device` (None or "": the default), checked, and made current when it is a GPU. Raises
    InputError (what is there) for an unknown or unavailable one."""
    if not name:
        device = default_device()
    else:
        try:
            device = torch.device(name)
        except (RuntimeError, ValueError):
            raise _refuse(name, "is not a device name (cpu, cuda or cuda:N)") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise _refuse(name, "needs a GPU that this PyTorch can use, and it sees none")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise _refuse(name, f"is GPU {index}, but there are only {torch.cuda.device_count()}")
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if device.type == "mps":
        raise _refuse(name, "is Apple's GPU, which SteadyFrame's pipeline does not run on"
                      + ("" if "mps" in available_devices() else " (and this machine has none)"))
    raise _refuse(name, f"is a {device.type} device, which SteadyFrame does not run on")

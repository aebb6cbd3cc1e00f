#!/usr/bin/env python3
"""Installs SteadyFrame into the Python environment that runs this script (Linux, Windows, macOS).

    python scripts/install.py              # the app (`pip install -e .`)
    python scripts/install.py --dev        # the app + test tools (`pip install -e .[dev]`)
    python scripts/install.py --dry-run    # what it found and what it would run; runs nothing

PyTorch comes first: an installed torch (any build) is always kept. With none installed, the build is picked for
the machine from one table, WHEELS below: (OS, GPU vendor and family, driver) -> (wheel index, torch pin), each row
naming its source. `--torch cpu|cuda|rocm` overrides the pick, `--torch keep` installs none. Then the project itself
(editable); a stamp in the environment makes a second run with nothing changed a no-op. `bash scripts/install.sh`
runs this script.

Standard library only: it runs before anything is installed (it never imports torch or the project).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent

TORCH = "2.13.0"                      # the PyTorch the project is tested with (pyproject.toml's torch==2.13)
PYTORCH_WHL = "https://download.pytorch.org/whl/"
CPU_INDEX = PYTORCH_WHL + "cpu"
PYPI = "https://pypi.org/simple"
# AMD's PyTorch wheels built by TheRock: one index for every GPU, the card picked by an extra
# (`torch[device-gfx1100]`). The release channel is repo.amd.com; rocm.nightlies.amd.com carries nightlies only.
THEROCK_RELEASE_INDEX = "https://repo.amd.com/rocm/whl-multi-arch/"
THEROCK_NIGHTLY_INDEX = "https://rocm.nightlies.amd.com/whl-multi-arch/"
THEROCK_RELEASES = "https://github.com/ROCm/TheRock/blob/main/RELEASES.md"
# ROCm inside WSL2 needs AMD's WSL support (Adrenalin driver on Windows, ROCm + librocdxg inside WSL).
WSL_ROCM_GUIDE = "https://rocm.docs.amd.com/projects/radeon-ryzen/en/latest/docs/install/installrad/wsl/howto_wsl.html"
KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
PROC_NVIDIA = Path("/proc/driver/nvidia/gpus")
WSL_NVIDIA_SMI = "/usr/lib/wsl/lib/nvidia-smi"       # where WSL2 puts the Windows driver's nvidia-smi
GUARD = ('import torch; print("install: torch", torch.__version__, "| CUDA/HIP:", '
         'torch.version.cuda or torch.version.hip or "none")')
BUILDS = ("auto", "keep", "cpu", "cuda", "rocm")

# The NVIDIA driver a CUDA runtime needs, (Linux, Windows): NVIDIA's CUDA Toolkit release notes, table "CUDA
# Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility" (12.x: >= 525.60.13 / 528.33;
# 13.x: >= 580.65.06 / 580.88, https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html).
CUDA_DRIVERS = {(12, 0): ("525.60.13", "528.33"), (13, 0): ("580.65.06", "580.88")}
ANY_CC = ((0, 0), (99, 9))
NO_CUDA = ((0, 0), (99, 9))


@dataclass(frozen=True)
class Wheel:
    """One row of the table: which machines it is for, and what pip installs there."""

    name: str                         # the row's name (messages, tests)
    oses: tuple                       # of "linux", "wsl", "windows", "darwin"
    vendor: str                       # "nvidia" | "amd" | "none" (no GPU used) | "any"
    build: str                        # cpu | pypi | cuda | rocm | rocm-windows | refuse
    index: Optional[str]              # pip's --index-url (None: pip's own, PyPI)
    requirement: str                  # "torch=={version}", "torch[device-{gfx}]=={version}", ...
    python: tuple = ((3, 10), (3, 15))  # the Pythons the index has wheels for, inclusive
    cc: tuple = ANY_CC                # NVIDIA compute capability range, inclusive
    cuda: Optional[tuple] = None      # the driver's CUDA version it needs (nvidia-smi's header), at least
    gfx: tuple = ()                   # AMD gfx prefixes it is for; () for any
    arch: tuple = ()                  # the CPU architectures it is for; () for any
    source: str = ""


# (OS, GPU vendor/family, driver) -> (index, torch pin), for torch 2.13. First match wins; --torch X keeps the rows
# of build X only. The Python range of PyTorch's own wheels is the 2.13 wheel's classifiers (3.10 ... 3.15).
_LWW = ("linux", "wsl", "windows")
WHEELS = (
    # PyTorch 2.13's release matrix (pytorch/pytorch RELEASE.md, 2.13 row; PR 187075): CUDA 13.0 is the default
    # build, for Turing (sm_75) and newer, Blackwell included; CUDA 13 has no Maxwell/Pascal/Volta code.
    Wheel("nvidia-cu130", _LWW, "nvidia", "cuda", PYTORCH_WHL + "cu130", "torch=={version}", cc=((7, 5), (12, 9)),
          cuda=(13, 0), source="pytorch/pytorch RELEASE.md 2.13 row (CUDA 13.0); CUDA 13.0 release notes (sm_75+)"),
    # ... CUDA 12.6 stays for older architectures and older drivers (any 12.x driver: minor-version
    # compatibility); it has no Blackwell (sm_100/sm_120) kernels. cu128 left the matrix in 2.12.
    Wheel("nvidia-cu126", _LWW, "nvidia", "cuda", PYTORCH_WHL + "cu126", "torch=={version}", cc=((5, 0), (9, 0)),
          cuda=(12, 0), source="pytorch/pytorch RELEASE.md 2.13 row (CUDA 12.6, 'for older architectures')"),
    # An NVIDIA driver too old for both: the CPU build, and the message names the driver needed (CUDA_DRIVERS).
    Wheel("nvidia-old-driver", _LWW, "nvidia", "cpu", CPU_INDEX, "torch=={version}+cpu",
          source="NVIDIA CUDA Toolkit release notes, minimum driver per CUDA major version"),
    # PyTorch 2.13's ROCm build is ROCm 7.2 (RELEASE.md 2.13 row); rocm6.4's last torch is 2.9.1.
    Wheel("amd-rocm7.2", ("linux", "wsl"), "amd", "rocm", PYTORCH_WHL + "rocm7.2", "torch=={version}",
          source="pytorch/pytorch RELEASE.md 2.13 row (ROCm 7.2)"),
    # Windows: TheRock's release multi-arch index (RELEASES.md, "Installing multi-arch PyTorch Python packages":
    # torch 2.13 listed; its device table and SUPPORTED_GPUS.md "AMD Radeon - Windows": RDNA1 gfx101x, RDNA2
    # gfx103x, RDNA3 gfx110x, RDNA3.5 gfx115x, RDNA4 gfx120x). Python 3.10-3.14: TheRock's
    # build_tools/github_actions/configure_pytorch_release_matrix.py (RELEASE_PYTHON_VERSIONS).
    Wheel("amd-windows-therock", ("windows",), "amd", "rocm-windows", THEROCK_RELEASE_INDEX,
          "torch[device-{gfx}]=={version}", python=((3, 10), (3, 14)),
          gfx=("gfx101", "gfx103", "gfx110", "gfx115", "gfx120"),
          source="ROCm/TheRock RELEASES.md (multi-arch release index, device extras); SUPPORTED_GPUS.md (Windows)"),
    # Any other AMD GPU on Windows (Vega, CDNA, one it could not identify): no Windows wheel; the CPU build.
    Wheel("amd-windows-other", ("windows",), "amd", "cpu", CPU_INDEX, "torch=={version}+cpu",
          source="ROCm/TheRock SUPPORTED_GPUS.md: only Radeon RDNA1-4 on Windows"),
    # No GPU: PyTorch's CPU index (never the multi-GB CUDA wheels PyPI's Linux torch is).
    Wheel("cpu", _LWW, "none", "cpu", CPU_INDEX, "torch=={version}+cpu",
          source="pytorch.org/get-started (CPU index https://download.pytorch.org/whl/cpu)"),
    # Apple Silicon: PyPI's macOS wheel, CPU with Apple's MPS.
    Wheel("mac-arm64", ("darwin",), "any", "pypi", None, "torch=={version}", arch=("arm64", "aarch64"),
          source="PyPI torch 2.13.0 files (macosx_*_arm64 only)"),
    # Intel Macs: PyTorch's last x86_64 macOS wheel is 2.2.2 (x86 macOS deprecated from 2.3); nothing for 2.13.
    Wheel("mac-intel", ("darwin",), "any", "refuse", None, "",
          source="PyTorch 2.3 release notes (macOS x86 deprecated; 2.2.2 the last); PyTorch 2.13.0 on PyPI"),
)

# Windows adapter names -> gfx target, for when no HIP tool says it: the device table of TheRock's RELEASES.md and
# AMD's GPU specs (https://rocm.docs.amd.com/en/latest/reference/gpu-arch-specs.html). First match wins.
AMD_NAMES = (
    (r"RX\s*9070|R9700|R9600", "gfx1201"),
    (r"RX\s*9060", "gfx1200"),
    (r"RX\s*7900|W7900|W7800", "gfx1100"),
    (r"RX\s*7[78]00|W7700|V710", "gfx1101"),
    (r"RX\s*76[05]0|W7600|W7500", "gfx1102"),
    (r"\b7[468]0M\b", "gfx1103"),
    (r"\b80[456]0S\b", "gfx1151"),
    (r"\b8[89]0M\b", "gfx1150"),
    (r"\b8[46]0M\b", "gfx1152"),
    (r"\b820M\b", "gfx1153"),
    (r"RX\s*6(?:80|90|95)0|W6800|V620", "gfx1030"),
    (r"RX\s*67[05]0", "gfx1031"),
    (r"RX\s*66[05]0|W6600", "gfx1032"),
    (r"RX\s*6[45]00", "gfx1034"),
    (r"\b6[68]0M\b", "gfx1035"),
    (r"RX\s*5[67]00", "gfx1010"),
    (r"RX\s*5500|W5500", "gfx1012"),
)

# NVIDIA names -> compute capability, for when nvidia-smi can't say it (old nvidia-smi, /proc only). First match
# wins; unknown names count as Turing to Hopper (both CUDA builds have them).
NVIDIA_NAMES = (
    (r"RTX\s*50\d\d|RTX PRO \d+ Blackwell|\bB[23]00\b|\bGB[12]\d\d\b", (12, 0)),
    (r"GTX\s*1[06]\d\d|TITAN X|Tesla P|Quadro P|\bP[14]0{2}\b", (6, 1)),
    (r"TITAN V|V100|Quadro GV", (7, 0)),
    (r"GTX\s*9\d\d|Quadro M|Tesla M", (5, 2)),
)


@dataclass(frozen=True)
class Gpu:
    vendor: str                       # "nvidia" | "amd"
    name: str = ""
    gfx: Optional[str] = None         # AMD only, when known: "gfx1100"
    cc: Optional[tuple] = None        # NVIDIA only, when known: (8, 9)

    def label(self) -> str:
        if self.name and self.gfx:
            return f"{self.name} ({self.gfx})"
        return self.name or self.gfx or f"an {self.vendor.upper()} GPU"

    def capability(self) -> tuple:
        if self.cc:
            return self.cc
        return next((cc for pattern, cc in NVIDIA_NAMES if re.search(pattern, self.name, re.IGNORECASE)), (8, 0))


@dataclass
class Machine:
    """What the decision needs to know about the machine (detect() fills it; tests build it)."""

    os: str                           # "linux" | "windows" | "darwin"
    wsl: bool = False
    gpus: tuple = ()                  # Gpu, ...
    torch: Optional[str] = None       # the installed torch's version ("2.13.0+cpu"), None when there is none
    online: bool = True               # download.pytorch.org resolves
    arch: str = "x86_64"              # the CPU: "x86_64" | "arm64" | "aarch64"
    python: tuple = (3, 12)           # the target interpreter's (major, minor)
    cuda_driver: Optional[tuple] = None   # the NVIDIA driver's CUDA version (nvidia-smi's header), None: unknown
    driver: Optional[str] = None      # the NVIDIA driver's version, when known

    def of(self, vendor: str) -> list:
        return [g for g in self.gpus if g.vendor == vendor]

    @property
    def place(self) -> str:
        return "wsl" if self.wsl else self.os


@dataclass
class Options:
    torch: str = "auto"               # auto | keep | cpu | cuda | rocm
    cuda: Optional[str] = None        # PyTorch's CUDA index (cu126, cu130); None: picked from the table
    rocm: Optional[str] = None        # PyTorch's ROCm index (rocm7.2); None: the table's
    rocm_windows_index: Optional[str] = None   # TheRock's index for Windows; None: the release index
    nightly: bool = False             # Windows AMD: TheRock's nightly index (unpinned, --pre) instead of the release
    gfx: Optional[str] = None         # the AMD card for the Windows wheels, when detection can't tell
    torch_version: Optional[str] = None   # pin torch to this version instead of TORCH
    dev: bool = False


@dataclass
class Plan:
    build: str                        # keep | cpu | pypi | cuda | rocm | rocm-windows
    torch_install: Optional[list]     # pip arguments, None when torch is kept
    project_install: list
    messages: list = field(default_factory=list)
    error: Optional[str] = None
    row: Optional[str] = None         # the WHEELS row it came from

    @property
    def index_url(self) -> Optional[str]:
        args = self.torch_install or []
        return args[args.index("--index-url") + 1] if "--index-url" in args else None


# ---------------------------------------------------------------------------------------------------- decisions

def torch_build(version: str) -> str:
    """The build an installed torch version names: '2.13.0+cpu' -> cpu, '+cu130' -> cuda, '+rocm7.2' -> rocm."""
    local = version.partition("+")[2].lower()
    if "rocm" in local:
        return "rocm"
    if local.startswith("cu"):
        return "cuda"
    if local.startswith("cpu"):
        return "cpu"
    return "unknown"


_BUILD_WORDS = {"cpu": "the CPU build", "cuda": "a CUDA build", "rocm": "a ROCm build",
                "unknown": "no build tag: PyPI's default for this OS"}
_PLACES = {"linux": "Linux", "wsl": "WSL2", "windows": "Windows", "darwin": "macOS"}


def windows_rocm_ok(gfx: Optional[str]) -> bool:
    row = next(r for r in WHEELS if r.name == "amd-windows-therock")
    return bool(gfx) and gfx.lower().startswith(row.gfx)


def gfx_from_name(name: str) -> Optional[str]:
    for pattern, gfx in AMD_NAMES:
        if re.search(pattern, name, re.IGNORECASE):
            return gfx
    return None


def _labels(gpus) -> str:
    return ", ".join(g.label() for g in gpus)


def _py(v: tuple) -> str:
    return ".".join(str(x) for x in v)


def _driver_cuda(m: Machine, gpu: Optional[Gpu]) -> Optional[tuple]:
    """The driver's CUDA version; unknown on a found GPU: assumed new enough for its family's build (Blackwell:
    13.0, others 12.0); None (no check) when no NVIDIA GPU was found (--torch cuda on another machine)."""
    if m.cuda_driver:
        return m.cuda_driver
    if gpu is None or gpu.vendor != "nvidia" or not m.of("nvidia"):
        return None
    return (13, 0) if gpu.capability() >= (10, 0) else (12, 0)


def _fits(row: Wheel, m: Machine, gpu: Optional[Gpu], driver_check: bool = True) -> bool:
    if m.place not in row.oses or (row.arch and m.arch not in row.arch):
        return False
    if row.vendor == "none":
        return gpu is None
    if row.vendor == "any":
        return True
    if gpu is None or gpu.vendor != row.vendor:
        return False
    if row.vendor == "nvidia":
        if not row.cc[0] <= gpu.capability() <= row.cc[1]:
            return False
        cuda = _driver_cuda(m, gpu)
        if driver_check and row.cuda and cuda is not None and cuda < row.cuda:
            return False
    return not row.gfx or bool(gpu.gfx and gpu.gfx.lower().startswith(row.gfx))


def wheel_for(m: Machine, gpu: Optional[Gpu], build: Optional[str] = None) -> Optional[Wheel]:
    """The first row of WHEELS for this machine and GPU (of that build, when given)."""
    return next((r for r in WHEELS if (build is None or r.build in (build, "refuse")) and _fits(r, m, gpu)), None)


def _gpu_for(m: Machine, o: Options) -> Optional[Gpu]:
    """The GPU the pick is for: NVIDIA first; else AMD (on Windows one that TheRock ships, --gfx naming it)."""
    nvidia, amd = m.of("nvidia"), m.of("amd")
    if nvidia:
        return nvidia[0]
    if m.os == "windows" and (amd or o.gfx):
        if o.gfx:
            return Gpu("amd", next((g.name for g in amd if g.gfx == o.gfx), ""), o.gfx)
        return next((g for g in amd if windows_rocm_ok(g.gfx)), None) or next((g for g in amd if g.gfx), amd[0])
    return amd[0] if amd else None


def _needed_driver(m: Machine, gpu: Gpu) -> str:
    """'driver 580.65.06 or newer (CUDA 13.0)': what the newest-needing CUDA row for this GPU family asks for."""
    rows = [r for r in WHEELS if r.build == "cuda" and _fits(r, m, gpu, driver_check=False)]
    need = min((r.cuda for r in rows), default=(12, 0))
    linux, windows = CUDA_DRIVERS[need]
    return f"NVIDIA driver {windows if m.os == 'windows' else linux} or newer (CUDA {_py(need)})"


def plan(m: Machine, o: Options) -> Plan:
    """The decision: which torch to install (if any) and how, then the project. Pure: runs and reads nothing."""
    project = ["install", "-e", ".[dev]" if o.dev else "."]
    nvidia, amd = m.of("nvidia"), m.of("amd")
    uninstall = "python -m pip uninstall -y torch, then run the installer again"

    if m.python < (3, 10):
        return Plan("keep", None, project, error=f"SteadyFrame needs Python 3.10 or newer, this is Python "
                    f"{_py(m.python)}: make the environment with a newer one (e.g. `python3.12 -m venv .venv`, on "
                    "Windows `py -3.12 -m venv .venv`). Nothing was installed")
    if m.torch is not None:
        build = torch_build(m.torch)
        p = Plan("keep", None, project, [f"keeping the installed PyTorch {m.torch} ({_BUILD_WORDS[build]})"])
        if o.torch in ("cpu", "cuda", "rocm") and build != o.torch:
            p.messages.append(f"--torch {o.torch} was asked for, but an installed PyTorch is never replaced; to "
                              f"switch: {uninstall} with --torch {o.torch}")
        elif o.torch == "auto" and build == "cpu" and m.os != "darwin" and (nvidia or amd):
            p.messages.append(f"note: this machine has {_labels(nvidia or amd)}, but the installed PyTorch is the "
                              f"CPU build; to use the GPU: {uninstall}")
        return p

    if o.torch == "keep":
        return Plan("keep", None, project, error="no PyTorch is installed and --torch keep installs none: install "
                    "the build for your machine first (README, 'Install PyTorch'), or run without --torch keep")

    version = o.torch_version or TORCH
    messages: list = []
    gpu = _gpu_for(m, o)
    if o.torch == "auto":
        row = wheel_for(m, gpu)
    elif m.os == "darwin":
        if o.torch != "cpu":
            return Plan(o.torch, None, project, error=f"--torch {o.torch}: there are no {o.torch.upper()} builds "
                        "for macOS; run without --torch (PyTorch from PyPI, with Apple's MPS)")
        row = wheel_for(m, None)
    elif o.torch == "cpu":
        row, gpu = wheel_for(m, None, "cpu"), None
        messages.append("--torch cpu: installing the CPU build")
    elif o.torch == "cuda":
        gpu = nvidia[0] if nvidia else None
        row = wheel_for(m, gpu or Gpu("nvidia"), "cuda")
        if row is None or row.build != "cuda":          # the driver is too old for both: asked for anyway
            row = next(r for r in WHEELS if r.build == "cuda" and _fits(r, m, gpu or Gpu("nvidia"), False))
            messages.append(f"warning: this driver is too old for {row.index}; it needs "
                            f"{_needed_driver(m, gpu or Gpu('nvidia'))}")
        messages.append(f"--torch cuda: installing the CUDA build ({(o.cuda or row.index.rsplit('/', 1)[1])})")
    else:                                                   # --torch rocm
        amd_gpu = gpu if gpu is not None and gpu.vendor == "amd" else (
            Gpu("amd", "", o.gfx) if o.gfx else (amd[0] if amd else None))
        if m.os == "windows" and not (amd_gpu and amd_gpu.gfx):
            return Plan("rocm-windows", None, project, error="--torch rocm on Windows: which AMD card is it? Pass "
                        f"its gfx target, e.g. --gfx gfx1100 for an RX 7900 XTX (the list: {THEROCK_RELEASES})")
        gpu = amd_gpu or Gpu("amd")
        row = wheel_for(m, gpu, "rocm-windows" if m.os == "windows" else "rocm")
        if row is None and m.os == "windows":               # a card TheRock's Windows wheels do not list
            row = next(r for r in WHEELS if r.name == "amd-windows-therock")
            messages.append(f"warning: {gpu.gfx} is not on TheRock's Windows list (RDNA1-RDNA4); its wheels may "
                            "not run on it (https://github.com/ROCm/TheRock/blob/main/SUPPORTED_GPUS.md)")
        messages.insert(0, f"--torch rocm: installing {'PyTorch for ROCm on Windows' if m.os == 'windows' else 'the ROCm build'}"
                        + (f" for {gpu.gfx}" if gpu.gfx else ""))
    if row is None:                                         # an OS the table does not know
        return Plan("cpu", None, project, error=f"no PyTorch build is known for {m.os} ({m.arch}); install "
                    "PyTorch yourself (https://pytorch.org/get-started/locally/), then run this again")
    if row.build == "refuse":
        return Plan("refuse", None, project, row=row.name, error=(
            f"PyTorch {TORCH} has no wheels for Intel Macs (x86_64 macOS wheels ended with PyTorch 2.2.2), so "
            "SteadyFrame cannot run here. What works: a Mac with Apple Silicon (M1 or newer), or Linux or Windows "
            "(with an NVIDIA or AMD GPU, or the CPU)"))
    if version == TORCH and not row.python[0] <= m.python <= row.python[1]:
        lo, hi = _py(row.python[0]), _py(row.python[1])
        where = " on Windows from AMD (TheRock)" if row.build == "rocm-windows" else ""
        return Plan(row.build, None, project, row=row.name, error=(
            f"this is Python {_py(m.python)}, but PyTorch {TORCH}{where} has wheels for Python {lo} to {hi} only; "
            f"make the environment with one of those and run this again (e.g. `python{hi} -m venv .venv`, on "
            f"Windows `py -{hi} -m venv .venv`). Nothing was installed"))

    messages = _explain(m, o, row, gpu) + messages if o.torch == "auto" else messages
    build = row.build
    index = row.index
    requirement = row.requirement.format(version=version, gfx=gpu.gfx if gpu else "")
    extra: list = []
    if build == "cuda" and o.cuda:
        index = PYTORCH_WHL + o.cuda
    elif build == "rocm" and o.rocm:
        index = PYTORCH_WHL + o.rocm
    elif build == "rocm-windows":
        if o.nightly:
            index = THEROCK_NIGHTLY_INDEX
            extra = ["--pre"]
            requirement = f"torch[device-{gpu.gfx}]" + (f"=={o.torch_version}" if o.torch_version else "")
            messages.append(f"--nightly: TheRock's nightly builds ({THEROCK_NIGHTLY_INDEX}), not the release "
                            f"SteadyFrame is tested with (PyTorch {TORCH})")
        index = o.rocm_windows_index or index
        messages.append(f"AMD's PyTorch for ROCm on Windows (TheRock) needs a current Adrenalin driver "
                        f"({THEROCK_RELEASES})")
    if build == "rocm" and m.wsl:
        messages.append(f"WSL2: the ROCm build runs only with AMD's WSL support installed (a current Adrenalin "
                        f"driver on Windows, ROCm and librocdxg inside WSL): {WSL_ROCM_GUIDE}")
    if build == "cpu" and not m.online:
        # Offline mirrors or a pip find-links folder that carries the CPU wheel.
        messages.append("download.pytorch.org does not resolve: asking pip's configured indexes for " + requirement)
        return Plan(build, ["install", requirement], project, messages, row=row.name)
    if build in ("cuda", "rocm") and not m.online:
        messages.append("warning: download.pytorch.org does not resolve; this works only through a proxy or "
                        "mirror pip knows about")
    args = ["install", requirement] + extra
    if index:
        args += ["--index-url", index]
    if build == "cpu":
        args += ["--extra-index-url", PYPI]            # the CPU index lacks some of torch's dependencies
    return Plan(build, args, project, messages, row=row.name)


def _explain(m: Machine, o: Options, row: Wheel, gpu: Optional[Gpu]) -> list:
    """What was found and why this row (auto only)."""
    nvidia, amd = m.of("nvidia"), m.of("amd")
    where = _PLACES.get(m.place, m.place)
    if row.name == "mac-arm64":
        return ["macOS on Apple Silicon: PyTorch from PyPI (its default wheel); SteadyFrame runs on the CPU there "
                "(its pipeline does not use Apple's MPS GPU)"]
    if row.build == "cuda":
        found = f"found {_labels(nvidia)}"
        if m.cuda_driver:
            found += f" (driver {m.driver + ', ' if m.driver else ''}CUDA {_py(m.cuda_driver)})"
        else:
            found += " (could not read the driver's CUDA version from nvidia-smi; assuming a current driver)"
        also = "; an AMD GPU is here too: --torch rocm picks it instead" if amd else ""
        return [f"{found}: installing the CUDA build ({row.index.rsplit('/', 1)[1]}){also}"]
    if row.name == "nvidia-old-driver":
        return [f"found {_labels(nvidia)}, but its driver (CUDA {_py(m.cuda_driver or (0, 0))}) is too old for "
                f"PyTorch {TORCH}'s CUDA builds: installing the CPU build. To use the GPU: install the "
                f"{_needed_driver(m, gpu)}, `python -m pip uninstall -y torch`, and run this again"]
    if row.build == "rocm":
        return [f"found {_labels(amd)} on {where}: installing the ROCm build ({row.index.rsplit('/', 1)[1]}); "
                "check it afterwards with `python -m rocm doctor`"]
    if row.build == "rocm-windows":
        return [f"found {_labels(amd) or gpu.gfx}: installing PyTorch for ROCm on Windows ({gpu.gfx}) from "
                "TheRock's release index"]
    if row.name == "amd-windows-other":
        known = [gpu] if gpu and gpu.gfx else []
        if known:
            why = (f"found {_labels(known)}, but AMD's PyTorch for Windows (TheRock) ships only Radeon RDNA1-RDNA4 "
                   "cards (gfx101x, gfx103x, gfx110x, gfx115x, gfx120x)")
        else:
            why = (f"found {_labels(amd)}, but could not tell which architecture it is (if it is an RDNA card: "
                   "--gfx gfx1100 for an RX 7900 XTX, gfx1201 for an RX 9070, ...)")
        return [why + "; installing the CPU build instead. To use this GPU: run SteadyFrame on Linux with ROCm, or "
                f"in WSL2 with AMD's ROCm-on-WSL if your card is on its list ({WSL_ROCM_GUIDE}); or try TheRock's "
                "Windows wheels anyway with --torch rocm --gfx gfxNNNN (not tested with SteadyFrame)"]
    return [f"no NVIDIA or AMD GPU found ({where}): installing the CPU build"]


# ---------------------------------------------------------------------------------------------------- detection

def capture(cmd: Sequence[str], timeout: float = 20) -> Optional[str]:
    """The command's stdout, or None when it is missing, fails or hangs (every detection step fails soft)."""
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                           errors="replace")
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return r.stdout if r.returncode == 0 else None


def nvidia_gpus(run: Callable = capture, extra: Sequence[str] = (), proc: Optional[Path] = PROC_NVIDIA) -> list:
    """NVIDIA GPUs from `nvidia-smi --query-gpu=name,compute_cap` ("NVIDIA GeForce RTX 4090, 8.9"), else `nvidia-smi
    -L` ("GPU 0: NVIDIA GeForce RTX 4090 (UUID: ...)", older tools), else the Linux driver's /proc/driver/nvidia/gpus
    (proc None: not looked at)."""
    for exe in ("nvidia-smi", *extra):
        out = run([exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"])
        rows = re.findall(r"^\s*(.+?),\s*(\d+)\.(\d+)\s*$", out or "", re.MULTILINE)
        if rows:
            return [Gpu("nvidia", n.strip(), cc=(int(a), int(b))) for n, a, b in rows]
        out = run([exe, "-L"])
        if out:
            names = re.findall(r"^GPU \d+:\s*(.+?)(?:\s+\(UUID:.*)?$", out, re.MULTILINE)
            if names:
                return [Gpu("nvidia", n.strip()) for n in names]
    gpus = []
    if proc is None:
        return gpus
    try:
        for info in sorted(proc.glob("*/information")):
            model = re.search(r"^Model:\s*(.+)$", info.read_text(errors="replace"), re.MULTILINE)
            gpus.append(Gpu("nvidia", model.group(1).strip() if model else "NVIDIA GPU"))
    except OSError:
        return []
    return gpus


def nvidia_driver(run: Callable = capture, extra: Sequence[str] = ()) -> tuple:
    """(the driver's CUDA version, the driver's version) from nvidia-smi's header ("Driver Version: 580.65.06
    CUDA Version: 13.0"); (None, None) when there is no nvidia-smi."""
    for exe in ("nvidia-smi", *extra):
        out = run([exe]) or ""
        cuda = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", out)
        if cuda:
            driver = re.search(r"Driver Version:\s*([\d.]+)", out)
            return (int(cuda.group(1)), int(cuda.group(2))), driver.group(1) if driver else None
    return None, None


def gfx_from_target_version(value: int) -> Optional[str]:
    """KFD's gfx_target_version is major*10000 + minor*100 + stepping: 110000 -> gfx1100, 90010 -> gfx90a."""
    if value <= 0:
        return None
    return f"gfx{value // 10000}{(value // 100) % 100:x}{value % 100:x}"


def kfd_gpus(nodes: Path = KFD_NODES) -> list:
    """AMD GPUs of the Linux KFD topology (CPU nodes report gfx_target_version 0)."""
    gpus = []
    try:
        props = sorted(nodes.glob("*/properties"), key=lambda p: (len(p.parent.name), p.parent.name))
        for path in props:
            found = re.search(r"^gfx_target_version\s+(\d+)", path.read_text(errors="replace"), re.MULTILINE)
            gfx = gfx_from_target_version(int(found.group(1))) if found else None
            if gfx:
                gpus.append(Gpu("amd", "", gfx))
    except (OSError, ValueError):
        return []
    return gpus


def rocminfo_gpus(run: Callable = capture) -> list:
    """AMD GPU agents of `rocminfo` ("Name: gfx1100"; CPU agents carry the CPU's name)."""
    out = run(["rocminfo"]) or ""
    return [Gpu("amd", "", gfx) for gfx in re.findall(r"^\s*Name:\s+(gfx[0-9a-f]+)\s*$", out, re.MULTILINE)]


def windows_adapters(run: Callable = capture, powershell: str = "powershell") -> list:
    """The display adapters' names (PowerShell's Win32_VideoController, else wmic, removed from new Windows)."""
    out = run([powershell, "-NoProfile", "-NonInteractive", "-Command",
               "Get-CimInstance Win32_VideoController | ForEach-Object { $_.Name }"])
    if out is None:
        out = run(["wmic", "path", "win32_VideoController", "get", "name"])
        out = "\n".join(line for line in (out or "").splitlines() if line.strip() != "Name")
    return [line.strip() for line in out.splitlines() if line.strip()]


def hip_gfx(run: Callable = capture, env=os.environ) -> list:
    """AMD gfx targets from the HIP SDK's hipInfo ("gcnArchName: gfx1100") or amd-smi, when either is there."""
    tools = ["hipInfo"]
    if env.get("HIP_PATH"):
        tools.append(str(Path(env["HIP_PATH"]) / "bin" / "hipInfo.exe"))
    for exe in tools:
        found = re.findall(r"gcnArchName:\s*(gfx[0-9a-f]+)", run([exe]) or "")
        if found:
            return found
    return re.findall(r"TARGET_GRAPHICS_VERSION:\s*(gfx[0-9a-f]+)", run(["amd-smi", "static", "--asic"]) or "")


def _amd_from_adapters(names: list, gfx_list: list) -> list:
    amd_names = [n for n in names if re.search(r"\bAMD\b|Radeon", n, re.IGNORECASE)]
    if gfx_list:
        return [Gpu("amd", next((n for n in amd_names if gfx_from_name(n) == g), ""), g) for g in gfx_list]
    return [Gpu("amd", n, gfx_from_name(n)) for n in amd_names]


def detect_gpus(os_name: str, wsl: bool, run: Callable = capture, kfd: Path = KFD_NODES, env=os.environ) -> tuple:
    """The NVIDIA and AMD GPUs on this machine, by the tools each OS has; none found when every tool is missing."""
    if os_name == "darwin":
        return ()
    if os_name == "windows":
        names = windows_adapters(run)
        nvidia = nvidia_gpus(run, proc=None) or [
            Gpu("nvidia", n) for n in names if "nvidia" in n.lower()]
        return tuple(nvidia + _amd_from_adapters(names, hip_gfx(run, env)))
    nvidia = nvidia_gpus(run, extra=(WSL_NVIDIA_SMI,) if wsl else ())
    amd = kfd_gpus(kfd) or rocminfo_gpus(run)
    if wsl and not amd and not nvidia:
        # WSL2 has no KFD; without AMD's WSL stack the Windows side (interop) still names the adapters.
        amd = _amd_from_adapters(windows_adapters(run, powershell="powershell.exe"), [])
    return tuple(nvidia + amd)


def resolves(host: str, timeout: float = 5.0) -> bool:
    """Whether the host name resolves (in a thread: a broken resolver must not hang the installer)."""
    result = []

    def ask():
        try:
            socket.getaddrinfo(host, 443)
            result.append(True)
        except OSError:
            pass

    t = threading.Thread(target=ask, daemon=True)
    t.start()
    t.join(timeout)
    return bool(result)


def os_name() -> str:
    return {"Linux": "linux", "Windows": "windows", "Darwin": "darwin"}.get(platform.system(),
                                                                             platform.system().lower())


def is_wsl(release: Optional[str] = None, dxg: Path = Path("/dev/dxg")) -> bool:
    """WSL2: the GPU paravirtualization device /dev/dxg, or 'microsoft' in the kernel's release."""
    release = platform.release() if release is None else release
    try:
        return dxg.exists() or "microsoft" in release.lower()
    except OSError:
        return "microsoft" in release.lower()


def cpu_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64"}.get(machine, machine)


def detect(torch_version: Optional[str], python: tuple, run: Callable = capture) -> Machine:
    name = os_name()
    wsl = name == "linux" and is_wsl()
    gpus = detect_gpus(name, wsl, run)
    cuda, driver = (nvidia_driver(run, (WSL_NVIDIA_SMI,) if wsl else ()) if any(g.vendor == "nvidia" for g in gpus)
                    else (None, None))
    return Machine(os=name, wsl=wsl, gpus=gpus, torch=torch_version, arch=cpu_arch(), python=python,
                   cuda_driver=cuda, driver=driver,
                   online=resolves("download.pytorch.org") if torch_version is None else True)


# ---------------------------------------------------------------------------------------------------- running

def say(text: str) -> None:
    print(f"install: {text}", flush=True)


def show(cmd: Sequence[str]) -> str:
    return subprocess.list2cmdline(list(cmd)) if os.name == "nt" else shlex.join(list(cmd))


def call(cmd: Sequence[str]) -> int:
    """Runs a command in the repository, its output straight to the terminal; its exit status."""
    try:
        return subprocess.run(list(cmd), cwd=ROOT).returncode
    except OSError as e:
        say(f"could not run {cmd[0]}: {e}")
        return 127


def stamp_value(root: Path = ROOT) -> str:
    """What the stamp holds: the pyproject.toml's sha256 and the checkout's path (as scripts/install.sh wrote it)."""
    return hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest() + "-" + str(root)


def stamp_matches(stamp: Path, wanted: str) -> bool:
    try:
        return stamp.read_text().strip() == wanted
    except OSError:
        return False


def _torch_version(python: Optional[str], run: Callable) -> Optional[str]:
    """The installed torch's version, from its metadata (importing torch only to ask takes seconds)."""
    if python is None:
        try:
            return importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return None
    out = run([python, "-c", "import importlib.metadata as m; print(m.version('torch'))"])
    return out.strip() if out and out.strip() else None


def _python_version(python: Optional[str], run: Callable) -> Optional[tuple]:
    """The target interpreter's (major, minor)."""
    if python is None:
        return tuple(sys.version_info[:2])
    out = run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]) or ""
    found = re.fullmatch(r"(\d+)\.(\d+)", out.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


def _prefix(python: Optional[str], run: Callable) -> Optional[str]:
    if python is None:
        return sys.prefix
    out = run([python, "-c", "import sys; print(sys.prefix)"])
    return out.strip() if out and out.strip() else None


def _describe(m: Machine) -> str:
    where = {"linux": "Linux", "windows": "Windows", "darwin": "macOS"}.get(m.os, m.os) + (" (WSL2)" if m.wsl
                                                                                         else "")
    driver = f" (driver CUDA {_py(m.cuda_driver)})" if m.cuda_driver else ""
    return (f"{where} {m.arch}, Python {_py(m.python)}; GPUs: {_labels(m.gpus) or 'none found'}{driver}; "
            f"PyTorch: {m.torch or 'not installed'}")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="install.py", description="Installs SteadyFrame (and PyTorch when there is "
                                 "none) into this Python environment.")
    ap.add_argument("--dev", action="store_true", help="also the test tools (pip install -e .[dev])")
    ap.add_argument("--torch", choices=BUILDS, default="auto",
                    help="which PyTorch to install when none is installed (default auto: picked for the GPU "
                         "found); keep: install none. An installed PyTorch is always kept")
    ap.add_argument("--cuda", type=_tag(r"cu\d+"),
                    help="PyTorch's CUDA index for NVIDIA GPUs (default: cu130 or cu126, picked by the GPU and the "
                         "driver's CUDA version)")
    ap.add_argument("--rocm", type=_tag(r"rocm\d+(\.\d+)*"),
                    help="PyTorch's ROCm index for AMD GPUs on Linux and WSL2 (default rocm7.2)")
    ap.add_argument("--rocm-windows-index", metavar="URL",
                    help=f"AMD's ROCm-on-Windows wheel index (default {THEROCK_RELEASE_INDEX}, TheRock's releases)")
    ap.add_argument("--nightly", action="store_true",
                    help=f"AMD on Windows: TheRock's nightly builds ({THEROCK_NIGHTLY_INDEX}) instead of the release")
    ap.add_argument("--gfx", type=_tag(r"gfx[0-9a-f]{3,4}"),
                    help="the AMD card's gfx target for the Windows wheels when it is not detected (e.g. gfx1100)")
    ap.add_argument("--torch-version", metavar="V",
                    help=f"pin torch to this version (default {TORCH}, the one SteadyFrame is tested with)")
    ap.add_argument("--dry-run", action="store_true", help="print what was found and the commands; run nothing")
    ap.add_argument("--python", metavar="PATH",
                    help="install into this interpreter's environment (default: the one running this script; "
                         "scripts/install.sh passes $PYTHON)")
    return ap.parse_args(argv)


def _tag(pattern: str):
    def check(value: str) -> str:
        if not re.fullmatch(pattern, value):
            raise argparse.ArgumentTypeError(f"{value!r} does not look like {pattern}")
        return value
    return check


def main(argv: Optional[Sequence[str]] = None, *, machine: Optional[Machine] = None, run: Callable = capture,
         execute: Callable = call) -> int:
    args = parse_args(argv)
    if args.python is None and sys.version_info < (3, 10):
        say(f"SteadyFrame needs Python 3.10 or newer, this is {platform.python_version()} (Windows: "
            "py -3.11 -m venv .venv)")
        return 2
    python = args.python or sys.executable
    options = Options(torch=args.torch, cuda=args.cuda, rocm=args.rocm, rocm_windows_index=args.rocm_windows_index,
                      nightly=args.nightly, gfx=args.gfx, torch_version=args.torch_version, dev=args.dev)
    if machine is None:
        version = _python_version(args.python, run)
        if version is None:
            say(f"could not run {python}: is it a Python interpreter?")
            return 1
        machine = detect(_torch_version(args.python, run), version, run)
    m = machine
    p = plan(m, options)
    say(_describe(m))
    for message in p.messages:
        say(message)
    if p.error:
        say(p.error)
        return 2

    prefix = _prefix(args.python, run)
    if prefix is None:
        say(f"could not run {python}: is it a Python interpreter?")
        return 1
    kind = "dev" if args.dev else "app"
    stamp, wanted = Path(prefix) / f".steadyframe-install-{kind}", stamp_value()
    unchanged = stamp_matches(stamp, wanted)
    pip = [python, "-m", "pip"]

    if args.dry_run:
        say("dry run: nothing is installed. It would run:")
        if p.torch_install:
            print("  " + show(pip + p.torch_install))
        if unchanged:
            print(f"  (nothing more: steadyframe ({kind}) is installed in {prefix} and unchanged)")
        else:
            print("  " + show(pip + p.project_install))
            print("  " + show([python, "-c", GUARD]))
        return 0

    if p.torch_install:
        rc = execute(pip + p.torch_install)
        if rc != 0:
            say(f"pip failed (exit {rc}) installing PyTorch ({p.build}): {show(pip + p.torch_install)}. Nothing "
                "else was installed; see pip's message above, or pick another build with --torch cpu|cuda|rocm, "
                "or install PyTorch yourself and run this again (an installed one is kept)")
            return rc if rc > 0 else 1
    # Nothing to do when this was installed into this environment before and nothing changed (the dependencies live
    # in pyproject.toml; the install is editable, so code changes need no reinstall).
    if unchanged:
        say(f"steadyframe ({kind}) already installed in {prefix} and unchanged; nothing to do")
        return 0
    rc = execute(pip + p.project_install)
    if rc != 0:
        say(f"pip failed (exit {rc}) installing steadyframe: {show(pip + p.project_install)}; see pip's message "
            "above")
        return rc if rc > 0 else 1
    # Guard: nothing above may have replaced the torch build that was there, and the one installed must import.
    rc = execute([python, "-c", GUARD])
    if rc != 0:
        say("PyTorch does not import after the install (see the error above); the project is installed, torch "
            "needs fixing: python -m pip uninstall -y torch, then run this again (or --torch cpu)")
        return rc if rc > 0 else 1
    try:
        stamp.write_text(wanted + "\n")
    except OSError as e:
        say(f"(could not write {stamp}: {e}; the next run installs again)")
    if p.build in ("rocm", "rocm-windows"):
        say("check the GPU with: python -m rocm doctor")
    return 0


if __name__ == "__main__":
    sys.exit(main())

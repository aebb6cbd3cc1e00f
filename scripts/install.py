#!/usr/bin/env python3
"""Installs SteadyFrame into the Python environment that runs this script (Linux, Windows, macOS).

    python scripts/install.py              # the app (`pip install -e .`)
    python scripts/install.py --dev        # the app + test tools (`pip install -e .[dev]`)
    python scripts/install.py --dry-run    # what it found and what it would run; runs nothing

PyTorch comes first: an installed torch (any build) is always kept. With none installed, the build is picked for
the machine: CUDA for an NVIDIA GPU, ROCm for an AMD GPU on Linux (WSL2 included), AMD's ROCm-on-Windows wheels for
an RDNA3/RDNA4 card on Windows, else the CPU build. `--torch cpu|cuda|rocm` overrides the pick, `--torch keep`
installs no torch. Then the project itself (editable); a stamp in the environment makes a second run with nothing
changed a no-op. `bash scripts/install.sh` runs this script.

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

# PyTorch's own wheel indexes, one per build (https://pytorch.org/get-started/locally/).
PYTORCH_WHL = "https://download.pytorch.org/whl/"
CPU_INDEX = PYTORCH_WHL + "cpu"
PYPI = "https://pypi.org/simple"
DEFAULT_CPU_VERSION = "2.13.0"        # the version the project is tested with (the CPU build's pin, as before)
DEFAULT_CUDA = "cu128"
DEFAULT_ROCM = "rocm6.4"
# AMD's ROCm-on-Windows PyTorch wheels are built by TheRock. Its RELEASES.md ("Installing multi-arch PyTorch Python
# packages", https://github.com/ROCm/TheRock/blob/main/RELEASES.md) installs them from one index for all GPUs, the
# card picked by an extra: `pip install --index-url https://rocm.nightlies.amd.com/whl-multi-arch/
# "torch[device-gfx1100]"`. The older per-family indexes (https://rocm.nightlies.amd.com/v2/gfx110X-all/, ...)
# are "legacy" there (docs/packaging/legacy_per_family_releases.md: no new releases, may be deleted).
ROCM_WINDOWS_INDEX = "https://rocm.nightlies.amd.com/whl-multi-arch/"
THEROCK_RELEASES = "https://github.com/ROCm/TheRock/blob/main/RELEASES.md"
# The families picked on Windows without being asked: RDNA3 (gfx110x), RDNA3.5 (gfx115x), RDNA4 (gfx120x).
WINDOWS_ROCM_FAMILIES = ("gfx110", "gfx115", "gfx120")
# ROCm inside WSL2 needs AMD's WSL support (Adrenalin driver on Windows, ROCm + librocdxg inside WSL).
WSL_ROCM_GUIDE = "https://rocm.docs.amd.com/projects/radeon-ryzen/en/latest/docs/install/installrad/wsl/howto_wsl.html"
KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
PROC_NVIDIA = Path("/proc/driver/nvidia/gpus")
WSL_NVIDIA_SMI = "/usr/lib/wsl/lib/nvidia-smi"       # where WSL2 puts the Windows driver's nvidia-smi
GUARD = ('import torch; print("install: torch", torch.__version__, "| CUDA/HIP:", '
         'torch.version.cuda or torch.version.hip or "none")')
BUILDS = ("auto", "keep", "cpu", "cuda", "rocm")

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


@dataclass(frozen=True)
class Gpu:
    vendor: str                       # "nvidia" | "amd"
    name: str = ""
    gfx: Optional[str] = None         # AMD only, when known: "gfx1100"

    def label(self) -> str:
        if self.name and self.gfx:
            return f"{self.name} ({self.gfx})"
        return self.name or self.gfx or f"an {self.vendor.upper()} GPU"


@dataclass
class Machine:
    """What the decision needs to know about the machine (detect() fills it; tests build it)."""

    os: str                           # "linux" | "windows" | "darwin"
    wsl: bool = False
    gpus: tuple = ()                  # Gpu, ...
    torch: Optional[str] = None       # the installed torch's version ("2.13.0+cpu"), None when there is none
    online: bool = True               # download.pytorch.org resolves

    def of(self, vendor: str) -> list:
        return [g for g in self.gpus if g.vendor == vendor]


@dataclass
class Options:
    torch: str = "auto"               # auto | keep | cpu | cuda | rocm
    cuda: str = DEFAULT_CUDA
    rocm: str = DEFAULT_ROCM
    rocm_windows_index: str = ROCM_WINDOWS_INDEX
    gfx: Optional[str] = None         # the AMD card for the Windows wheels, when detection can't tell
    torch_version: Optional[str] = None   # pin torch (every build); the CPU build is pinned anyway
    cpu_version: str = DEFAULT_CPU_VERSION
    dev: bool = False


@dataclass
class Plan:
    build: str                        # keep | cpu | pypi | cuda | rocm | rocm-windows
    torch_install: Optional[list]     # pip arguments, None when torch is kept
    project_install: list
    messages: list = field(default_factory=list)
    error: Optional[str] = None

    @property
    def index_url(self) -> Optional[str]:
        args = self.torch_install or []
        return args[args.index("--index-url") + 1] if "--index-url" in args else None


# ---------------------------------------------------------------------------------------------------- decisions

def torch_build(version: str) -> str:
    """The build an installed torch version names: '2.13.0+cpu' -> cpu, '+cu128' -> cuda, '+rocm6.4' -> rocm."""
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


def windows_rocm_ok(gfx: Optional[str]) -> bool:
    return bool(gfx) and gfx.lower().startswith(WINDOWS_ROCM_FAMILIES)


def gfx_from_name(name: str) -> Optional[str]:
    for pattern, gfx in AMD_NAMES:
        if re.search(pattern, name, re.IGNORECASE):
            return gfx
    return None


def _labels(gpus) -> str:
    return ", ".join(g.label() for g in gpus)


def _spec(name: str, version: Optional[str]) -> str:
    return f"{name}=={version}" if version else name


def plan(m: Machine, o: Options) -> Plan:
    """The decision: which torch to install (if any) and how, then the project. Pure: runs and reads nothing."""
    project = ["install", "-e", ".[dev]" if o.dev else "."]
    nvidia, amd = m.of("nvidia"), m.of("amd")
    uninstall = "python -m pip uninstall -y torch, then run the installer again"

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

    messages: list = []
    build, gfx = o.torch, None
    if build == "auto":
        build, gfx, messages = _pick(m, o)
    elif build in ("cuda", "rocm") and m.os == "darwin":
        return Plan(build, None, project, error=f"--torch {build}: there are no {build.upper()} builds for macOS; "
                    "run without --torch (PyTorch from PyPI, with Apple's MPS)")
    elif build == "rocm" and m.os == "windows":
        gfx = o.gfx or next((g.gfx for g in amd if windows_rocm_ok(g.gfx)), None) or next(
            (g.gfx for g in amd if g.gfx), None)
        if not gfx:
            return Plan(build, None, project, error="--torch rocm on Windows: which AMD card is it? Pass its gfx "
                        f"target, e.g. --gfx gfx1100 for an RX 7900 XTX (the list: {THEROCK_RELEASES})")
        build = "rocm-windows"
        messages.append(f"--torch rocm: PyTorch for ROCm on Windows for {gfx}")
        if not windows_rocm_ok(gfx):
            messages.append(f"warning: {gfx} is not RDNA3/RDNA4; TheRock's wheels may not run on it "
                            "(https://github.com/ROCm/TheRock/blob/main/SUPPORTED_GPUS.md)")
    elif build == "cpu" and m.os == "darwin":
        build = "pypi"
        messages.append("--torch cpu: PyTorch from PyPI (on macOS that is the CPU build, with Apple's MPS)")
    else:
        messages.append(f"--torch {build}: installing the {build.upper()} build")
    if build == "rocm" and m.wsl:
        messages.append(f"WSL2: the ROCm build runs only with AMD's WSL support installed (a current Adrenalin "
                        f"driver on Windows, ROCm and librocdxg inside WSL): {WSL_ROCM_GUIDE}")

    version = o.torch_version
    if build == "cpu":
        cpu = f"torch=={version or o.cpu_version}+cpu"
        if m.online:
            args = ["install", cpu, "--index-url", CPU_INDEX, "--extra-index-url", PYPI]
        else:
            # Offline mirrors or a pip find-links folder that carries the CPU wheel.
            messages.append("download.pytorch.org does not resolve: asking pip's configured indexes for " + cpu)
            args = ["install", cpu]
    elif build == "pypi":
        args = ["install", _spec("torch", version or o.cpu_version)]
    elif build in ("cuda", "rocm"):
        args = ["install", _spec("torch", version), "--index-url", PYTORCH_WHL + (o.cuda if build == "cuda"
                                                                                  else o.rocm)]
        if not m.online:
            messages.append("warning: download.pytorch.org does not resolve; this works only through a proxy or "
                            "mirror pip knows about")
    else:                                                   # rocm-windows
        args = ["install", _spec(f"torch[device-{gfx}]", version), "--index-url", o.rocm_windows_index]
        messages.append(f"AMD's ROCm-on-Windows wheels (TheRock, {o.rocm_windows_index}) are nightly builds and "
                        f"need a current Adrenalin driver ({THEROCK_RELEASES})")
    return Plan(build, args, project, messages)


def _pick(m: Machine, o: Options):
    """--torch auto: (build, gfx for the Windows ROCm wheels, messages)."""
    nvidia, amd = m.of("nvidia"), m.of("amd")
    if m.os == "darwin":
        return "pypi", None, ["macOS: PyTorch from PyPI (the CPU build, with Apple's MPS)"]
    if nvidia:
        also = "; an AMD GPU is here too: --torch rocm picks it instead" if amd else ""
        return "cuda", None, [f"found {_labels(nvidia)}: installing the CUDA build ({o.cuda}){also}"]
    if amd and m.os == "linux":
        where = "WSL2" if m.wsl else "Linux"
        return "rocm", None, [f"found {_labels(amd)} on {where}: installing the ROCm build ({o.rocm}); check it "
                              "afterwards with `python -m rocm doctor`"]
    if amd or o.gfx:                                        # Windows
        gfx = o.gfx or next((g.gfx for g in amd if windows_rocm_ok(g.gfx)), None)
        if windows_rocm_ok(gfx):
            return "rocm-windows", gfx, [f"found {_labels(amd) or gfx}: installing PyTorch for ROCm on Windows "
                                         f"({gfx})"]
        known = [Gpu("amd", "", o.gfx)] if o.gfx else [g for g in amd if g.gfx]
        if known:
            why = (f"found {_labels(known)}, but PyTorch for ROCm on Windows (AMD's TheRock wheels) is picked "
                   "only for RDNA3/RDNA4 cards (gfx110x, gfx115x, gfx120x)")
        else:
            why = (f"found {_labels(amd)}, but could not tell which architecture it is; PyTorch for ROCm on "
                   "Windows is picked only for RDNA3/RDNA4 cards (if it is one: --gfx gfx1100 for an RX 7900 "
                   "XTX, gfx1201 for an RX 9070, ...)")
        return "cpu", None, [why + "; installing the CPU build instead. To use this GPU: run SteadyFrame on "
                             "Linux with ROCm (PyTorch's ROCm wheels, which support RDNA2 too), or in WSL2 with "
                             f"AMD's ROCm-on-WSL if your card is on its list ({WSL_ROCM_GUIDE}); or try TheRock's "
                             "Windows wheels anyway with --torch rocm --gfx gfxNNNN (not tested with SteadyFrame)"]
    return "cpu", None, ["no NVIDIA or AMD GPU found: installing the CPU build"]


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
    """NVIDIA GPUs from `nvidia-smi -L` ("GPU 0: NVIDIA GeForce RTX 4090 (UUID: ...)"), else the Linux driver's
    /proc/driver/nvidia/gpus (proc None: not looked at)."""
    for exe in ("nvidia-smi", *extra):
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


def detect(torch_version: Optional[str], run: Callable = capture) -> Machine:
    name = os_name()
    wsl = name == "linux" and is_wsl()
    return Machine(os=name, wsl=wsl, gpus=detect_gpus(name, wsl, run), torch=torch_version,
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


def _prefix(python: Optional[str], run: Callable) -> Optional[str]:
    if python is None:
        return sys.prefix
    out = run([python, "-c", "import sys; print(sys.prefix)"])
    return out.strip() if out and out.strip() else None


def _describe(m: Machine) -> str:
    where = {"linux": "Linux", "windows": "Windows", "darwin": "macOS"}.get(m.os, m.os) + (" (WSL2)" if m.wsl
                                                                                         else "")
    return f"{where}; GPUs: {_labels(m.gpus) or 'none found'}; PyTorch: {m.torch or 'not installed'}"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="install.py", description="Installs SteadyFrame (and PyTorch when there is "
                                 "none) into this Python environment.")
    ap.add_argument("--dev", action="store_true", help="also the test tools (pip install -e .[dev])")
    ap.add_argument("--torch", choices=BUILDS, default="auto",
                    help="which PyTorch to install when none is installed (default auto: picked for the GPU "
                         "found); keep: install none. An installed PyTorch is always kept")
    ap.add_argument("--cuda", default=DEFAULT_CUDA, type=_tag(r"cu\d+"),
                    help=f"PyTorch's CUDA index for NVIDIA GPUs (default {DEFAULT_CUDA}: {PYTORCH_WHL}{DEFAULT_CUDA})")
    ap.add_argument("--rocm", default=DEFAULT_ROCM, type=_tag(r"rocm\d+(\.\d+)*"),
                    help=f"PyTorch's ROCm index for AMD GPUs on Linux and WSL2 (default {DEFAULT_ROCM})")
    ap.add_argument("--rocm-windows-index", default=ROCM_WINDOWS_INDEX, metavar="URL",
                    help=f"AMD's ROCm-on-Windows wheel index (default {ROCM_WINDOWS_INDEX}, TheRock's nightlies)")
    ap.add_argument("--gfx", type=_tag(r"gfx[0-9a-f]{3,4}"),
                    help="the AMD card's gfx target for the Windows wheels when it is not detected (e.g. gfx1100)")
    ap.add_argument("--torch-version", metavar="V",
                    help="pin torch to this version (the CPU build's default: $TORCH_CPU_VERSION or "
                         f"{DEFAULT_CPU_VERSION})")
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
                      gfx=args.gfx, torch_version=args.torch_version, dev=args.dev,
                      cpu_version=os.environ.get("TORCH_CPU_VERSION") or DEFAULT_CPU_VERSION)
    m = machine or detect(_torch_version(args.python, run), run)
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

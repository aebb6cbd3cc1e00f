"""The ROCm environment profile: verified MIOpen/allocator variables, applied before ``import torch``.

MIOpen reads each of its variables once per process, at first use, and PyTorch reads the allocator settings at the
first GPU allocation: so app.py and the CLI call ``apply_env_profile()`` before importing torch. The user's own
settings always win; variables that do not exist or do nothing produce warnings (``check_environment``).
On CUDA and CPU (no AMD GPU in the KFD topology) nothing is changed.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, MutableMapping

from common.environment import ROCM_PROFILE, ROCM_PROFILE_SET, read_environment
from configs.memory import MEMORY
from configs.rocm_profiles import (
    ALLOC_CONF_VAR,
    ALLOC_CONF_VARS,
    AOTRITON_EXPERIMENTAL_ARCH_PREFIXES,
    AOTRITON_EXPERIMENTAL_VAR,
    MIOPEN_KERNEL_CACHE_VAR,
    PROFILES,
    RocmProfile,
)
from rocm import env_facts as facts
from rocm.arch import arch_family, detect_arch, visible_devices_note
from rocm.paths import build_tag, cache_dir, installed_torch_version

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvWarning:
    variable: str
    value: str | None
    message: str
    severity: str = "warning"   # 'warning' (wrong or useless) | 'info'

    def __str__(self) -> str:
        shown = self.variable if self.value is None else f"{self.variable}={self.value}"
        return f"{shown}: {self.message}"


@dataclass
class EnvReport:
    """What ``apply_env_profile`` did."""

    gfx: str | None = None
    family: str | None = None
    profile: RocmProfile | None = None
    set: dict[str, str] = field(default_factory=dict)
    kept: dict[str, tuple[str, str]] = field(default_factory=dict)   # var -> (user's value, ours)
    warnings: list[EnvWarning] = field(default_factory=list)
    skipped_reason: str | None = None

    @property
    def applied(self) -> bool:
        return self.profile is not None

    def lines(self) -> list[str]:
        if not self.applied:
            out = [f"ROCm environment profile not applied: {self.skipped_reason}"]
        else:
            out = [f"ROCm environment profile '{self.family}' for {self.gfx}"]
        out += [f"  set  {k}={v}" for k, v in self.set.items()]          # (NVIDIA: the allocator's mode)
        out += [f"  kept {k}={user} (yours; profile would set {ours})" for k, (user, ours) in self.kept.items()]
        out += [f"  {w.severity}: {w}" for w in self.warnings]
        return out


def _find_mode_warnings(value: str) -> list[EnvWarning]:
    v = value.strip().upper()
    if v in ("1", "NORMAL"):
        return [EnvWarning("MIOPEN_FIND_MODE", value, "1 is NORMAL (full Find on every new shape), not FAST; "
                           "FAST is 2 (or the name FAST).")]
    if v in facts.FIND_MODE_VALUES or v in {str(n) for n in facts.FIND_MODE_VALUES.values()}:
        return []
    names = ", ".join(f"{k}={n}" for k, n in facts.FIND_MODE_VALUES.items())
    return [EnvWarning("MIOPEN_FIND_MODE", value, f"not a find mode; real values: {names}.")]


def _find_enforce_warnings(value: str) -> list[EnvWarning]:
    v = value.strip().upper()
    numbers = {str(n): k for k, n in facts.FIND_ENFORCE_VALUES.items()}
    name = numbers.get(v, v)
    if name not in facts.FIND_ENFORCE_VALUES:
        extra = " There is no DB_ONLY." if "DB_ONLY" in v else ""
        real = ", ".join(f"{k}={n}" for k, n in facts.FIND_ENFORCE_VALUES.items())
        return [EnvWarning("MIOPEN_FIND_ENFORCE", value, f"not a value MIOpen knows ({real}).{extra}")]
    if name in ("SEARCH", "SEARCH_DB_UPDATE"):
        return [EnvWarning("MIOPEN_FIND_ENFORCE", value, "forces auto-tuning of every new shape: the first VAE "
                           "decode can run for many minutes.")]
    return []


def _bool_warnings(var: str, value: str, family: str | None) -> list[EnvWarning]:
    parsed = facts.miopen_bool(value)
    if parsed is None:
        return [EnvWarning(var, value, "boolean MIOpen switch: use 0/1 (or true/false, on/off, yes/no, "
                           "enable(d)/disable(d)). Any other value makes MIOpen fail with miopenStatusInvalidValue.")]
    if var in facts.XDLOPS_VARS and family in ("rdna1", "rdna2", "rdna3", "rdna4"):
        return [EnvWarning(var, value, "applies only to gfx908/gfx90a/gfx94x (XDLOPS): no effect on RDNA cards.",
                           "info")]
    if var in facts.NAIVE_VARS and parsed:
        return [EnvWarning(var, value, "the naive solvers are on by default: turning them on adds nothing (only 0 "
                           "changes anything).", "info")]
    if var == "MIOPEN_DEBUG_CONV_IMMED_FALLBACK" and parsed:
        return [EnvWarning(var, value, "the immediate-mode fallback is on by default: turning it on does nothing.",
                           "info")]
    return []


def _aotriton_warnings(value: str, gfx: str | None) -> list[EnvWarning]:
    if value not in ("0", "1"):
        return [EnvWarning(AOTRITON_EXPERIMENTAL_VAR, value, "PyTorch reads only 0 or 1 here (c10::utils::check_env)"
                           "; any other value is ignored, so flash / memory-efficient attention stays off.")]
    if value == "0" and gfx is not None and aotriton_gated(gfx):
        return [EnvWarning(AOTRITON_EXPERIMENTAL_VAR, value, f"keeps PyTorch's flash / memory-efficient attention "
                           f"off on {gfx}: attention then runs on the math kernel in chunks (slow).")]
    return []


def expandable_segments_note(torch_version: str | None) -> tuple[str, str]:
    """(message, level) for expandable_segments set by the user on ROCm, for this torch build ('2.11.0+rocm7.0'):
    PyTorch honours it on ROCm from 2.11 with ROCm 7, and it has open hang and crash reports there."""
    found = re.match(r"(\d+)\.(\d+)", torch_version or "")
    hip = re.search(r"\+rocm(\d+)", torch_version or "")
    if not found or not hip:
        return ("expandable_segments: PyTorch honours it on ROCm from 2.11 with ROCm 7 (this build's version is "
                f"{torch_version or 'unknown'}).", "info")
    if (int(found[1]), int(found[2])) < (2, 11) or int(hip[1]) < 7:
        return (f"expandable_segments is a no-op on ROCm with PyTorch {torch_version} (it takes effect from "
                f"PyTorch 2.11 with ROCm 7).", "info")
    return (f"expandable_segments takes effect with PyTorch {torch_version}; on ROCm it has open hang and crash "
            f"reports: unset it if jobs hang or crash.", "warning")


def _alloc_warnings(var: str, value: str, family: str | None, torch_version: str | None = None
                    ) -> list[EnvWarning]:
    entries, bad = facts.parse_alloc_conf(value)
    out = [EnvWarning(var, value, f"malformed entry '{b}' (expected key:value).") for b in bad]
    for key, val in entries.items():
        problem = None
        if key == "max_split_size_mb":
            problem = None if val.isdigit() and int(val) >= 20 else "max_split_size_mb must be an integer >= 20."
        elif key == "garbage_collection_threshold":
            try:
                ok = 0.0 < float(val) < 1.0
            except ValueError:
                ok = False
            problem = None if ok else "garbage_collection_threshold must be between 0 and 1 (exclusive)."
        elif key == "backend" and val not in facts.ALLOC_BACKENDS:
            problem = f"backend must be one of {', '.join(facts.ALLOC_BACKENDS)}."
        elif key == "expandable_segments" and family is not None:
            message, level = expandable_segments_note(torch_version)
            out.append(EnvWarning(var, value, message, level))
        if problem:
            out.append(EnvWarning(var, value, problem))
    return out


def _hsa_override_warnings(value: str, gfx: str | None, family: str | None) -> list[EnvWarning]:
    parts = value.strip().split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return [EnvWarning("HSA_OVERRIDE_GFX_VERSION", value, "expected major.minor.step, e.g. 10.3.0.")]
    if family == "rdna1":
        return [EnvWarning("HSA_OVERRIDE_GFX_VERSION", value, "overriding an RDNA1 card (gfx101x) is widely "
                           "reported to crash (HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION); SteadyFrame keeps "
                           "convolutions off MIOpen on RDNA1. Unset it only with a PyTorch that has gfx101x kernels "
                           "(`python -m rocm doctor` says whether yours has).")]
    if gfx in ("gfx1031", "gfx1032", "gfx1103"):
        return [EnvWarning("HSA_OVERRIDE_GFX_VERSION", value, f"an override on {gfx} is reported to page-fault "
                           "inside MIOpen: if convolutions crash, unset it where your PyTorch has kernels for "
                           f"{gfx}.")]
    if gfx == "gfx1100":
        return [EnvWarning("HSA_OVERRIDE_GFX_VERSION", value, "gfx1100 needs no override (AMD calls it a debug "
                           "aid).", "info")]
    return []


def check_environment(environ: Mapping[str, str] | None = None, *, gfx: str | None = None,
                      torch_version: str | None = None) -> list[EnvWarning]:
    """Warnings for variables that do not exist, do nothing, or have values MIOpen/PyTorch reject.

    ``gfx`` (e.g. 'gfx1010') enables the arch-specific checks; ``torch_version`` (default: the installed torch's,
    read without importing it) the version-dependent ones.
    """
    env = os.environ if environ is None else environ
    torch_version = torch_version or installed_torch_version()
    family = arch_family(gfx)
    out: list[EnvWarning] = []
    for var in sorted(env):
        value = env[var]
        if var in facts.NONEXISTENT:
            out.append(EnvWarning(var, value, facts.NONEXISTENT[var]))
        elif var == "MIOPEN_FIND_MODE":
            out += _find_mode_warnings(value)
        elif var == "MIOPEN_FIND_ENFORCE":
            out += _find_enforce_warnings(value)
        elif var in facts.BOOL_VARS:
            out += _bool_warnings(var, value, family)
        elif var == "MIOPEN_LOG_LEVEL":
            if not (value.strip().isdigit() and int(value) <= 7):
                out.append(EnvWarning(var, value, "log level must be 0..7."))
        elif var in ALLOC_CONF_VARS:
            out += _alloc_warnings(var, value, family, torch_version)
        elif var == "HSA_OVERRIDE_GFX_VERSION":
            out += _hsa_override_warnings(value, gfx, family)
        elif var == AOTRITON_EXPERIMENTAL_VAR:
            out += _aotriton_warnings(value, gfx)
        elif var.startswith("MIOPEN_") and var not in facts.KNOWN_VARS:
            out.append(EnvWarning(var, value, "not in docs/FACTS.md: unchecked (it may do nothing).", "info"))
    alloc_set = [v for v in ALLOC_CONF_VARS if v in env]
    if len({env[v] for v in alloc_set}) > 1:
        out.append(EnvWarning(", ".join(alloc_set), None, "several allocator variables with different values: "
                              "which one PyTorch reads depends on its version.", "info"))
    return out


def aotriton_gated(gfx: str) -> bool:
    """Whether PyTorch may keep its AOTriton attention kernels behind TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL on
    this arch (see configs/rocm_profiles.py for the sources)."""
    return gfx.split(":")[0].lower().startswith(AOTRITON_EXPERIMENTAL_ARCH_PREFIXES)


def miopen_dirs(environ: Mapping[str, str]) -> dict[str, Path]:
    """The persistent MIOpen folder the profile uses: the kernel cache, one per installed torch build.
    (Not the user database: under FIND_MODE=FAST MIOpen never writes it, so moving it would only hide yours.)"""
    base = cache_dir(environ) / "miopen" / build_tag(installed_torch_version())
    return {MIOPEN_KERNEL_CACHE_VAR: base / "kernel-cache"}


def installed_torch_build() -> dict[str, str | None] | None:
    """{"cuda": "13.0" or None, "hip": "7.2..." or None}: what the installed torch was built for, as its own
    torch/version.py says (torch.version.cuda / torch.version.hip), read as text: torch is not imported (the profile
    is applied before it starts). None when torch or the file is not there."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        try:
            text = (Path(folder) / "version.py").read_text("utf-8", errors="replace")
        except OSError:
            continue
        found = {}
        for name in ("cuda", "hip"):
            m = re.search(rf"^{name}\s*(?::[^=\n]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", text, re.MULTILINE)
            found[name] = (m.group(1) or m.group(2)) if m and (m.group(1) or m.group(2)) else None
        return found
    return None


def build_backend(torch_version: str | None, build: Mapping[str, str | None] | None = None) -> str | None:
    """The GPU stack a PyTorch build was made for: from its version's local label, 'rocm' (2.11.0+rocm7.0), 'cuda'
    (+cu130), 'cpu' (+cpu); without a label (PyPI's wheels: a CUDA build on Linux, CPU on macOS and Windows) from
    what the build says of itself (`build`: torch.version.cuda / .hip, `installed_torch_build`); None when neither
    tells. This, not the KFD topology, says whether jobs run on ROCm: WSL2, Windows and containers have no
    /sys/class/kfd, and a Ryzen iGPU is in the topology beside an NVIDIA card that a CUDA build uses."""
    label = (torch_version or "").partition("+")[2]
    if label.startswith("rocm"):
        return "rocm"
    if label.startswith("cu"):
        return "cuda"
    if label == "cpu":
        return "cpu"
    if build is not None:
        return "rocm" if build.get("hip") else "cuda" if build.get("cuda") else "cpu"
    return None


def _desired(profile: RocmProfile, environ: Mapping[str, str], report: EnvReport, gfx: str,
             allocator: bool = True) -> dict[str, str]:
    desired = dict(profile.env)
    if aotriton_gated(gfx):
        desired[AOTRITON_EXPERIMENTAL_VAR] = "1"
    user_alloc = [v for v in ALLOC_CONF_VARS if v in environ]
    if user_alloc:
        report.kept[user_alloc[0]] = (environ[user_alloc[0]], profile.alloc_conf)
    elif allocator:
        desired[ALLOC_CONF_VAR] = profile.alloc_conf
    for var, path in miopen_dirs(environ).items():
        if var in environ:
            desired[var] = str(path)   # recorded as kept below
            continue
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            report.warnings.append(EnvWarning(var, str(path), f"cannot create the folder ({exc}); MIOpen keeps "
                                              "its default location.", "info"))
            continue
        desired[var] = str(path)
    return desired


CUDA_ALLOC_CONF = "expandable_segments:True"


def _cuda_allocator(env: MutableMapping[str, str], report: EnvReport) -> None:
    """NVIDIA (or CPU): PyTorch's allocator with expandable segments, unless the user set an allocator variable or
    MemoryConfig.cuda_expandable_segments is off. With fixed segments, a small tensor that outlives a stage keeps a
    whole cached segment reserved, the VAE decode's convolutions then miss their workspace under the cap, and cuDNN
    runs slower kernels with other rounding: on an H100 a decode after such a history took 1.11× as long and gave
    other frames; with expandable segments it gave the same frames as on a clean allocator, 0.90× the time
    (benchmarks/vae_repeat.py --fragment)."""

    user = [v for v in ALLOC_CONF_VARS if v in env]
    if user:
        if env[user[0]] != CUDA_ALLOC_CONF:
            report.kept[user[0]] = (env[user[0]], CUDA_ALLOC_CONF)
    elif MEMORY.cuda_expandable_segments:
        env["PYTORCH_CUDA_ALLOC_CONF"] = report.set["PYTORCH_CUDA_ALLOC_CONF"] = CUDA_ALLOC_CONF


def _forget_inherited(env: MutableMapping[str, str]) -> None:
    """Remove what an earlier profile set (a parent process's, for its own GPU: a farm worker inherits it and may run
    on another card), so this process's profile decides them again; the user's own settings are never listed."""
    for var in read_environment(env).rocm_profile_set:
        env.pop(var, None)
    env.pop(ROCM_PROFILE_SET, None)


def apply_env_profile(environ: MutableMapping[str, str] | None = None, *,
                      topology_nodes: Path | str | None = None, torch_version: str | None = None,
                      device_index: int | None = None, torch_build: Mapping[str, str | None] | None = None
                      ) -> EnvReport:
    """Apply the profile of the AMD architecture family the job's GPU has to ``environ`` (default ``os.environ``).

    Call before ``import torch``. Sets only variables listed in docs/FACTS.md, never one the user already set.
    ``STEADYFRAME_ROCM_PROFILE=off`` skips it. The GPU is torch's device ``device_index`` (default 0, as ``--device
    cuda:N`` says) under the device-selection variables (``rocm.arch.job_gpu``): not simply the first in the KFD
    topology, which may be a Ryzen iGPU. What it sets is listed in STEADYFRAME_ROCM_PROFILE_SET, so that a child
    process on another GPU (a farm worker) replaces it with its own GPU's profile. ``topology_nodes`` points at a
    fake KFD topology (tests); ``torch_version`` and ``torch_build`` stand for the installed torch's version and
    torch.version's cuda/hip (tests): the build decides ROCm or CUDA (`build_backend`).
    """
    env = os.environ if environ is None else environ
    _forget_inherited(env)
    report = EnvReport()
    if not read_environment(env).rocm_profile:
        report.skipped_reason = f"disabled by {ROCM_PROFILE}"
        report.warnings = check_environment(env)
        return report
    version = torch_version or installed_torch_version()
    build = build_backend(version, torch_build if torch_build is not None
                          else installed_torch_build() if torch_version is None else None)
    arch = detect_arch(topology_nodes, env, device_index)
    if arch is not None and build == "cuda":
        report.skipped_reason = (f"the installed PyTorch is a CUDA build ({version}): the AMD GPU in the KFD "
                                 f"topology ({arch.gfx}, e.g. a Ryzen iGPU) does not run the jobs; no ROCm profile")
        arch = None
    if arch is None and build == "rocm":
        report.skipped_reason = (f"a ROCm build of PyTorch ({version}) but no KFD topology (WSL2, Windows or a "
                                 f"container): the architecture's profile is applied when torch names the GPU; no "
                                 f"allocator setting (expandable segments are never set on ROCm)")
        report.warnings = check_environment(env)
        logger.debug(report.skipped_reason)
        return report
    if arch is None:
        if report.skipped_reason:
            _cuda_allocator(env, report)
            report.warnings = check_environment(env)
            return report
        report.skipped_reason = "no AMD GPU in the KFD topology (CUDA or CPU): no ROCm profile"
        _cuda_allocator(env, report)
        report.warnings = check_environment(env)
        logger.debug(report.skipped_reason)
        return report
    report.gfx, report.family = arch.gfx, arch.family
    report.profile = profile = PROFILES[arch.family]
    for var, value in _desired(profile, env, report, arch.gfx).items():
        if var in env:
            if env[var] != value:
                report.kept[var] = (env[var], value)
        else:
            env[var] = value
            report.set[var] = value
    if report.set:
        env[ROCM_PROFILE_SET] = ",".join(report.set)
    report.warnings += check_environment(env, gfx=arch.gfx)
    report.warnings += _gpu_choice_notes(arch, env, device_index)
    if env is os.environ and "torch" in sys.modules:   # only the real process environment matters here
        report.warnings.append(EnvWarning("import order", None, "torch was imported before the profile: MIOpen "
                                          "reads its variables at first use and PyTorch its allocator settings "
                                          "at the first allocation, so some settings may come too late."))
    for line in report.lines():
        logger.info(line)
    return report


def _gpu_choice_notes(arch, env: Mapping[str, str], device_index: int | None) -> list[EnvWarning]:
    """Which GPU the profile followed, where there are several kinds; advice when that is a Ryzen iGPU while a
    discrete card is there (HIP lists the iGPU as a device like any other, often as device 0)."""
    notes = []
    if len(arch.nodes) > 1 and "CUDA_VISIBLE_DEVICES" in env and not any(
            k in env for k in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")):
        notes.append(EnvWarning("CUDA_VISIBLE_DEVICES", env["CUDA_VISIBLE_DEVICES"], "is not an AMD device "
                                "selector (HIP reads HIP_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES): the profile "
                                f"follows torch's device {device_index or 0} among all the AMD GPUs; to choose one, "
                                "set HIP_VISIBLE_DEVICES instead", "info"))
    if len({n.gfx for n in arch.nodes}) < 2:
        return notes
    chosen = arch.chosen or arch.nodes[0]
    selection = visible_devices_note(env)
    notes += [EnvWarning("GPU", None, f"AMD GPUs {', '.join(n.gfx for n in arch.nodes)}: profile '{arch.family}' "
                        f"follows {chosen.gfx} (KFD node {chosen.node}), torch's device {device_index or 0}"
                        + (f" under {selection}" if selection else "") + ".", "info")]
    discrete = [i for i, n in enumerate(arch.nodes) if not n.integrated]
    chosen_by_user = any(k in env for k in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"))
    if chosen.integrated and discrete and not chosen_by_user and not device_index:    # not where the user chose it
        first = arch.nodes[discrete[0]]
        notes.append(EnvWarning("GPU", None, f"the jobs would run on {chosen.gfx}, an integrated GPU, while "
                                f"{first.gfx} is a discrete card: start with HIP_VISIBLE_DEVICES={discrete[0]} (its "
                                f"index among the GPUs) so that the jobs, and this profile, use it."))
    return notes


def apply_late_profile(gfx: str, environ: MutableMapping[str, str] | None = None) -> EnvReport:
    """The profile of ``gfx`` (as torch names it) once torch runs, where no KFD topology named it before (a ROCm
    build on WSL2, Windows or in a container): MIOpen's variables (read at its first use) and AOTriton's gate; not
    the allocator (read at the first allocation, perhaps already made). Never one the user set."""
    env = os.environ if environ is None else environ
    report = EnvReport(gfx=gfx, family=arch_family(gfx))
    if report.family is None or not read_environment(env).rocm_profile:
        report.skipped_reason = f"no ROCm profile for {gfx}"
        return report
    report.profile = profile = PROFILES[report.family]
    for var, value in _desired(profile, env, report, gfx, allocator=False).items():
        if var in env:
            if env[var] != value:
                report.kept[var] = (env[var], value)
        else:
            env[var] = report.set[var] = value
    if report.set:
        env[ROCM_PROFILE_SET] = ",".join(report.set)
    report.warnings += check_environment(env, gfx=gfx)
    return report


_LATE: list[EnvReport] = []        # the late profile, applied once per process


def apply_torch_settings() -> list[str]:
    """After ``import torch``: on ROCm turn ``cudnn.benchmark`` off (it makes MIOpen search exhaustively on
    every new shape, the usual "hung" first VAE decode). Changes nothing on CUDA/CPU. Returns what it changed."""
    import torch

    changed = []
    if getattr(torch.version, "hip", None) and not _LATE and detect_arch() is None and torch.cuda.is_available():
        gfx = torch.cuda.get_device_properties(torch.cuda.current_device()).gcnArchName.split(":")[0]
        _LATE.append(apply_late_profile(gfx))
        changed += [f"{k}={v} (profile for {gfx}, applied after torch started)" for k, v in _LATE[0].set.items()]
    if getattr(torch.version, "hip", None) and torch.backends.cudnn.benchmark:
        torch.backends.cudnn.benchmark = False
        changed.append("torch.backends.cudnn.benchmark=False")
    for item in changed:
        logger.info("ROCm: %s", item)
    return changed

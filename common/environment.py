"""Every environment variable SteadyFrame reads, read here and nowhere else (`read_environment`): once for a
process's Config (configs/options.py), and where a process starts before it has one (the ROCm profile and the
host heap before torch starts, a probe child's seams).

    STEADYFRAME_CACHE_DIR        the cache root (else $XDG_CACHE_HOME/steadyframe, else ~/.cache/steadyframe)
    STEADYFRAME_PROMPT_CACHE     the prompt cache's folder, or off (default <cache root>/prompts)
    STEADYFRAME_LATE_LOAD        0/1: MemoryConfig.late_load for one run (a benchmark compares both)
    STEADYFRAME_PARK             0/1: MemoryConfig.park_file_blocks for one run
    STEADYFRAME_DIRECT_IO        0/1: MemoryConfig.direct_io for one run
    STEADYFRAME_HOST_HEAP        off: glibc's heap thresholds are left alone (rocm/allocator.py)
    STEADYFRAME_ROCM_PROFILE     off: no ROCm environment profile at start (rocm/env.py)
    STEADYFRAME_ROCM_PROFILE_SET the variables the profile set (not the user's): a child process (a farm worker on
                                 another GPU) applies its own GPU's profile over them (rocm/env.py)
    STEADYFRAME_CONV_FAULTS      test seam: faults injected into the convolution probe's child (JSON, rocm/faults.py)
    STEADYFRAME_PROBE_LIFELINE   the probe child's lifeline pipe, set by its parent (rocm/probe_child.py)
    HF_HUB_CACHE, HF_HOME        where the Hugging Face hub keeps downloaded weights
    HF_HUB_OFFLINE               1: nothing is downloaded

Other programs' variables that SteadyFrame sets or reports for the GPU stack (MIOPEN_*, HSA_*, PYTORCH_*ALLOC_CONF,
*_VISIBLE_DEVICES) belong to the vendor layer (rocm/env.py, rocm/arch.py, rocm/doctor.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

CACHE_DIR = "STEADYFRAME_CACHE_DIR"
PROMPT_CACHE = "STEADYFRAME_PROMPT_CACHE"
LATE_LOAD = "STEADYFRAME_LATE_LOAD"
PARK = "STEADYFRAME_PARK"
DIRECT_IO = "STEADYFRAME_DIRECT_IO"
HOST_HEAP = "STEADYFRAME_HOST_HEAP"
ROCM_PROFILE = "STEADYFRAME_ROCM_PROFILE"
ROCM_PROFILE_SET = "STEADYFRAME_ROCM_PROFILE_SET"
CONV_FAULTS = "STEADYFRAME_CONV_FAULTS"
PROBE_LIFELINE = "STEADYFRAME_PROBE_LIFELINE"

_OFF = ("0", "false", "off", "no")
_ON = ("1", "true", "on", "yes")


def switch(text: str | None) -> bool | None:
    """0/false/off/no: False; 1/true/on/yes: True; anything else (or unset): None (the configured value holds)."""
    value = (text or "").strip().lower()
    return False if value in _OFF else True if value in _ON else None


@dataclass(frozen=True)
class Environment:
    cache_root: Path                      # SteadyFrame's cache folder (not created here)
    prompt_cache: Path | None             # None: the prompt cache is off
    late_load: bool | None = None         # None: MemoryConfig's value
    park: bool | None = None
    direct_io: bool | None = None
    host_heap: bool = True                # False: glibc's heap left alone
    rocm_profile: bool = True             # False: no ROCm environment profile
    rocm_profile_set: tuple[str, ...] = ()  # the variables an earlier profile (a parent process's) set
    conv_faults: str | None = None        # the probe child's injected faults (JSON)
    probe_lifeline: str | None = None
    hub_cache: Path | None = None         # None: the hub's default
    offline: bool = False


def read_environment(environ: Mapping[str, str] | None = None) -> Environment:
    """The environment's settings (`environ`: the process's by default)."""
    env = os.environ if environ is None else environ
    root = env.get(CACHE_DIR)
    if root:
        cache = Path(root).expanduser()
    else:
        cache = Path(env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "steadyframe"
    chosen = env.get(PROMPT_CACHE, "")
    prompts = None if switch(chosen) is False else Path(chosen).expanduser() if chosen else cache / "prompts"
    hub: Path | None
    if env.get("HF_HUB_CACHE"):
        hub = Path(env["HF_HUB_CACHE"]).expanduser()
    else:
        hub = Path(env["HF_HOME"]).expanduser() / "hub" if env.get("HF_HOME") else None
    return Environment(cache_root=cache, prompt_cache=prompts, late_load=switch(env.get(LATE_LOAD)),
                       park=switch(env.get(PARK)), direct_io=switch(env.get(DIRECT_IO)),
                       host_heap=switch(env.get(HOST_HEAP)) is not False,
                       rocm_profile=switch(env.get(ROCM_PROFILE)) is not False,
                       rocm_profile_set=tuple(v for v in env.get(ROCM_PROFILE_SET, "").split(",") if v),
                       conv_faults=env.get(CONV_FAULTS) or None, probe_lifeline=env.get(PROBE_LIFELINE) or None,
                       hub_cache=hub, offline=bool(switch(env.get("HF_HUB_OFFLINE"))))

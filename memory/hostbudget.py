"""The host-RAM budget's inputs: how much this machine can spare, what the process itself takes, what a job adds.

- `default_host_budget()`: total RAM minus a margin for the OS and other programs (a browser): 20 % of it, at least
  4 and at most 16 GB (configs/memory.py); inside a cgroup/container whose memory limit is lower, that limit minus
  0.5 GB. The explanation is logged at start.
- `process_overhead(held)`: what the process holds besides the weights in its host packs, measured now from
  /proc/self/status (RssAnon + RssFile + RssShmem − the packs' bytes): Python, torch, the CUDA context and the GPU
  libraries' mapped pages. If a GPU is there but its context is not made yet, an estimate is added.
- `job_working_bytes(...)`: what one job adds while it runs: the video so far as uint8 frames (and one copy while a
  section's mp4 is written) and the float32 frames of one decoded section.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from common.units import GIB
from configs.memory import MEMORY, MemoryConfig

log = logging.getLogger(__name__)

CUDA_CONTEXT_ESTIMATE = 1 * GIB        # host memory of a CUDA/ROCm context + libraries not loaded yet (estimate)
OVERHEAD_FLOOR = GIB // 4


def _linux() -> bool:
    """/proc and cgroups are Linux's: elsewhere (Windows, macOS) the limit is None and psutil gives the RSS."""
    return sys.platform.startswith("linux")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_memory_limit(proc_cgroup: str | None = None, root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The tightest memory limit of this process's cgroup and its parents (v2 memory.max, v1
    memory.limit_in_bytes); None when there is none (or it cannot be read, or this is not Linux)."""
    if proc_cgroup is None and not _linux():
        return None
    text = proc_cgroup if proc_cgroup is not None else _read(Path("/proc/self/cgroup"))
    if not text:
        return None
    limits = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":                                   # cgroup v2 (unified)
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):                # cgroup v1 memory controller
            base, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        folder = base / rel
        while True:
            value = _read(folder / name)
            if value and value != "max" and value.isdigit() and int(value) < (1 << 60):
                limits.append(int(value))
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(limits) if limits else None


def total_ram() -> int:
    import psutil

    return psutil.virtual_memory().total


def default_host_budget(total: int | None = None, limit: int | None = None,
                        cfg: MemoryConfig = MEMORY) -> tuple[int, str]:
    """(bytes, explanation) of the budget used when --host-ram-gb is not given."""
    total = total_ram() if total is None else total
    margin = min(max(cfg.host_os_margin_share * total, cfg.host_os_margin_min_gb * GIB), cfg.host_os_margin_max_gb * GIB)
    budget = int(total - margin)
    text = (f"host RAM budget {budget / GIB:.1f} GB = {total / GIB:.1f} GB of RAM − {margin / GIB:.1f} GB for the OS "
            f"and other programs ({cfg.host_os_margin_share:.0%}, {cfg.host_os_margin_min_gb:g}–"
            f"{cfg.host_os_margin_max_gb:g} GB)")
    limit = cgroup_memory_limit() if limit is None else limit
    if limit and limit - cfg.host_cgroup_margin_gb * GIB < budget:
        budget = int(limit - cfg.host_cgroup_margin_gb * GIB)
        text = (f"host RAM budget {budget / GIB:.1f} GB = this cgroup's memory limit {limit / GIB:.1f} GB − "
                f"{cfg.host_cgroup_margin_gb:g} GB")
    return max(budget, 0), text + "; change it with --host-ram-gb"


def rss_breakdown(pid: int | str = "self") -> dict[str, int]:
    """Resident memory of a process in bytes: rss, anon, file, shmem, and the peak (hwm), from /proc (Linux);
    elsewhere rss and anon are psutil's RSS (Windows: the working set) and the rest 0."""
    text = (_read(Path(f"/proc/{pid}/status")) if _linux() else None) or ""
    keys = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem", "VmHWM": "hwm"}
    out = {v: 0 for v in keys.values()}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in keys:
            out[keys[name]] = int(rest.split()[0]) * 1024
    if not out["rss"]:                         # not Linux: psutil's RSS, unsplit
        import psutil

        out["rss"] = out["anon"] = psutil.Process(os.getpid() if pid == "self" else int(pid)).memory_info().rss
    return out


def process_overhead(held: int, gpu: bool = False) -> int:
    """Bytes the process holds besides `held` (its host packs' RAM), measured now."""
    rss = rss_breakdown()
    own = rss["anon"] + rss["file"] + rss["shmem"] - held
    if gpu:
        import torch

        if not torch.cuda.is_initialized():
            own += CUDA_CONTEXT_ESTIMATE
    return max(int(own), OVERHEAD_FLOOR)


def job_working_bytes(frames: int, height: int, width: int, window: int) -> int:
    """Host bytes a job adds while it runs (see the module docstring)."""
    frame = height * width * 3
    decoded = (2 * window + 1) * 4 * frame * 4          # one section's decode, float32
    return int(frames * frame * 2 + 2 * decoded)

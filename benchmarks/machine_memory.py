"""What the host-RAM benchmark needs of the machine: a cgroup v2 with a memory limit for a child process, a sampler
of a process's RSS peaks (anon / file / shmem), and the page cache emptied of the weight files (or entirely)."""
from __future__ import annotations

import logging
import os
import subprocess
import threading
from pathlib import Path

log = logging.getLogger("benchmarks.hostram")
CGROUP_ROOT = Path("/sys/fs/cgroup")


class Cgroup:
    """A cgroup v2 with memory.max (and no swap) that a child enters before it runs; None-safe when unavailable."""

    def __init__(self, name: str, limit: int):
        self.path: Path | None = None
        self.reason = ""
        if not (CGROUP_ROOT / "cgroup.controllers").exists():
            self.reason = "no cgroup v2 at /sys/fs/cgroup"
            return
        if "memory" not in (CGROUP_ROOT / "cgroup.controllers").read_text().split():
            self.reason = "the memory controller is not available in /sys/fs/cgroup"
            return
        path = CGROUP_ROOT / f"steadyframe-hostram-{name}-{os.getpid()}"
        try:
            if "memory" not in (CGROUP_ROOT / "cgroup.subtree_control").read_text().split():
                (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory")
            path.mkdir()
            (path / "memory.max").write_text(str(limit))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
        except OSError as e:
            self.reason = f"cannot make a memory cgroup: {e}"
            if path.exists():
                path.rmdir()
            return
        self.path = path

    def enter(self) -> None:                                   # runs in the child before exec
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def read(self) -> dict:
        if self.path is None:
            return {"cgroup": None, "cgroup_note": self.reason}
        out = {"cgroup": str(self.path), "memory_max": int((self.path / "memory.max").read_text())}
        for name in ("memory.peak", "memory.events"):
            f = self.path / name
            out[name] = f.read_text().strip() if f.exists() else None
        return out

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError as e:
                log.warning("could not remove %s: %s", self.path, e)


def sample_rss(pid: int, peaks: dict, stop: threading.Event) -> None:
    from memory.hostbudget import rss_breakdown

    while not stop.is_set():
        now = rss_breakdown(pid)
        if now["rss"]:
            for k, v in now.items():
                peaks[k] = max(peaks.get(k, 0), v)
            peaks["anon+file"] = max(peaks.get("anon+file", 0), now["anon"] + now["file"])
        stop.wait(0.05)


def evict_weight_files(model_dir: Path) -> int:
    """Evict the weight files from the page cache (so what a config reads is charged to its own cgroup and comes
    from the disk, as on a machine whose RAM cannot keep them); returns the bytes of the files."""
    total = 0
    for path in Path(model_dir).rglob("*.safetensors"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def drop_caches() -> str:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "dropped"
    except (OSError, subprocess.CalledProcessError) as e:
        return f"not dropped ({e})"

"""Releasing cached GPU memory between stages, and a one-line memory status.

``trim()`` runs the garbage collector and ``torch.cuda.empty_cache()`` (frees PyTorch's cached, unused blocks;
never memory held by live tensors). PyTorch's default (native) allocator uses plain hipMalloc/hipFree, so trimming
a stream-ordered pool would not release anything there; only with ``backend:hipMallocAsync`` is the pool used, and
its ``empty_cache`` already trims it (docs/FACTS.md) - ``pool_trimmed`` says whether that was the case.
On CPU it only runs the garbage collector.

``job_heap()`` keeps the objects that existed before a job (the loaded models, the app) out of the collector's
passes while the job runs (``gc.freeze``): a trim between stages, and the job-end trim, then scan only what the job
made. With the full-size models loaded a full pass took about 0.2 s on the GPU machine (0.4 s on a 2-core one,
0.75 s in a test process that has imported everything), and a job trims after every stage (12 times for 4
sections). Old objects the job released into a reference cycle (a model swapped out, a cache entry replaced) are
collected by a full pass when the heap is given back, at the end of a job that ends ``FULL_PASS_EVERY_S`` or more
after the last full pass: every real job (a minute or more on any GPU) has one, as before; tiny jobs in a row (the
test suite's: 0.75 s of a 2 s job) share one every 30 s. The job's own garbage is collected at its end either way.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import time
from dataclasses import dataclass

from common.environment import read_environment
from common.units import GIB

logger = logging.getLogger(__name__)


def synchronize(device) -> None:
    """Wait for the GPU's queued work on `device` (a torch.device, or anything with ``.type``); nothing on CPU."""
    if getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class TrimReport:
    label: str
    device: str | None              # None: no GPU
    backend: str | None             # allocator backend: 'native' | 'cudaMallocAsync' (hipMallocAsync on ROCm)
    allocated_before: int | None
    reserved_before: int | None
    allocated_after: int | None
    reserved_after: int | None
    gc_objects: int
    pool_trimmed: bool
    elapsed_s: float

    @property
    def freed_bytes(self) -> int:
        """Bytes of reserved (cached) GPU memory released; 0 on CPU."""
        if self.reserved_before is None or self.reserved_after is None:
            return 0
        return max(0, self.reserved_before - self.reserved_after)

    def __str__(self) -> str:
        name = f"trim {self.label}".strip()
        if self.device is None:
            return f"{name}: no GPU; gc collected {self.gc_objects} objects"
        before, after = (self.allocated_before or 0, self.reserved_before or 0), \
            (self.allocated_after or 0, self.reserved_after or 0)                   # (all set with a GPU)
        return (f"{name} on {self.device}: allocated {before[0] / GIB:.2f} -> "
                f"{after[0] / GIB:.2f} GiB, reserved {before[1] / GIB:.2f} -> "
                f"{after[1] / GIB:.2f} GiB, freed {self.freed_bytes / GIB:.2f} GiB "
                f"({self.backend}{', pool trimmed' if self.pool_trimmed else ''}, {self.elapsed_s * 1000:.0f} ms)")


def _gpu_available(initialized_only: bool = True) -> bool:
    if "torch" not in sys.modules:   # nothing of torch's to release, and no reason to import it
        return False
    import torch

    return torch.cuda.is_available() and (torch.cuda.is_initialized() or not initialized_only)


def _glibc():
    """glibc's malloc functions (malloc_trim, mallopt), or None where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def release_host_heap() -> bool:
    """Give the C heap's free pages back to the OS (glibc's malloc_trim); False where that does not exist."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


HOST_MMAP_THRESHOLD = 4 * 2**20      # blocks this large get their own mapping, returned to the OS when freed
HOST_TRIM_THRESHOLD = 8 * 2**20      # free memory at the top of a heap beyond this goes back to the OS at once
_GLIBC_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def configure_host_heap(environ=None, *, mmap_threshold: int = HOST_MMAP_THRESHOLD,
                        trim_threshold: int = HOST_TRIM_THRESHOLD) -> str:
    """Fix glibc's mmap and trim thresholds for this long-running process (app.py and the CLI, at start).

    By default glibc raises both thresholds each time a large block is freed (up to 32 and 64 MB), after which it
    keeps up to 64 MB of freed memory per heap: between jobs the app's RSS then wanders by tens of MB, and
    malloc_trim cannot return what another thread still holds at that moment. Fixed thresholds switch that
    adjustment off. The user's own malloc settings (MALLOC_*_ or GLIBC_TUNABLES=glibc.malloc...) win, and
    STEADYFRAME_HOST_HEAP=off leaves glibc alone. Returns what was done, for the log."""
    env = os.environ if environ is None else environ
    if not read_environment(env).host_heap:
        return "host heap: left alone (STEADYFRAME_HOST_HEAP=off)"
    own = [v for v in _GLIBC_MALLOC_ENV if v in env]
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        own.append("GLIBC_TUNABLES")
    if own:
        return f"host heap: your settings kept ({', '.join(own)})"
    libc = _glibc()
    if libc is None:
        return "host heap: not glibc, left alone"
    m_trim_threshold, m_mmap_threshold = -1, -3          # glibc's malloc.h
    if not (libc.mallopt(m_mmap_threshold, int(mmap_threshold)) == 1
            and libc.mallopt(m_trim_threshold, int(trim_threshold)) == 1):
        return "host heap: glibc refused the thresholds, left as it was"
    return (f"host heap: glibc mmap threshold {mmap_threshold >> 20} MiB, trim threshold {trim_threshold >> 20} MiB "
            "(fixed, so freed memory goes back to the OS)")


FULL_PASS_EVERY_S = 30.0          # a full collection at a job's end once this long has passed since the last
_last_full_pass: float | None = None
_clock = time.monotonic


@contextlib.contextmanager
def job_heap():
    """Within the block the garbage collector leaves alone every object that exists at its start (see the module
    docstring); they are handed back to it on exit, whatever ends the block, and the whole heap is collected then
    if the last such full pass is `FULL_PASS_EVERY_S` old (or there was none)."""
    global _last_full_pass
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        if _last_full_pass is None or _clock() - _last_full_pass >= FULL_PASS_EVERY_S:
            started = time.perf_counter()
            collected = gc.collect()
            _last_full_pass = _clock()
            logger.debug("full collection after the job: %d objects in %.2f s", collected,
                         time.perf_counter() - started)


def trim(label: str = "", device=None, *, host: bool = False) -> TrimReport:
    """Garbage-collect and empty PyTorch's GPU cache; returns before/after figures (see module docstring).
    ``host=True`` also returns freed host heap to the OS (between jobs: keeps a long-running app's RSS flat)."""
    started = time.perf_counter()
    collected = gc.collect()
    if host:
        release_host_heap()
    if not _gpu_available():
        report = TrimReport(label, None, None, None, None, None, None, collected, False,
                            time.perf_counter() - started)
        logger.debug("%s", report)
        return report
    import torch

    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize(dev)
    alloc_before, reserved_before = torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)
    torch.cuda.empty_cache()
    torch.cuda.synchronize(dev)
    try:
        backend = torch.cuda.get_allocator_backend()
    except (AttributeError, RuntimeError):
        backend = "native"
    report = TrimReport(label, str(dev), backend, alloc_before, reserved_before, torch.cuda.memory_allocated(dev),
                        torch.cuda.memory_reserved(dev), collected, backend != "native",
                        time.perf_counter() - started)
    logger.info("%s", report)
    return report


def memory_status(device=None) -> str:
    """'allocated 1.20 GiB, reserved 2.00 GiB, free 10.31 / 23.98 GiB' for a GPU; a short note on CPU."""
    if not _gpu_available(initialized_only=False):
        return "no GPU (CPU only)"
    import torch

    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if dev.type != "cuda":
        return f"{dev.type} device (no GPU memory figures)"
    free, total = torch.cuda.mem_get_info(dev)
    return (f"allocated {torch.cuda.memory_allocated(dev) / GIB:.2f} GiB, reserved "
            f"{torch.cuda.memory_reserved(dev) / GIB:.2f} GiB, free {free / GIB:.2f} / {total / GIB:.2f} GiB")

"""Logging around one VAE decode, with a stall watchdog.

``vae_decode_log`` logs the latents' shape/device/dtype, the VAE's device/dtype, memory before and after, the
conv tiers used (when given the ``ConvFallback``), synchronises the GPU before and after, and times the decode.
While it runs, a watchdog timer waits; if the decode outlives it, it logs which stage, latents shape and conv
signature it was on and writes every thread's stack (most recent call first) to a file.

The stacks are read in the timer's thread from ``sys._current_frames()``, holding the GIL. They were written by
``faulthandler.dump_traceback_later``, whose C thread reads the other threads' frames without the GIL: a thread that
ran Python meanwhile crashed the whole process mid-dump (the CI saw a test worker die so, its dump cut off in another
thread's frame). A stuck GPU or MIOpen call releases the GIL (PyTorch's ops do), so the stuck thread's Python stack
is still read; only a thread stuck in native code while holding the GIL would keep the timer (and the log line) from
running at all.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from configs.rocm_profiles import DEFAULTS
from rocm.allocator import memory_status as default_memory_status
from rocm.allocator import synchronize

_logger = logging.getLogger(__name__)


@dataclass
class VaeDecodeRecord:
    stage: str
    latents_shape: tuple[int, ...]
    latents_device: str
    latents_dtype: str
    vae_device: str
    vae_dtype: str
    memory_before: str | None = None
    memory_after: str | None = None
    elapsed_s: float | None = None
    success: bool | None = None
    error: str | None = None
    stalled: bool = False
    tiers: dict[int, int] = field(default_factory=dict)      # conv calls per tier during this decode
    fell_back: list[str] = field(default_factory=list)        # signatures that fell back during this decode


class StallWatchdog:
    """After ``timeout_s``: write every thread's stack to ``file`` and log ``describe()``. No kill."""

    def __init__(self, timeout_s: float | None, describe: Callable[[], str], *, file=None, logger=None,
                 on_stall: Callable[[], None] | None = None):
        self.timeout_s = timeout_s
        self.describe = describe
        self.file: Any = file if file is not None else sys.__stderr__
        self.logger = logger or _logger
        self.on_stall = on_stall
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        if not self.timeout_s or self.timeout_s <= 0:
            return
        self._timer = threading.Timer(self.timeout_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        if self.on_stall is not None:
            self.on_stall()
        where = getattr(self.file, "name", "stderr")
        try:
            self.file.write(all_stacks(f"Timeout ({self.timeout_s:g} s)! Stacks of all threads"))
            self.file.flush()
        except (OSError, ValueError, AttributeError) as exc:     # closed, or no file to write to
            where = f"nowhere ({exc})"
        self.logger.warning("STALL: still running after %.0f s: %s. Stacks of all threads written to %s.",
                            self.timeout_s, self.describe(), where)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def all_stacks(title: str) -> str:
    """Every thread's Python stack, most recent call first, under `title` (read while holding the GIL)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = [f"{title} (most recent call first):"]
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue                             # this timer's own
        lines.append(f"Thread {ident:#x} ({names.get(ident, '?')}):")
        lines += [f'  File "{f.filename}", line {f.lineno} in {f.name}'
                  for f in reversed(traceback.extract_stack(frame))]
    return "\n".join(lines) + "\n"


def _device_dtype_of(module) -> tuple[str, str]:
    try:
        param = next(module.parameters())
    except (StopIteration, AttributeError, TypeError):
        return "unknown", "unknown"
    return str(param.device), str(param.dtype).replace("torch.", "")


@contextlib.contextmanager
def vae_decode_log(vae, latents, *, stage: str = "VAE decode",
                   stall_timeout_s: float | None = DEFAULTS.stall_timeout_s, logger: logging.Logger | None = None,
                   memory_status: Callable[[], str] | None = None, fallback=None, dump_file=None):
    """Context manager around ``vae.decode(latents)``; yields a ``VaeDecodeRecord`` filled in on exit.

    ``memory_status``: a callable returning one line (memory/ passes its own); default: allocated/reserved/free.
    ``fallback``: a ``rocm.ConvFallback``; if given it is active (installed, with the hang probe on ROCm) for the
    block and the record gets the tiers it used. ``dump_file``: where the stacks of a stall are written (default stderr).
    Exceptions propagate after being logged.
    """
    log = logger or _logger
    device = latents.device
    vae_device, vae_dtype = _device_dtype_of(vae)
    rec = VaeDecodeRecord(stage, tuple(latents.shape), str(device), str(latents.dtype).replace("torch.", ""),
                          vae_device, vae_dtype)
    status = memory_status or (lambda: default_memory_status(device if device.type == "cuda" else None))
    stats_before = fallback.stats() if fallback is not None else None

    def describe() -> str:
        conv = getattr(fallback, "current", None)
        return f"{stage}, latents {rec.latents_shape}" + (f", conv {conv.short()}" if conv else "")

    def mark_stalled() -> None:
        rec.stalled = True

    # The watchdog comes first: on a wedged GPU the memory query and the first synchronize can hang already.
    watchdog = StallWatchdog(stall_timeout_s, describe, file=dump_file, logger=log, on_stall=mark_stalled)
    scope = contextlib.ExitStack()
    started = time.perf_counter()
    watchdog.start()
    try:
        rec.memory_before = status()
        log.info("%s: start; latents %s on %s (%s); VAE on %s (%s); memory: %s", stage, rec.latents_shape,
                 rec.latents_device, rec.latents_dtype, vae_device, vae_dtype, rec.memory_before)
        synchronize(device)
        if fallback is not None:
            scope.enter_context(fallback.guarded(stage))
        with scope:
            yield rec
            synchronize(device)
        rec.success = True
    except BaseException as exc:
        rec.success = False
        rec.error = f"{type(exc).__name__}: {exc}"
        log.error("%s failed after %.2f s: %s", stage, time.perf_counter() - started, rec.error)
        raise
    finally:
        watchdog.stop()
        rec.elapsed_s = time.perf_counter() - started
        if stats_before is not None:
            after = fallback.stats()
            rec.tiers = after.delta(stats_before)
            seen = {ev.signature: ev.count for ev in stats_before.fell_back}
            rec.fell_back = [ev.signature for ev in after.fell_back if ev.count > seen.get(ev.signature, 0)]
            fallback.flush()
        try:
            rec.memory_after = status()
        except RuntimeError as exc:   # a GPU in a bad state must not hide the decode's own error
            rec.memory_after = f"unavailable ({exc})"
        log.info("%s: %s in %.2f s; conv tiers %s%s; memory: %s", stage, "ok" if rec.success else "FAILED",
                 rec.elapsed_s, rec.tiers or "n/a", f"; fell back: {rec.fell_back}" if rec.fell_back else "",
                 rec.memory_after)

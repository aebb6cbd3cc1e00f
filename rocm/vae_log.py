"""Logging around one VAE decode, with a stall watchdog.

``vae_decode_log`` logs the latents' shape/device/dtype, the VAE's device/dtype, memory before and after, the
conv tiers used (when given the ``ConvFallback``), synchronises the GPU before and after, and times the decode.
While it runs, a watchdog arms ``faulthandler.dump_traceback_later`` (dumps every thread's stack even while one
is stuck in native code) and a timer that logs which stage, latents shape and conv signature it was on.
``faulthandler`` holds one pending dump per process: do not nest two watchdogs.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import sys
import threading
import time
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
    """After ``timeout_s``: dump all stacks (faulthandler, to ``file``) and log ``describe()``. No kill."""

    def __init__(self, timeout_s: float | None, describe: Callable[[], str], *, file=None, logger=None,
                 on_stall: Callable[[], None] | None = None):
        self.timeout_s = timeout_s
        self.describe = describe
        self.file: Any = file if file is not None else sys.__stderr__
        self.logger = logger or _logger
        self.on_stall = on_stall
        self._timer: threading.Timer | None = None
        self._armed_faulthandler = False

    def start(self) -> None:
        if not self.timeout_s or self.timeout_s <= 0:
            return
        try:
            faulthandler.dump_traceback_later(self.timeout_s, repeat=False, file=self.file, exit=False)
            self._armed_faulthandler = True
        except (ValueError, AttributeError, OSError, RuntimeError) as exc:   # no usable stderr file descriptor
            self.logger.warning("stall watchdog: no stack dump possible (%s)", exc)
        self._timer = threading.Timer(self.timeout_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        if self.on_stall is not None:
            self.on_stall()
        self.logger.warning("STALL: still running after %.0f s: %s. Stacks of all threads dumped by faulthandler "
                            "to %s.", self.timeout_s, self.describe(), getattr(self.file, "name", "stderr"))

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._armed_faulthandler:
            faulthandler.cancel_dump_traceback_later()
            self._armed_faulthandler = False


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
    block and the record gets the tiers it used. ``dump_file``: where faulthandler writes (default stderr).
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

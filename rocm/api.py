"""The names users of the AMD field notes know, as thin wrappers around ``rocm.ConvFallback``.

They share one default ``ConvFallback``, created on first use (never at import). It exists only for this API: the
app never uses it (each ``memory.MemoryManager`` holds its own ``ConvFallback`` and passes it explicitly). These
exist so that the field notes' recipes run as written
(tests/test_rocm_seed_api.py runs each of them):

    initialize_miopen_fallback(use_monkey_patch=True, verbose=True)   # patches F.conv2d / F.conv3d
    MIOpenFallbackHandler.print_stats()
    with miopen_safe_execution("VAE decode"): ...                       # or @with_miopen_fallback
    enable_miopen_bypass(strategy=FallbackStrategy.SELECTIVE)          # or "CPU_FALLBACK", ...
    config = Conv2dBypassConfig(strategy=FallbackStrategy.AUTO, size_threshold=42)   # pixels
    conv = SafeConv2d(3, 64, kernel_size=3, padding=1, config=config); conv.get_bypass_stats()
    model = patch_model(model); print_bypass_report(model)

What differs from the notes: nothing sets MIOpen variables at run time (MIOpen reads them once per process; the
environment profile in ``rocm.env`` sets the real ones before torch starts), and "CPU fallback" is the last of
four tiers, not the first answer to an error.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
from typing import Any

from configs.rocm_profiles import CPU
from rocm import safe_conv
from rocm.conv_fallback import ConvFallback, new_conv_fallback
from rocm.policy import BypassConfig, BypassStrategy, Conv2dBypassConfig, FallbackStrategy
from rocm.safe_conv import bypass_report, patched_layers, unpatch_model

logger = logging.getLogger(__name__)


class _DefaultHolder:
    """Holds the lazily created default instance (no instance exists until first asked for)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instance: ConvFallback | None = None


_default = _DefaultHolder()


def get_default_fallback() -> ConvFallback:
    """The shared ``ConvFallback`` of the field-notes API (reads the fault plan from STEADYFRAME_CONV_FAULTS)."""
    with _default.lock:
        if _default.instance is None:
            _default.instance = new_conv_fallback()
        return _default.instance


def set_default_fallback(fallback: ConvFallback | None) -> None:
    """Replace (or with None, drop) the shared instance, uninstalling the old one."""
    with _default.lock:
        old, _default.instance = _default.instance, fallback
    if old is not None and old is not fallback:
        old.uninstall()


def initialize_miopen_fallback(use_monkey_patch: bool = True, verbose: bool = True, **kwargs) -> ConvFallback:
    """Create the default fallback (``kwargs`` go to ``ConvFallback``) and, with ``use_monkey_patch``, patch
    ``F.conv2d`` / ``F.conv3d`` so every ``nn.Conv2d``/``nn.Conv3d`` goes through it. ``verbose``: say what it
    did at INFO level (else DEBUG)."""
    fallback = ConvFallback(**kwargs) if kwargs else None
    if fallback is not None:
        set_default_fallback(fallback)
    fallback = get_default_fallback()
    if use_monkey_patch:
        fallback.install()
    else:                       # after an earlier use_monkey_patch=True: the global patch comes off, as asked
        fallback.uninstall()
    logger.log(logging.INFO if verbose else logging.DEBUG,
               "conv fallback initialised: %s; tiers 1 MIOpen/cuDNN -> 2 MIOpen off -> 3 exact 2D decomposition "
               "-> 4 the same, MIOpen off -> 5 CPU, first tier by strategy %s", "F.conv2d/F.conv3d patched" if use_monkey_patch else
               "not patched (use patch_model or miopen_safe_execution)", fallback.bypass.strategy.name)
    return fallback


class MIOpenFallbackHandler:
    """The field notes' statistics holder, reading the shared fallback's counts (no state of its own)."""

    @staticmethod
    def stats(fallback: ConvFallback | None = None) -> dict:
        """``cpu_attempts`` / ``cpu_successes`` (tier 5, the notes' counters) plus the calls per tier."""
        snap = (fallback or get_default_fallback()).stats()
        return {"cpu_attempts": snap.attempts_per_tier.get(CPU, 0), "cpu_successes": snap.calls_per_tier.get(CPU, 0),
                "calls_per_tier": dict(snap.calls_per_tier), "fell_back": len(snap.fell_back),
                "failed_in_every_tier": snap.exhausted}

    @classmethod
    def print_stats(cls, file=None, fallback: ConvFallback | None = None) -> str:
        """Write the statistics (the notes' two counters, then the full per-job report) and return the text."""
        s = cls.stats(fallback)
        text = (f"=== MIOpen Fallback Statistics ===\nCPU fallback attempts: {s['cpu_attempts']}, successes: "
                f"{s['cpu_successes']}\n" + (fallback or get_default_fallback()).report())
        (file or sys.stdout).write(text + "\n")
        return text


@contextlib.contextmanager
def miopen_safe_execution(name: str = "block", fallback: ConvFallback | None = None):
    """Run the block with the fallback active (installed for the block if it was not) and log the block's
    convolution statistics under ``name``. Yields the fallback."""
    fb = fallback or get_default_fallback()
    before = fb.stats()
    with fb.active():
        try:
            yield fb
        finally:
            delta = fb.stats().delta(before)
            if delta:
                logger.info("%s: conv calls per tier %s", name, delta)


def with_miopen_fallback(func=None, *, name: str | None = None, fallback: ConvFallback | None = None):
    """Decorator: ``@with_miopen_fallback`` or ``@with_miopen_fallback(name=...)`` runs the function inside
    ``miopen_safe_execution``."""
    def decorate(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            with miopen_safe_execution(name or f.__qualname__, fallback):
                return f(*args, **kwargs)
        return wrapper

    return decorate(func) if func is not None else decorate


def enable_miopen_bypass(strategy=BypassStrategy.AUTO, verbose: bool = True,
                         size_threshold: float | None = None, config: BypassConfig | None = None,
                         fallback: ConvFallback | None = None, *, model=None) -> BypassConfig:
    """Set the bypass strategy of the (default) fallback (SafeConv layers without a ``config`` of their own
    follow it); see ``rocm.policy.BypassStrategy`` for what each does. ``size_threshold`` is in pixels (the larger
    spatial side of a conv input; default 42). No environment variable is touched. Returns the config.

    ``enable_miopen_bypass(model)`` (the notes' "all Conv2d layers will be safe"): a model as the first argument
    (or ``model=``) also gets its Conv2d/Conv3d layers routed through the fallback (``patch_model``), with the
    AUTO strategy unless ``strategy=`` names another."""
    if callable(getattr(strategy, "named_modules", None)):      # a model (duck-typed: rocm imports no torch here)
        model, strategy = strategy, BypassStrategy.AUTO
    if config is None:
        kwargs: dict[str, Any] = {} if size_threshold is None else {"size_threshold": float(size_threshold)}
        config = BypassConfig(BypassStrategy(strategy), verbose=verbose, **kwargs)
    fb = fallback or get_default_fallback()
    fb.bypass = config
    logger.log(logging.INFO if verbose else logging.DEBUG, "conv bypass: strategy %s, size threshold %g px",
               config.strategy.name, config.size_threshold)
    if model is not None:
        safe_conv.patch_model(model, None, True, fallback=fb)
    return config


class SafeConv2d(safe_conv.SafeConv2d):
    """``rocm.safe_conv.SafeConv2d`` whose default fallback is this API's shared one."""

    def _get_fallback(self):
        return self.fallback or get_default_fallback()


class SafeConv3d(safe_conv.SafeConv3d):
    """``rocm.safe_conv.SafeConv3d`` whose default fallback is this API's shared one."""

    def _get_fallback(self):
        return self.fallback or get_default_fallback()


def patch_model(model, config=None, recursive: bool = True, *, fallback: ConvFallback | None = None):
    """``rocm.safe_conv.patch_model`` with this API's shared fallback as the layers' default (so the strategy set
    by ``enable_miopen_bypass`` applies to them, as in the field notes)."""
    if isinstance(config, ConvFallback):         # patch_model(model, fallback) of earlier versions
        config, fallback = None, config
    return safe_conv.patch_model(model, config, recursive, fallback=fallback or get_default_fallback())


def print_bypass_report(model, file=None) -> str:
    """Write the per-layer report (forwards, bypasses, tier) of a ``patch_model``-ed model to ``file``
    (default stdout) and return it."""
    text = bypass_report(model)
    (file or sys.stdout).write(text + "\n")
    return text


def print_job_statistics(fallback: ConvFallback | None = None, file=None) -> str:
    """Write the per-job statistics (calls per tier, shapes that fell back) and return them."""
    text = (fallback or get_default_fallback()).report()
    (file or sys.stdout).write(text + "\n")
    return text


__all__ = ["BypassConfig", "BypassStrategy", "Conv2dBypassConfig", "FallbackStrategy", "MIOpenFallbackHandler",
           "SafeConv2d", "SafeConv3d", "enable_miopen_bypass", "get_default_fallback", "initialize_miopen_fallback",
           "miopen_safe_execution", "patch_model", "patched_layers", "print_bypass_report", "print_job_statistics",
           "set_default_fallback", "unpatch_model", "with_miopen_fallback"]

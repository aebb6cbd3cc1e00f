"""The names users of the AMD field notes know, as thin wrappers around ``rocm.ConvFallback``.

They share one default ``ConvFallback``, created on first use (never at import). Prefer passing your own
``ConvFallback`` object around in new code; these exist so that field-note recipes keep working:

    initialize_miopen_fallback()                  # patches F.conv2d / F.conv3d
    enable_miopen_bypass(BypassStrategy.SELECTIVE, size_threshold=42)
    model = patch_model(model); ...; print_bypass_report(model)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading

from rocm.conv_fallback import ConvFallback
from rocm.faults import FaultPlan
from rocm.policy import BypassConfig, BypassStrategy
from rocm.safe_conv import SafeConv2d, SafeConv3d, bypass_report, patch_model, unpatch_model

logger = logging.getLogger(__name__)


class _DefaultHolder:
    """Holds the lazily created default instance (no instance exists until first asked for)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.instance: ConvFallback | None = None


_default = _DefaultHolder()


def get_default_fallback() -> ConvFallback:
    """The shared ``ConvFallback`` of the field-notes API (reads the fault plan from STEADYFRAME_CONV_FAULTS)."""
    with _default.lock:
        if _default.instance is None:
            _default.instance = ConvFallback(fault_plan=FaultPlan.from_env())
        return _default.instance


def set_default_fallback(fallback: ConvFallback | None) -> None:
    """Replace (or with None, drop) the shared instance, uninstalling the old one."""
    with _default.lock:
        old, _default.instance = _default.instance, fallback
    if old is not None and old is not fallback:
        old.uninstall()


def initialize_miopen_fallback(use_monkey_patch: bool = True, **kwargs) -> ConvFallback:
    """Create the default fallback (``kwargs`` go to ``ConvFallback``) and, with ``use_monkey_patch``, patch
    ``F.conv2d`` / ``F.conv3d`` so every ``nn.Conv2d``/``nn.Conv3d`` goes through it."""
    fallback = ConvFallback(**kwargs) if kwargs else None
    if fallback is not None:
        set_default_fallback(fallback)
    fallback = get_default_fallback()
    if use_monkey_patch:
        fallback.install()
    return fallback


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


def enable_miopen_bypass(strategy: BypassStrategy | str = BypassStrategy.AUTO, size_threshold: float = 42,
                         config: BypassConfig | None = None, fallback: ConvFallback | None = None) -> BypassConfig:
    """Set the bypass strategy of the (default) fallback; see ``rocm.policy.BypassStrategy`` for what each does.
    ``size_threshold`` is in MiB of the conv's input tensor. No environment variable is touched."""
    cfg = config or BypassConfig(BypassStrategy(strategy), float(size_threshold))
    fb = fallback or get_default_fallback()
    fb.bypass = cfg
    logger.info("conv bypass: %s above %.0f MiB of input", cfg.strategy.value, cfg.size_threshold_mib)
    return cfg


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


__all__ = ["BypassConfig", "BypassStrategy", "SafeConv2d", "SafeConv3d", "enable_miopen_bypass",
           "get_default_fallback", "initialize_miopen_fallback", "miopen_safe_execution", "patch_model",
           "print_bypass_report", "print_job_statistics", "set_default_fallback", "unpatch_model",
           "with_miopen_fallback"]

"""Which errors move a convolution to the next tier, and the exact texts the real failures carry."""

from __future__ import annotations

# Texts of the real failures (used by the fault-injection seam, so the classifier is tested on them).
MIOPEN_UNKNOWN_TEXT = "miopenStatusUnknownError"
NO_ALGORITHM_TEXT = "No suitable algorithm was found to execute the required convolution"
HIP_OOM_TEXT = ("HIP out of memory. Tried to allocate 7.70 GiB. GPU 0 has a total capacity of 23.98 GiB of which "
                "1.02 GiB is free.")

_VENDOR_MARKERS = (
    "miopen", "no suitable algorithm", "hip error", "hiperror", "hsa_status", "hipblas", "rocblas",
    "cudnn_status", "cudnn error", "unable to find a valid cudnn algorithm", "cublas_status", "cuda error",
)
_OOM_MARKERS = ("out of memory", "failed to allocate", "memoryregion::blockallocator")


class TierDeclined(Exception):
    """A tier cannot compute this call exactly (e.g. an unsupported dtype); go to the next tier."""


class ConvFallbackExhausted(RuntimeError):
    """Every allowed tier failed for one convolution."""


class ProbeUndecided(RuntimeError):
    """The hang probe could not run a convolution at all (its child never became ready, or died before the job):
    nothing is known about that tier, and running it in the app's own process could freeze the app, so the
    job stops here with advice. Not a GPU error of the convolution itself: it never moves to another tier."""


def is_oom_text(text: str) -> bool:
    """Does this error text (a child's stderr, a message) say the GPU ran out of memory?"""
    low = text.lower()
    return any(m in low for m in _OOM_MARKERS) or "outofmemory" in low


def last_line(text: str) -> str:
    """The last non-empty line of a traceback (the exception and its message), not its first characters."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip() and set(line.strip()) != {"^"}]
    return lines[-1] if lines else text.strip()


def classify_error(exc: BaseException) -> str | None:
    """'oom', 'vendor' (MIOpen/cuDNN/HIP/BLAS), 'declined', or None for an error that is not the GPU's fault
    (a wrong shape, a dtype mismatch...), which must propagate unchanged."""
    if isinstance(exc, TierDeclined):
        return "declined"
    if isinstance(exc, ProbeUndecided):
        return None
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return "oom"
    except ImportError:  # pragma: no cover - torch is always there when convolutions run
        pass
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc).lower()
    if any(m in text for m in _OOM_MARKERS):
        return "oom"
    if any(m in text for m in _VENDOR_MARKERS):
        return "vendor"
    return None

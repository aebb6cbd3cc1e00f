"""Which errors move a convolution to the next tier, and the exact texts the real failures carry."""

from __future__ import annotations

# Texts of the real failures (used by the fault-injection seam, so the classifier is tested on them).
MIOPEN_UNKNOWN_TEXT = "miopenStatusUnknownError"
NO_ALGORITHM_TEXT = "No suitable algorithm was found to execute the required convolution"
ILLEGAL_ACCESS_TEXT = ("HIP error: an illegal memory access was encountered\nHIP kernel errors might be asynchronously "
                       "reported at some other API call, so the stacktrace below might be incorrect.")
HIP_OOM_TEXT = ("HIP out of memory. Tried to allocate 7.70 GiB. GPU 0 has a total capacity of 23.98 GiB of which "
                "1.02 GiB is free.")

# What the convolution libraries say when their algorithm search finds nothing that runs this convolution: the only
# failures saved as a shape's verdict (rocm/verdicts.py), since they hold for this build whenever it runs.
_ALGORITHM_MARKERS = (
    "miopen", "no suitable algorithm", "cudnn_status", "cudnn error", "unable to find a valid cudnn algorithm",
)
# Other GPU-library errors: the next tier is tried, for this process only (nothing saved).
_LIBRARY_MARKERS = ("hip error", "hiperror", "hsa_status", "hipblas", "rocblas", "cublas_status", "cuda error")
# A GPU fault (the texts of CUDA's and HIP's sticky errors, ROCr's memory faults): the GPU's state is lost, so no
# tier can go on in this process; the job fails with a message and nothing is saved (the next job tries again).
_FAULT_MARKERS = (
    "illegal memory access", "illegal address", "unspecified launch failure", "illegal instruction",
    "misaligned address", "memory access fault", "page fault", "device-side assert", "hardware exception",
    "uncorrectable ecc", "memory_aperture_violation", "hsa_status_error_exception",
)
_OOM_MARKERS = ("out of memory", "failed to allocate", "memoryregion::blockallocator")


class TierDeclined(Exception):
    """A tier cannot compute this call exactly (e.g. an unsupported dtype); go to the next tier."""


class ConvFallbackExhausted(RuntimeError):
    """Every allowed tier failed for one convolution."""


class GpuFault(RuntimeError):
    """The GPU faulted while running a convolution (an illegal memory access, a launch failure...): not a verdict on
    the convolution. The job fails with this message; nothing is recorded, so the next job tries it again."""


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


def is_fault_text(text: str) -> bool:
    """Does this error text say the GPU faulted (illegal memory access, launch failure, a memory fault)?"""
    low = text.lower()
    return any(m in low for m in _FAULT_MARKERS)


def classify_error(exc: BaseException) -> str | None:
    """'oom'; 'fault' (the GPU faulted: GpuFault's texts); 'vendor' (MIOpen's or cuDNN's algorithm search found
    nothing: a verdict); 'library' (another HIP/CUDA/BLAS error: the next tier, not saved); 'declined'; or None for
    an error that is not the GPU's (a wrong shape, a dtype mismatch...), which must propagate unchanged."""
    if isinstance(exc, TierDeclined):
        return "declined"
    if isinstance(exc, GpuFault):
        return "fault"
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
    if is_fault_text(text):
        return "fault"
    if any(m in text for m in _ALGORITHM_MARKERS):
        return "vendor"
    if any(m in text for m in _LIBRARY_MARKERS):
        return "library"
    return None

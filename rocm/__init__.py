"""Everything vendor-specific: ROCm environment profile, tiered convolution fallback, hang probe, allocator
trimming, VAE-decode logging and the ``doctor`` report. Safe on CUDA and CPU (does the equivalent or nothing).

Importing this package does NOT import torch: app.py and the CLI do ``import rocm; rocm.apply_env_profile()``
before ``import torch``. Everything that needs torch is loaded on first attribute access.
"""

from __future__ import annotations

import importlib

from rocm.env import EnvReport, EnvWarning, apply_env_profile, apply_torch_settings, check_environment

# name -> module that defines it (imported on first access)
_LAZY = {
    "ConvFallback": "rocm.conv_fallback",
    "FallbackStats": "rocm.stats",
    "FaultPlan": "rocm.faults", "Fault": "rocm.faults",
    "HangProbe": "rocm.probe", "ProbeJob": "rocm.probe", "ProbeResult": "rocm.probe",
    "ConvSignature": "rocm.signature",
    "BypassConfig": "rocm.policy", "BypassStrategy": "rocm.policy", "FallbackStrategy": "rocm.policy",
    "Conv2dBypassConfig": "rocm.policy", "MIOpenFallbackHandler": "rocm.api", "patched_layers": "rocm.safe_conv",
    "TierDeclined": "rocm.errors", "ConvFallbackExhausted": "rocm.errors", "classify_error": "rocm.errors",
    "ProbeUndecided": "rocm.errors",
    "trim": "rocm.allocator", "TrimReport": "rocm.allocator", "memory_status": "rocm.allocator",
    "synchronize": "rocm.allocator", "job_heap": "rocm.allocator", "configure_host_heap": "rocm.allocator",
    "vae_decode_log": "rocm.vae_log", "VaeDecodeRecord": "rocm.vae_log", "StallWatchdog": "rocm.vae_log",
    "detect_arch": "rocm.arch", "detect_runtime": "rocm.arch", "arch_family": "rocm.arch",
    "SafeConv2d": "rocm.api", "SafeConv3d": "rocm.api", "patch_model": "rocm.api",
    "unpatch_model": "rocm.safe_conv", "bypass_report": "rocm.safe_conv",
    "initialize_miopen_fallback": "rocm.api", "miopen_safe_execution": "rocm.api",
    "with_miopen_fallback": "rocm.api", "enable_miopen_bypass": "rocm.api", "print_bypass_report": "rocm.api",
    "print_job_statistics": "rocm.api", "get_default_fallback": "rocm.api", "set_default_fallback": "rocm.api",
    "run_doctor": "rocm.doctor",
}

__all__ = ["EnvReport", "EnvWarning", "apply_env_profile", "apply_torch_settings", "check_environment",
           *sorted(_LAZY)]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rocm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

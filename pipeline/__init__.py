"""pipeline/: FramePack generation, free of globals and of UI.

Imports are lazy so that `python -m pipeline` can apply the ROCm environment profile before torch is imported.
"""
from __future__ import annotations

_EXPORTS = {
    "generate": "pipeline.orchestrator", "CancelToken": "pipeline.cancel",
    "prepare_resume": "pipeline.resume", "PreparedRequest": "pipeline.request",
    "Request": "pipeline.request", "prepare": "pipeline.request",
    "load_components": "pipeline.components", "Components": "pipeline.components",
    "InputError": "pipeline.errors", "WeightsNotFound": "pipeline.errors",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")


__all__ = list(_EXPORTS)

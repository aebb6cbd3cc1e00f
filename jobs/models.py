"""The loaded models, cached per (preset, mode).

The transformer differs per mode (original vs F1), so a mode switch needs other components. For the tiny preset
both sets stay cached (a few MB). For real weights only one set is kept: what it holds in host RAM (up to ~42 GB,
under the host-RAM budget; the rest is read from the weight files) is freed when the other mode's set loads.
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from configs import get_preset

log = logging.getLogger(__name__)


def _default_loader(preset, mode, model_dir):
    from pipeline.components import load_components

    return load_components(preset, mode, model_dir=model_dir)


def models_for(config, device, loader: Callable | None = None) -> "ComponentCache":
    """The models of a process or farm worker (`config`: its Config or WorkerConfig), loaded when a job needs them.
    With --fp8-compute, `device` is checked first: raises pipeline.compiled.Fp8ComputeUnavailable (its message says
    why and what to do) where the GPU has no fp8 cores; where it has them but PyTorch's fp8 product fails (now or
    remembered), one warning and bf16 products."""
    recipe = None
    if config.fp8_compute:
        from pipeline.compiled import Fp8ProductFailed, fp8_recipe

        try:
            recipe = fp8_recipe(device)
        except Fp8ProductFailed as e:     # fp8 cores, but this PyTorch cannot use them: bf16 products, said so
            log.warning("%s. The block products run in bf16 instead (as without --fp8-compute)", e)
    return ComponentCache(config.preset, config.model_dir, loader, fp8_compute=recipe)


class ComponentCache:
    def __init__(self, preset: str, model_dir: Path | None = None, loader: Callable | None = None,
                 fp8_compute: str | None = None):
        """`fp8_compute`: the fp8 product of --fp8-compute ("rowwise" or "tensorwise", pipeline/compiled.py), None: off."""
        self.preset = get_preset(preset)
        self.fp8_compute = fp8_compute
        self.model_dir = model_dir
        self._loader = loader or _default_loader
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def keep_all(self) -> bool:
        return self.preset.tiny

    def is_loaded(self, mode: str) -> bool:
        return mode in self._cache

    def loaded_modes(self) -> list[str]:
        return list(self._cache)

    def transformer_for_checks(self, mode: str):
        """The loaded transformer of `mode`, else its layers without weights from its config (nothing is loaded or
        downloaded for this); None when the config is not on this computer yet."""
        components = self._cache.get(mode)
        if components is not None:
            return components.transformer
        from pipeline.components import transformer_skeleton

        return transformer_skeleton(self.preset, mode, self.model_dir)

    def get(self, mode: str):
        """The components for `mode`, loading them (and dropping the other mode's, for real weights) if needed.
        Raises common.errors.WeightsNotFound when real weights are missing and cannot be downloaded."""
        with self._lock:
            if mode in self._cache:
                return self._cache[mode]
            if not self.keep_all and self._cache:
                log.info("dropping the %s models to make room for mode %s", ", ".join(self._cache), mode)
                self._cache.clear()
                gc.collect()
            log.info("loading the %s models for mode %s", self.preset.name, mode)
            t0 = time.perf_counter()
            components = self._loader(self.preset, mode, self.model_dir)
            log.info("the %s models for mode %s loaded in %.1f s", self.preset.name, mode, time.perf_counter() - t0)
            if self.fp8_compute:
                from pipeline.compiled import use_fp8_compute

                use_fp8_compute(components.transformer, self.fp8_compute)
            self._cache[mode] = components
            return components

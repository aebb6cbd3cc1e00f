"""Features that failed on this GPU with this PyTorch and are not tried again: compiled blocks, fp8 compute.

A compiled block class that fails to compile or to run its first call (a Triton or Inductor error: RDNA1/RDNA2, a
Windows PyTorch with a broken triton-windows, an old driver), or an fp8 product this GPU's PyTorch cannot run, makes
the job go on without it (eager blocks, bf16 products) and is remembered here, keyed by the GPU and the PyTorch
version, so the next start does not try again. A new PyTorch or another GPU starts from nothing (the key changes).
``python -m rocm doctor`` lists them; ``--reset`` forgets them with the conv verdicts.

One small JSON file in the rocm cache folder, beside the conv verdicts (``rocm/verdicts.py``): written atomically,
merged with what another process wrote. No torch here: callers pass the GPU's name and the torch version.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from common.files import atomic_write_json, unlink_if_possible
from rocm.paths import cache_dir

logger = logging.getLogger(__name__)
FILE_NAME = "fallbacks.json"
COMPILE = "compiled blocks"
FP8 = "fp8 compute"


def path(folder: Path | None = None) -> Path:
    return Path(folder if folder is not None else cache_dir()) / FILE_NAME


def gpu_label(name: str, arch: str | None) -> str:
    """One GPU as the file names it: 'NVIDIA H100 80GB HBM3 (sm_90)', 'AMD Radeon RX 6800 (gfx1030)', 'CPU (cpu)'."""
    return f"{name} ({arch or 'unknown'})"


def machine_key(gpu: str, torch_version: str) -> str:
    """What a remembered fallback is for: one GPU (its name and architecture) with one PyTorch build."""
    return f"{gpu} | torch {torch_version}"


def _read(file: Path) -> dict:
    try:
        data = json.loads(file.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:       # a damaged file is no reason to fail a job: start again
        logger.warning("could not read %s (%s); starting without remembered fallbacks", file, e)
        return {}
    return data if isinstance(data, dict) else {}


def failed(feature: str, gpu: str, torch_version: str, folder: Path | None = None) -> str | None:
    """The error a feature failed with here before (None: not remembered as failed)."""
    entry = _read(path(folder)).get(machine_key(gpu, torch_version), {}).get(feature)
    return str(entry.get("error", "")) or "failed" if isinstance(entry, dict) else None


def remember(feature: str, gpu: str, torch_version: str, error: str, folder: Path | None = None) -> Path | None:
    """Keep 'feature failed here with error' for the next starts (None: the folder cannot be written; the
    fallback then holds for this process only, and says so in the log)."""
    file = path(folder)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        data = _read(file)
        data.setdefault(machine_key(gpu, torch_version), {})[feature] = {"error": error[:300],
                                                                         "when": round(time.time(), 3)}
        return atomic_write_json(file, data)
    except OSError as e:
        logger.warning("could not remember that %s failed (%s): the next start tries again", feature, e)
        return None


def entries(folder: Path | None = None) -> dict:
    """Everything remembered: {machine key: {feature: {"error", "when"}}} (for the doctor)."""
    return _read(path(folder))


def forget(folder: Path | None = None) -> bool:
    """Forget every remembered fallback (the doctor's --reset)."""
    return unlink_if_possible(path(folder))

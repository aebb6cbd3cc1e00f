"""Where the rocm package keeps its files (verdicts, MIOpen databases). Pure functions, no torch."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path
from typing import Mapping

from common.environment import read_environment
from configs.rocm_profiles import DEFAULTS


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """SteadyFrame's rocm cache folder: ``$STEADYFRAME_CACHE_DIR/rocm``, else ``$XDG_CACHE_HOME/steadyframe/rocm``,
    else ``~/.cache/steadyframe/rocm``. Not created here."""
    return read_environment(environ).cache_root / DEFAULTS.cache_subdir


def safe_name(text: str) -> str:
    """A string usable in a file name: letters, digits, '.', '_' and '-' only."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "none"


def installed_torch_version() -> str | None:
    """The installed torch distribution's version (e.g. '2.5.1+rocm6.2') without importing torch."""

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def build_tag(torch_version: str | None) -> str:
    """A folder tag for one torch build: its local version label ('rocm6.2', 'cu128', 'cpu') plus the version."""
    if not torch_version:
        return "torch-unknown"
    return safe_name("torch" + torch_version)

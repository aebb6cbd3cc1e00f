"""SteadyFrame's cache folder, one rule for every package: ``$STEADYFRAME_CACHE_DIR``, else
``$XDG_CACHE_HOME/steadyframe``, else ``~/.cache/steadyframe``. Its parts: ``rocm/`` (conv verdicts, MIOpen
databases), ``prompts/`` (prompt embeddings), ``logs/`` (the command line's log file)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

CACHE_ENV_VAR = "STEADYFRAME_CACHE_DIR"


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The cache root, read at call time. Not created here."""
    env = os.environ if environ is None else environ
    root = env.get(CACHE_ENV_VAR)
    if root:
        return Path(root).expanduser()
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "steadyframe"

"""Units, one convention for the whole code base.

* Memory (VRAM, host RAM, caps, budgets, buffers, model sizes in memory) is binary: ``GIB = 2**30``,
  ``MIB = 2**20``. The settings and options named ``*_gb`` (``--vram-cap-gb``, ``preserved_gb``, ``--host-ram-gb``)
  count GiB, as FramePack's "GB" of GPU memory (bytes / 1024**3) and PyTorch's memory figures do; the UI and the
  log print them as "GB".
* Download and file sizes as the Hugging Face hub lists them (``configs/presets.py`` ``size_gb``) are decimal:
  ``GB = 10**9``. Only they use ``GB``.
* Every name says its unit: byte counts are ints named ``*_bytes`` / ``*nbytes``; other quantities ``*_gb``, ``*_mb``,
  ``*_s``, ``*_ms``.
"""
from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
GB = 10 ** 9            # decimal: download and file sizes only (the hub's figures)


def gib(n_bytes: int | float) -> float:
    """Bytes as GiB (what the app prints as "GB" for memory)."""
    return n_bytes / GIB

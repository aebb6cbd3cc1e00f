"""Prompt embeddings kept on disk, so a repeated prompt skips the text encoders (and the 13 GB of Llama weights a
job reads are not read at all).

Key: a sha256 of everything the embeddings depend on: the prompt, the negative prompt (only when CFG > 1 encodes
it; otherwise the negative embeddings are zeros), the text encoders' and tokenizers' revisions, how the Llama is
stored (fp8 changes the embeddings), the template and its crop_start, the token limits. One safetensors file per
key in the user cache (`$STEADYFRAME_CACHE_DIR/prompts`, else `$XDG_CACHE_HOME/steadyframe/prompts`, else
`~/.cache/steadyframe/prompts`; `STEADYFRAME_PROMPT_CACHE` names another folder, or `off`), in float32 exactly as
the text stage returns them, so a cached run gives the same bits as an encoded one. Bounded: once the folder is
larger than `max_bytes` (configs/memory.py, prompt_cache_mb), the least recently used files are deleted. A damaged
or unreadable file is a miss.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from common.environment import read_environment
from common.files import atomic_path, unlink_if_possible
from common.units import MIB
from configs.memory import MEMORY
from pipeline.text import CLIP_MAX_TOKENS, LLAMA_MAX_TOKENS, PROMPT_TEMPLATE, TextEmbeddings

log = logging.getLogger(__name__)

TEXT_ROLES = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
FIELDS = ("llama", "mask", "pooled")


def prompt_cache_dir(environ=None) -> Path | None:
    """Where the prompt cache lives (read at call time), or None when it is off."""
    return read_environment(environ).prompt_cache


def cache_key(prompt: str, negative: str | None, revisions: dict, storage: str, crop_start: int) -> str:
    data = {"prompt": prompt, "negative": negative, "revisions": {r: revisions.get(r) for r in TEXT_ROLES},
            "storage": storage, "crop_start": crop_start, "template": PROMPT_TEMPLATE,
            "tokens": [LLAMA_MAX_TOKENS, CLIP_MAX_TOKENS], "format": 1}
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


def _stat(path: Path, field: str) -> int:
    try:
        return getattr(path.stat(), field)
    except OSError:                    # deleted meanwhile by another process's eviction
        return 0


def _size(path: Path) -> int:
    return _stat(path, "st_size")


class PromptCache:
    def __init__(self, folder: str | Path, max_bytes: int = MEMORY.prompt_cache_mb << 20):
        self.folder = Path(folder)
        self.max_bytes = max_bytes

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.safetensors"

    def get(self, key: str) -> dict[str, TextEmbeddings] | None:
        from safetensors import SafetensorError, safe_open

        path = self._path(key)
        if not path.is_file():
            return None
        try:
            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            out = {kind: TextEmbeddings(**{n: tensors[f"{kind}.{n}"] for n in FIELDS},
                                        truncated=meta.get(f"{kind}.truncated") == "1")
                   for kind in ("cond", "uncond")}
            os.utime(path)                                   # recently used
        except (OSError, KeyError, ValueError, RuntimeError, SafetensorError) as e:   # damaged: encode again
            log.warning("prompt cache: %s is unreadable (%s); encoding the prompt again", path.name, e)
            return None
        return out

    def put(self, key: str, texts: dict[str, TextEmbeddings]) -> None:
        from safetensors.torch import save_file

        tensors = {f"{kind}.{n}": getattr(texts[kind], n).contiguous() for kind in ("cond", "uncond")
                   for n in FIELDS}
        meta = {f"{kind}.truncated": "1" if texts[kind].truncated else "0" for kind in ("cond", "uncond")}
        path = self._path(key)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_path(path, fsync=False) as tmp:          # a cache: a lost entry is encoded again
                save_file(tensors, str(tmp), metadata=meta)
        except OSError as e:
            log.warning("prompt cache: could not write %s (%s)", path, e)
            return
        self.evict()

    def entries(self) -> list[Path]:
        """Cached files, least recently used first."""
        if not self.folder.is_dir():
            return []
        files = [p for p in self.folder.glob("*.safetensors") if p.is_file()]
        return sorted(files, key=lambda p: _stat(p, "st_mtime_ns"))

    def size(self) -> int:
        return sum(_size(p) for p in self.entries())

    def evict(self) -> int:
        """Delete the least recently used files until the folder fits `max_bytes`; returns how many went. A file
        that cannot be deleted now (Windows: another process reads it) stays until a later eviction."""
        files = self.entries()
        total = sum(_size(p) for p in files)
        gone = 0
        for p in files:
            if total <= self.max_bytes:
                break
            size = _size(p)
            if unlink_if_possible(p):
                total -= size
                gone += 1
        if gone:
            log.info("prompt cache: %d old entr%s deleted (limit %.0f MB)", gone, "y" if gone == 1 else "ies",
                     self.max_bytes / MIB)
        return gone


def default_cache() -> PromptCache | None:
    folder = prompt_cache_dir()
    return PromptCache(folder) if folder is not None else None

"""Which tier works for which convolution: cached in memory and in a JSON file per arch + torch + HIP build.

A verdict records the tiers that failed (with the reason) and the first tier that worked. Out-of-memory failures
stay in memory only: they depend on what else was resident at the time, and persisting one would pin a shape to a
slower tier forever. Writes are atomic (temp file + ``os.replace``) and merge with what other processes wrote.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rocm.paths import safe_name

logger = logging.getLogger(__name__)
FORMAT = 1


@dataclass
class Verdict:
    ok_tier: int | None = None
    failed: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"ok_tier": self.ok_tier, "failed": {str(k): v for k, v in self.failed.items()},
                "updated": round(time.time(), 3)}

    @classmethod
    def from_json(cls, data: dict) -> "Verdict":
        return cls(ok_tier=data.get("ok_tier"), failed={int(k): str(v) for k, v in data.get("failed", {}).items()})

    def copy(self) -> "Verdict":
        return Verdict(self.ok_tier, dict(self.failed))


def verdict_file_name(arch: str, torch_version: str, hip_version: str | None, cuda_version: str | None) -> str:
    backend = f"hip-{hip_version}" if hip_version else (f"cuda-{cuda_version}" if cuda_version else "cpu")
    return safe_name(f"conv_verdicts_{arch}_torch-{torch_version}_{backend}") + ".json"


class VerdictStore:
    """Verdicts of one arch/build. ``path=None`` keeps them in memory only."""

    def __init__(self, path: Path | None, *, flush_every: int = 32):
        self.path = Path(path) if path is not None else None
        self._persisted: dict[str, Verdict] = self._read_file() if self.path is not None else {}
        self._verdicts: dict[str, Verdict] = {k: v.copy() for k, v in self._persisted.items()}
        self._dirty: set[str] = set()
        self._flush_every = flush_every
        self._lock = threading.RLock()

    def _read_file(self) -> dict[str, Verdict]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            logger.warning("ignoring unreadable conv verdict file %s: %s", self.path, exc)
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            logger.warning("ignoring conv verdict file %s of another format", self.path)
            return {}
        return {k: Verdict.from_json(v) for k, v in data.get("verdicts", {}).items()}

    def get(self, key: str) -> Verdict | None:
        with self._lock:
            found = self._verdicts.get(key)
            return found.copy() if found else None

    def _targets(self, key: str, persist: bool) -> list[Verdict]:
        targets = [self._verdicts.setdefault(key, Verdict())]
        if persist and self.path is not None:
            targets.append(self._persisted.setdefault(key, Verdict()))
            self._dirty.add(key)
        return targets

    def record_failure(self, key: str, tier: int, reason: str, *, persist: bool = True) -> None:
        with self._lock:
            for verdict in self._targets(key, persist):
                verdict.failed[tier] = reason[:300]
                if verdict.ok_tier == tier:
                    verdict.ok_tier = None
            if persist:
                self.flush()

    def record_success(self, key: str, tier: int, *, persist: bool = True) -> None:
        with self._lock:
            known = self._verdicts.get(key)
            if known is not None and known.ok_tier == tier and (not persist or key in self._persisted):
                return
            for verdict in self._targets(key, persist):
                verdict.ok_tier = tier
                verdict.failed.pop(tier, None)
            if len(self._dirty) >= self._flush_every:
                self.flush()

    def forget_transient(self) -> None:
        """Drop what was only kept in memory (out-of-memory failures): back to the persisted verdicts."""
        with self._lock:
            self._verdicts = {k: v.copy() for k, v in self._persisted.items()}

    def flush(self) -> None:
        """Merge our changed verdicts into the file (atomic replace)."""
        with self._lock:
            if self.path is None or not self._dirty:
                self._dirty.clear()
                return
            merged = self._read_file()
            merged.update({k: self._persisted[k] for k in self._dirty})
            payload = {"format": FORMAT, "verdicts": {k: v.to_json() for k, v in sorted(merged.items())}}
            tmp = None
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(payload, fh, indent=1)
                os.replace(tmp, self.path)
            except OSError as exc:
                logger.warning("could not write conv verdicts to %s: %s", self.path, exc)
                if tmp is not None and os.path.exists(tmp):
                    os.unlink(tmp)
                return
            self._persisted = merged
            for key, verdict in merged.items():
                self._verdicts.setdefault(key, verdict.copy())
            self._dirty.clear()

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._verdicts)

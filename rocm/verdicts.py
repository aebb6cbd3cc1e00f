"""Which tier works for which convolution: cached in memory and in a JSON file per build.

A verdict records the tiers that failed (with the reason) and the first tier that worked. Verdicts expire:

* The file is keyed by arch + torch + ROCm/HIP (or CUDA) + kernel driver version (``verdict_path``): a new
  driver or wheel starts from nothing, since it may have fixed (or broken) what the old one did.
* A *timeout* or a probe child's *crash* is not trusted at once: a hang or a crash can be a passing state of the
  GPU or the driver. It is kept as "unconfirmed" (with the id of the run that saw it) and skipped for the rest of
  that run; on a later run, where the hang probe is on, that tier is probed once more before it is trusted
  (``retry_tiers``). A second one confirms it.
* Out-of-memory failures stay in memory only: they depend on what else was resident at the time, and persisting
  one would pin a shape to a slower tier forever.

Writes are atomic (``common.files``: temp file + rename) and merge with what other processes wrote. ``list_files`` and
``reset`` serve ``python -m rocm doctor`` (which lists them, and clears them with ``--reset``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from common.files import atomic_write_json
from rocm.paths import safe_name

logger = logging.getLogger(__name__)
FORMAT = 3       # 3: five tiers (4 = decomposition without MIOpen, 5 = CPU; in format 2, 4 was the CPU)
FILE_PREFIX = "conv_verdicts_"


@dataclass
class Verdict:
    ok_tier: int | None = None
    failed: dict[int, str] = field(default_factory=dict)
    unconfirmed: dict[int, str] = field(default_factory=dict)   # timed-out tier -> id of the run that saw it

    def to_json(self) -> dict:
        return {"ok_tier": self.ok_tier, "failed": {str(k): v for k, v in self.failed.items()},
                "unconfirmed": {str(k): v for k, v in self.unconfirmed.items()}, "updated": round(time.time(), 3)}

    @classmethod
    def from_json(cls, data: dict) -> "Verdict":
        return cls(ok_tier=data.get("ok_tier"), failed={int(k): str(v) for k, v in data.get("failed", {}).items()},
                   unconfirmed={int(k): str(v) for k, v in data.get("unconfirmed", {}).items()})

    def copy(self) -> "Verdict":
        return Verdict(self.ok_tier, dict(self.failed), dict(self.unconfirmed))


def build_of(runtime) -> dict[str, str | None]:
    """What a verdict file is keyed by (a ``rocm.arch.Runtime`` or anything with the same fields). Under
    HSA_OVERRIDE_GFX_VERSION the runtime loads another ISA's kernels on the same card, so what works differs: a
    780M with and without 11.0.0 keeps two files."""
    override = getattr(runtime, "override", None)
    arch = f"{runtime.arch}-hsa-{override}" if override else runtime.arch
    return {"arch": arch, "torch": runtime.torch_version, "hip": runtime.hip_version,
            "cuda": runtime.cuda_version, "driver": getattr(runtime, "driver_version", None)}


def verdict_file_name(arch: str | None, torch_version: str | None, hip_version: str | None,
                      cuda_version: str | None, driver_version: str | None = None) -> str:
    backend = f"hip-{hip_version}" if hip_version else (f"cuda-{cuda_version}" if cuda_version else "cpu")
    driver = f"_drv-{driver_version}" if driver_version else ""
    return safe_name(f"{FILE_PREFIX}{arch}_torch-{torch_version}_{backend}{driver}") + ".json"


def verdict_path(cache_dir: Path | str, runtime) -> Path:
    b = build_of(runtime)
    return Path(cache_dir) / verdict_file_name(b["arch"], b["torch"], b["hip"], b["cuda"], b["driver"])


class VerdictStore:
    """Verdicts of one build. ``path=None`` keeps them in memory only. Each store is one *run* (``run_id``)."""

    def __init__(self, path: Path | None, *, flush_every: int = 32, build: dict | None = None):
        self.path = Path(path) if path is not None else None
        self.build = dict(build or {})
        self.run_id = uuid.uuid4().hex[:12]
        self._persisted: dict[str, Verdict] = self._read_file() if self.path is not None else {}
        self._verdicts: dict[str, Verdict] = {k: v.copy() for k, v in self._persisted.items()}
        self._dirty: set[str] = set()
        self._flush_every = flush_every
        self._lock = threading.RLock()

    def _read_file(self) -> dict[str, Verdict]:
        return read_verdicts(self.path) if self.path is not None else {}

    def get(self, key: str) -> Verdict | None:
        with self._lock:
            found = self._verdicts.get(key)
            return found.copy() if found else None

    def retry_tiers(self, key: str) -> set[int]:
        """Tiers that timed out on an earlier run and have not been probed again since."""
        with self._lock:
            found = self._verdicts.get(key)
            return {t for t, run in found.unconfirmed.items() if run != self.run_id} if found else set()

    def _targets(self, key: str, persist: bool) -> list[Verdict]:
        targets = [self._verdicts.setdefault(key, Verdict())]
        if persist and self.path is not None:
            targets.append(self._persisted.setdefault(key, Verdict()))
            self._dirty.add(key)
        return targets

    def record_failure(self, key: str, tier: int, reason: str, *, persist: bool = True,
                       timeout: bool = False) -> None:
        """``timeout``: a failure that may pass (a probe's timeout or crash): the first is unconfirmed (re-probed
        on a later run); one seen again on a later run is confirmed."""
        with self._lock:
            known = self._verdicts.get(key)
            earlier = known.unconfirmed.get(tier) if known else None
            confirm = timeout and earlier is not None and earlier != self.run_id
            for verdict in self._targets(key, persist):
                verdict.failed[tier] = reason[:300] + (" (seen again on a later run: confirmed)"
                                                       if confirm else "")
                if verdict.ok_tier == tier:
                    verdict.ok_tier = None
                if timeout and not confirm:
                    verdict.unconfirmed[tier] = self.run_id
                else:
                    verdict.unconfirmed.pop(tier, None)
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
                verdict.unconfirmed.pop(tier, None)
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
            payload = {"format": FORMAT, "build": self.build,
                       "verdicts": {k: v.to_json() for k, v in sorted(merged.items())}}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(self.path, payload, indent=1, fsync=False)
            except OSError as exc:
                logger.warning("could not write conv verdicts to %s: %s", self.path, exc)
                return
            self._persisted = merged
            for key, verdict in merged.items():
                self._verdicts.setdefault(key, verdict.copy())
            self._dirty.clear()

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._verdicts)


def _read_payload(path: Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable conv verdict file %s: %s", path, exc)
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        older = isinstance(data, dict) and isinstance(data.get("format"), int) and data["format"] < FORMAT
        # an older SteadyFrame's verdicts have expired (not keyed by driver, no timeout re-probe, tiers numbered
        # otherwise): start afresh
        (logger.info if older else logger.warning)("ignoring conv verdict file %s of %s format", path,
                                                   "an older" if older else "another")
        return None
    return data


def read_verdicts(path: Path) -> dict[str, Verdict]:
    data = _read_payload(path)
    return {k: Verdict.from_json(v) for k, v in data.get("verdicts", {}).items()} if data else {}


def list_files(cache_dir: Path | str, current: Path | None = None) -> list[dict]:
    """Every verdict file in ``cache_dir``: its build, its verdicts (signature key -> ok tier, failed tiers with
    reasons, unconfirmed timeouts) and whether it is the one this machine uses now."""
    out = []
    for path in sorted(Path(cache_dir).glob(f"{FILE_PREFIX}*.json")):
        data = _read_payload(path)
        verdicts = {k: Verdict.from_json(v) for k, v in data.get("verdicts", {}).items()} if data else {}
        out.append({"file": str(path), "current": current is not None and path == Path(current),
                    "readable": data is not None, "build": (data or {}).get("build", {}), "count": len(verdicts),
                    "verdicts": {k: {"ok_tier": v.ok_tier, "failed": {str(t): r for t, r in v.failed.items()},
                                     "unconfirmed_timeouts": sorted(v.unconfirmed)}
                                 for k, v in sorted(verdicts.items())}})
    return out


def reset(cache_dir: Path | str) -> list[Path]:
    """Delete every verdict file (and stale temp files) in ``cache_dir``; returns what was removed."""
    removed = []
    for path in sorted(Path(cache_dir).glob(f"{FILE_PREFIX}*")):
        if path.is_file() and (path.suffix == ".json" or path.name.endswith(".tmp")):
            path.unlink()
            removed.append(path)
    return removed

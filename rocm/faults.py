"""Fault injection for tests: make tier N fail like the real thing for chosen convolutions.

A ``FaultPlan`` is passed explicitly to ``ConvFallback`` / the probe. The probe child reads the same plan from the
``STEADYFRAME_CONV_FAULTS`` environment variable (JSON), so a test can make a child hang or crash.
Kinds: ``miopen_unknown``, ``no_algorithm`` (the MIOpen texts), ``hip_oom`` (RuntimeError with HIP's OOM text),
``oom`` (``torch.OutOfMemoryError``), ``hang`` (sleep ``seconds``), ``crash`` (abort; honoured only in a probe
child), ``illegal_access`` (CUDA's and HIP's text of a GPU fault, which is never a verdict) and ``error`` (a
ValueError, which must not be treated as a GPU failure).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Mapping

from common.environment import CONV_FAULTS, read_environment
from rocm.errors import HIP_OOM_TEXT, ILLEGAL_ACCESS_TEXT, MIOPEN_UNKNOWN_TEXT, NO_ALGORITHM_TEXT

logger = logging.getLogger(__name__)
KINDS = ("miopen_unknown", "no_algorithm", "hip_oom", "oom", "hang", "crash", "illegal_access", "error")


@dataclass(frozen=True)
class Fault:
    tier: int
    kind: str
    op: str | None = None                       # 'conv2d' | 'conv3d' | None = any
    direction: str | None = None                # 'forward' | 'backward' | None = any
    input_shape: tuple[int, ...] | None = None  # None = any shape
    times: int | None = None                    # fire only on the first N matches
    seconds: float = 3600.0                     # for 'hang'
    grandchild: bool = False                    # 'hang' in a probe child also starts a sleeping grandchild

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {KINDS}")
        if self.input_shape is not None:
            object.__setattr__(self, "input_shape", tuple(self.input_shape))

    def matches(self, tier: int, op: str, direction: str, input_shape: tuple[int, ...]) -> bool:
        return (self.tier == tier and self.op in (None, op) and self.direction in (None, direction)
                and (self.input_shape is None or tuple(self.input_shape) == tuple(input_shape)))


def _raise(kind: str) -> None:
    if kind == "miopen_unknown":
        raise RuntimeError(MIOPEN_UNKNOWN_TEXT)
    if kind == "no_algorithm":
        raise RuntimeError(f"MIOpen Error: {NO_ALGORITHM_TEXT} ({MIOPEN_UNKNOWN_TEXT})")
    if kind == "hip_oom":
        raise RuntimeError(HIP_OOM_TEXT)
    if kind == "illegal_access":
        raise RuntimeError(ILLEGAL_ACCESS_TEXT)
    if kind == "oom":
        import torch

        raise torch.OutOfMemoryError(HIP_OOM_TEXT)
    if kind == "error":
        raise ValueError("injected non-GPU error")


class FaultPlan:
    """A list of faults; ``check`` is called by each tier before it computes."""

    def __init__(self, faults=()):
        self.faults = [f if isinstance(f, Fault) else Fault(**f) for f in faults]
        self._fired = [0] * len(self.faults)
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.faults)

    def check(self, tier: int, op: str, direction: str, input_shape, *, in_child: bool = False) -> None:
        for index, fault in enumerate(self.faults):
            if not fault.matches(tier, op, direction, tuple(input_shape)):
                continue
            with self._lock:
                if fault.times is not None and self._fired[index] >= fault.times:
                    continue
                self._fired[index] += 1
            logger.debug("fault injected: %s", fault)
            self._fire(fault, in_child)

    @staticmethod
    def _fire(fault: Fault, in_child: bool) -> None:
        if fault.kind == "hang":
            if in_child and fault.grandchild:

                subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            time.sleep(fault.seconds)
            return
        if fault.kind == "crash":
            if in_child:
                try:
                    import resource  # "Availability: Unix" (docs.python.org/3/library/resource.html)
                except ImportError:          # Windows: no core file to keep small
                    logger.debug("no resource module here: the crash fault aborts without a core-size limit")
                else:
                    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                os.abort()
            logger.warning("crash fault ignored outside a probe child: %s", fault)
            return
        _raise(fault.kind)

    def fired(self) -> list[int]:
        with self._lock:
            return list(self._fired)

    def to_json(self) -> str:
        return json.dumps([asdict(f) for f in self.faults])

    @classmethod
    def from_json(cls, text: str) -> "FaultPlan":
        return cls(json.loads(text))

    def to_env(self) -> dict[str, str]:
        return {CONV_FAULTS: self.to_json()}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "FaultPlan | None":
        text = read_environment(environ).conv_faults
        return cls.from_json(text) if text else None

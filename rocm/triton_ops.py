"""How our Triton operators are set up, the one way for each of them (pipeline/fp8_rows.py, rocm/fp8_qkv.py): the
kernel module imported and its torch.library operator registered once per process, outside compiled code (an
operator registered inside traced code broke each block's graph into several: BENCHMARKS.md), and both kept in the
caller's dict ("kernels", "op") for the code that launches them."""
from __future__ import annotations

from collections.abc import Callable
from types import ModuleType


def prepare(ready: dict, load: Callable[[], tuple[ModuleType, object]]) -> bool:
    """`load()` (import the kernels, register the operator: (module, operator)) the first time; whether they can run
    here (False without Triton: Windows, the CPU build; or with a PyTorch before Triton operators, 2.6)."""
    if "kernels" not in ready:
        try:
            kernels, op = load()
        except (ImportError, AttributeError):
            ready["kernels"] = None
            return False
        ready["kernels"], ready["op"] = kernels, op
    return ready["kernels"] is not None

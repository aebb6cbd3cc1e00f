"""One registry of the functions SteadyFrame replaces at run time (e.g. ``torch.nn.functional.conv2d`` by the conv
fallback, ``scaled_dot_product_attention`` by the attention guard), so "what is patched now" has one answer.

A patch is taken with ``patch()`` and given back with ``restore()``, or held for a block with ``patched()``
(restored however the block ends). The app patches only inside a stage's scope (memory.MemoryManager.stage and the
conv fallback's ``active()`` blocks); ``active_patches()`` is empty between stages, and the tests check that it is
empty again after a stage that raised.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any, Iterator

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Patch:
    target: Any              # the module or object whose attribute is replaced
    attr: str
    original: Any            # what it gives back (taken over from a patch below it that was restored first)
    replacement: Any
    owner: str               # who patched it, for the registry's report ("memory.AttentionGuard (transformer)")

    @property
    def name(self) -> str:
        return f"{getattr(self.target, '__name__', type(self.target).__name__)}.{self.attr}"


_lock = threading.RLock()
_active: dict[tuple[int, str], list[Patch]] = {}      # per attribute, the patches in the order they were taken


def patch(target, attr: str, replacement, owner: str) -> Patch:
    """Replace ``target.attr`` with ``replacement`` and record it. Patches of the same attribute nest: each
    ``restore()`` puts back what its own patch found."""
    with _lock:
        p = Patch(target, attr, getattr(target, attr), replacement, owner)
        setattr(target, attr, replacement)
        _active.setdefault((id(target), attr), []).append(p)
        log.debug("patched %s (%s)", p.name, owner)
        return p


def restore(p: Patch) -> None:
    """Put back what ``p`` replaced. Patches of one attribute taken by two threads may end in any order: a patch
    restored while another one above it still holds the attribute leaves the attribute alone and hands what it
    found to that one (which puts it back when it ends). If someone outside the registry replaced the attribute
    meanwhile, say so and restore anyway. A second restore of the same patch does nothing."""
    with _lock:
        key = (id(p.target), p.attr)
        stack = _active.get(key, [])
        if p not in stack:
            return
        i = stack.index(p)
        if i + 1 < len(stack):
            stack[i + 1].original = p.original
        else:
            if getattr(p.target, p.attr) is not p.replacement:
                log.warning("%s was replaced while %s held it; restoring the function it found", p.name, p.owner)
            setattr(p.target, p.attr, p.original)
        del stack[i]
        if not stack:
            _active.pop(key, None)
        log.debug("restored %s (%s)", p.name, p.owner)


@contextlib.contextmanager
def patched(target, attr: str, replacement, owner: str) -> Iterator[Patch]:
    """``target.attr`` is ``replacement`` for the block, whatever way the block ends."""
    p = patch(target, attr, replacement, owner)
    try:
        yield p
    finally:
        restore(p)


def active_patches() -> dict[str, str]:
    """What is patched now: {"torch.nn.functional.conv2d": "rocm.ConvFallback", ...}."""
    with _lock:
        return {stack[-1].name: stack[-1].owner for stack in _active.values()}

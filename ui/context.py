"""What the page's handlers share: the preset, the device, the runner and the tabs' jobs on it, the layout's components, the guard of the
un-queued handlers. app.py builds one per app; the panels (ui/panel_*.py) wire their events from it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from configs.presets import ModelPreset
from configs.runtime import Config
from jobs.runner import Runner
from ui import hints
from ui.access import Access
from ui.guard import HandlerGuard, HeapKeeper
from ui.layout import Layout
from ui.memory_plan import size_line
from ui.prompt_tokens import TokenCounter
from ui.sessions import Sessions

# Un-queued handlers running at once (a call beyond that returns at once, ui/guard.py): the expensive ones (memory
# plan, token count: up to ~0.5 s each), one per tab; the cheap ones (hints, random seed, LoRA picker: < 50 ms)
LIVE_CALLS_MAX = 2
QUICK_CALLS_MAX = 8
QUICK_CALLS_PER_SESSION = 2


@dataclass
class AppContext:
    config: Config                # the process's configuration (configs/runtime.py)
    preset: ModelPreset
    device: object                # torch.device
    outputs: Path
    runner: Runner
    sessions: Sessions            # the tabs' jobs on the runner, their refusals and streams (ui/sessions.py)
    ui: Layout
    preserved_max_gb: float       # the preserved-memory slider's top: the cap, or the card's memory if smaller
    live: HandlerGuard            # the expensive live handlers
    quick: HandlerGuard           # the cheap ones (never behind the expensive ones)
    tokens: TokenCounter
    access: Access = Access()     # who sees what (--auth users; ui/access.py)
    public_notice: str = ""       # on a network without a login: that everyone sees everything (ui/launch.py)
    keeper: HeapKeeper | None = None   # gives the heap back after bursts (ui/guard.py)

    @staticmethod
    def guards(keeper: HeapKeeper | None = None, forwarded: bool = False) -> tuple[HandlerGuard, HandlerGuard]:
        """(live, quick): the guards of the expensive and the cheap un-queued handlers (`forwarded`: --share)."""
        return (HandlerGuard(LIVE_CALLS_MAX, 1, keeper, forwarded),
                HandlerGuard(QUICK_CALLS_MAX, QUICK_CALLS_PER_SESSION, keeper, forwarded))

    @property
    def default_resolution(self) -> int:
        return self.preset.default_resolution


def preserved_max_gb(cap_gb: float, device) -> float:
    """The most memory that can be preserved: the VRAM cap, or the card's memory when it has less."""
    top = float(cap_gb)
    if getattr(device, "type", "cpu") == "cuda":

        top = min(top, torch.cuda.get_device_properties(device).total_memory / 1024 ** 3)   # GB as memory/ counts them (GiB)
    return round(top, 1)


def preserved_text(preset, config: Config, device, preserved_gb, max_gb: float, resolution=None, width=0, height=0,
                   window=9, image=None) -> str:
    """The page's memory plan: the residency plan of the preserved memory, then what the job's size costs
    (ui/memory_plan.py)."""

    size, line = size_line(preset, config.vram_cap_gb, preset.default_resolution if resolution is None else
                           resolution, width, height, window, image, config.weight_storage, config.fp8_compute)
    text = hints.preserved_hint(preset, config.vram_cap_gb, preserved_gb, device.type, config.host_ram_gb,
                                config.weight_storage, max_gb=max_gb, size=size, window=int(hints.number(window) or 9),
                                fp8_compute=config.fp8_compute)
    return "**Memory plan:** " + text + (f"\n\n{line}" if line else "")

"""What the page's handlers share: the preset, the device, the runner, the layout's components, the guard of the
un-queued handlers. app.py builds one per app; the panels (ui/panel_*.py) wire their events from it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ui.guard import HandlerGuard
from ui.layout import Layout
from ui.prompt_tokens import TokenCounter
from ui.runner import JobRunner

LIVE_CALLS_MAX = 2      # un-queued live handlers (hints, memory plan, random seed) running at once; more return at once


@dataclass
class AppContext:
    args: object                  # the parsed command line (ui/cli.py)
    preset: object                # configs.presets.ModelPreset
    device: object                # torch.device
    outputs: Path
    runner: JobRunner
    ui: Layout
    preserved_max_gb: float       # the preserved-memory slider's top: the cap, or the card's memory if smaller
    live: HandlerGuard
    tokens: TokenCounter

    @property
    def default_resolution(self) -> int:
        return self.preset.default_resolution


def preserved_max_gb(cap_gb: float, device) -> float:
    """The most memory that can be preserved: the VRAM cap, or the card's memory when it has less."""
    top = float(cap_gb)
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        top = min(top, torch.cuda.get_device_properties(device).total_memory / 1024 ** 3)   # GB as memory/ counts them (GiB)
    return round(top, 1)


def preserved_text(preset, args, device, preserved_gb, max_gb: float, resolution=None, width=0, height=0,
                   window=9, image=None) -> str:
    """The page's memory plan: the residency plan of the preserved memory, then what the job's size costs
    (ui/size_plan.py)."""
    from ui import hints
    from ui.cli import weight_storage
    from ui.size_plan import size_line

    size, line = size_line(preset, args.vram_cap_gb, preset.default_resolution if resolution is None else resolution,
                           width, height, window, image, weight_storage(args))
    text = hints.preserved_hint(preset, args.vram_cap_gb, preserved_gb, device.type,
                                getattr(args, "host_ram_gb", None), weight_storage(args), max_gb=max_gb,
                                size=size, window=int(hints.number(window) or 9))
    return "**Memory plan:** " + text + (f"\n\n{line}" if line else "")

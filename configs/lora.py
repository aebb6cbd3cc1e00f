"""Limits and defaults of LoRAs (pipeline/lora.py): data only."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoraLimits:
    folder: str = "loras"                 # the app's and the CLI's --lora-dir default
    max_file_mb: int = 4096               # a LoRA file larger than this is refused (a full checkpoint is not a LoRA)
    strength_min: float = -2.0
    strength_max: float = 2.0
    max_count: int = 8                    # LoRAs in one job
    max_text_chars: int = 2000            # the setting's text (8 file names and strengths fit many times over)
    ui_slots: int = 3                     # the page's LoRA rows


LORA = LoraLimits()

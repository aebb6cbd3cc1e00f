"""Typed, frozen configuration: model presets, the table of controls (their defaults and limits), memory limits,
ROCm profiles.

Everything a user may want to change lives here as data; the UI, the CLI and the tests read it from here.
Nothing in this package imports torch.
"""
from configs.controls import CONTROLS, Control
from configs.generation import BUCKETS_640, DEFAULTS, LIMITS, GenerationDefaults, Limits
from configs.memory import MEMORY, MemoryConfig
from configs.presets import PRESETS, ComponentSource, ModelPreset, get_preset

__all__ = [
    "CONTROLS", "Control", "BUCKETS_640", "DEFAULTS", "LIMITS", "GenerationDefaults", "Limits", "MEMORY",
    "MemoryConfig",
    "PRESETS", "ComponentSource", "ModelPreset", "get_preset",
]

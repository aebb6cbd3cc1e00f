"""memory/: one large model at a time under a hard VRAM cap (an explicit budget object, never a global)."""
from memory.manager import MemoryManager, StageRecord, default_device
from memory.snapshot import MemorySnapshot

__all__ = ["MemoryManager", "MemorySnapshot", "StageRecord", "default_device"]

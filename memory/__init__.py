"""memory/: one large model at a time under a hard VRAM cap (an explicit budget object, never a global). Import
from its modules (memory.manager MemoryManager, memory.hostpack HostPack, ...): this file loads nothing, so a light
module may use memory.estimate without torch."""

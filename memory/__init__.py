"""memory/: one large model at a time under a hard VRAM cap (an explicit budget object, never a global)."""
from memory.budget import MemoryBudget, Placement, Workload
from memory.hostpack import HostPack, block_list
from memory.manager import MemoryManager, StageRecord, default_device
from memory.plan import ResidencyPlan, plan_residency
from memory.snapshot import MemorySnapshot
from memory.streaming import BlockStreamer

__all__ = ["BlockStreamer", "HostPack", "MemoryBudget", "MemoryManager", "MemorySnapshot", "Placement",
           "ResidencyPlan", "StageRecord", "Workload", "block_list", "default_device", "plan_residency"]

"""Which GPU is this? Two ways to ask.

* Before torch is imported (for the environment profile): the Linux KFD topology,
  ``/sys/class/kfd/kfd/topology/nodes/*/properties``, whose ``gfx_target_version`` encodes the ISA
  (major*10000 + minor*100 + stepping, e.g. 110000 = gfx1100, 90010 = gfx90a). No KFD -> not ROCm: CUDA or CPU.
  HSA_OVERRIDE_GFX_VERSION does not change it, so we see the real card.
* After torch is imported: ``detect_runtime(device)`` (backend, arch, versions) for the convolution fallback and
  the doctor.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

KFD_TOPOLOGY_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
FAMILIES = ("rdna1", "rdna2", "rdna3", "rdna4", "cdna", "unknown")
_CDNA = {"gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950"}


@dataclass(frozen=True)
class GpuNode:
    node: int
    gfx: str
    gfx_target_version: int


@dataclass(frozen=True)
class ArchInfo:
    """The AMD GPUs the KFD topology lists; ``gfx``/``family`` are those of the first one."""

    gfx: str
    family: str
    nodes: tuple[GpuNode, ...]
    source: str

    @property
    def mixed(self) -> bool:
        return len({arch_family(n.gfx) for n in self.nodes}) > 1


def gfx_from_target_version(value: int) -> str | None:
    """110000 -> 'gfx1100', 90010 -> 'gfx90a', 100100 -> 'gfx1010'; 0 (a CPU node) -> None."""
    if value <= 0:
        return None
    major, minor, step = value // 10000, (value // 100) % 100, value % 100
    return f"gfx{major}{minor:x}{step:x}"


def arch_family(gfx: str | None) -> str | None:
    """Family of an ISA name ('gfx1100:sramecc+:xnack-' accepted); None for a non-AMD arch."""
    if not gfx or not gfx.startswith("gfx"):
        return None
    base = gfx.split(":")[0].lower()
    if re.fullmatch(r"gfx101[0-9a-f]", base):
        return "rdna1"
    if re.fullmatch(r"gfx103[0-9a-f]", base):
        return "rdna2"
    if re.fullmatch(r"gfx11[0-9a-f]{2}", base):
        return "rdna3"
    if re.fullmatch(r"gfx12[0-9a-f]{2}", base):
        return "rdna4"
    if base in _CDNA:
        return "cdna"
    return "unknown"


def _read_properties(path: Path) -> dict[str, str]:
    props: dict[str, str] = {}
    for line in path.read_text(encoding="ascii", errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 2:
            props[parts[0]] = parts[1]
    return props


def read_kfd_gpus(topology_nodes: Path | str | None = None) -> list[GpuNode]:
    """GPU nodes of the KFD topology (CPU nodes, which report gfx_target_version 0, are skipped)."""
    root = Path(topology_nodes) if topology_nodes is not None else KFD_TOPOLOGY_NODES
    if not root.is_dir():
        return []
    gpus = []
    for node_dir in sorted(root.iterdir(), key=lambda p: (len(p.name), p.name)):
        prop_file = node_dir / "properties"
        if not prop_file.is_file():
            continue
        try:
            props = _read_properties(prop_file)
            version = int(props.get("gfx_target_version", "0"))
        except (OSError, ValueError) as exc:
            logger.debug("skipping KFD node %s: %s", node_dir, exc)
            continue
        gfx = gfx_from_target_version(version)
        if gfx:
            node = int(node_dir.name) if node_dir.name.isdigit() else -1
            gpus.append(GpuNode(node=node, gfx=gfx, gfx_target_version=version))
    return gpus


def detect_arch(topology_nodes: Path | str | None = None) -> ArchInfo | None:
    """The AMD GPU architecture from the KFD topology, without torch; None when there is no AMD GPU."""
    gpus = read_kfd_gpus(topology_nodes)
    if not gpus:
        return None
    first = gpus[0]
    return ArchInfo(gfx=first.gfx, family=arch_family(first.gfx) or "unknown", nodes=tuple(gpus),
                    source=str(topology_nodes or KFD_TOPOLOGY_NODES))


@dataclass(frozen=True)
class Runtime:
    """What torch reports about one device (after ``import torch``)."""

    backend: str              # 'rocm' | 'cuda' | 'cpu'
    arch: str                 # 'gfx1100', 'sm_90', 'cpu'
    family: str | None        # rocm family, None elsewhere
    torch_version: str
    hip_version: str | None
    cuda_version: str | None
    device_name: str
    total_memory: int | None
    wheel_arches: tuple[str, ...]

    @property
    def wheel_has_arch(self) -> bool | None:
        if self.backend == "cpu" or not self.wheel_arches:
            return None
        return self.arch in self.wheel_arches


def detect_runtime(device=None) -> Runtime:
    """Backend, arch and versions for ``device`` (default: the current GPU if any, else CPU)."""
    import torch

    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    dev = torch.device(device) if device is not None else None
    use_gpu = torch.cuda.is_available() and (dev is None or dev.type == "cuda")
    if not use_gpu:
        return Runtime("cpu", "cpu", None, torch.__version__, hip, cuda, "CPU", None, ())
    index = dev.index if dev is not None and dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    try:
        arches = tuple(torch.cuda.get_arch_list())
    except RuntimeError:
        arches = ()
    if hip is not None:
        arch = getattr(props, "gcnArchName", "unknown").split(":")[0]
        return Runtime("rocm", arch, arch_family(arch) or "unknown", torch.__version__, hip, None, props.name,
                       props.total_memory, arches)
    arch = f"sm_{props.major}{props.minor}"
    return Runtime("cuda", arch, None, torch.__version__, None, cuda, props.name, props.total_memory, arches)


def visible_devices_note(environ=os.environ) -> str | None:
    """A note when device-selection variables are set (they change which card torch sees)."""
    keys = [k for k in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if k in environ]
    return ", ".join(f"{k}={environ[k]}" for k in keys) or None

"""Helpers for the rocm tests: fake KFD topologies, scaled tolerances, subprocess and process-group checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# gfx_target_version values as the KFD topology reports them (major*10000 + minor*100 + stepping)
GFX = {"gfx1010": 100100, "gfx1030": 100300, "gfx1100": 110000, "gfx1151": 110501, "gfx90a": 90010,
       "gfx942": 90402, "gfx950": 90500, "gfx906": 90006, "gfx1201": 120001, "gfx1036": 100306}


UNIQUE_ID = 0x5A1E0000000  # GPU node i gets unique_id UNIQUE_ID + i (ROCR_VISIBLE_DEVICES' GPU-<hex> names it)


def make_topology(root: Path, *gfx_names: str) -> Path:
    """A fake /sys/class/kfd/kfd/topology/nodes with a CPU node 0 and one GPU node per name."""
    nodes = root / "nodes"
    cpu = nodes / "0"
    cpu.mkdir(parents=True)
    (cpu / "properties").write_text("cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\n")
    for i, name in enumerate(gfx_names, start=1):
        node = nodes / str(i)
        node.mkdir()
        (node / "properties").write_text(f"cpu_cores_count 0\nsimd_count 192\ngfx_target_version {GFX[name]}\n"
                                         f"vendor_id 4098\nunique_id {UNIQUE_ID + i}\n")
    return nodes


def assert_close_scaled(actual, expected, rel: float = 1e-5):
    """|actual - expected| <= rel * max(1, max|expected|) elementwise, in fp32; dtype must match."""

    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(1.0, expected.detach().float().abs().max().item())
    err = (actual.detach().float() - expected.detach().float()).abs().max().item()
    assert err <= rel * scale, f"max abs error {err:.3g} > {rel:g} * {scale:.3g}"


def run_python(code: str, env: dict | None = None, timeout: float = 60, unset=()) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), full_env.get("PYTHONPATH")) if p)
    full_env.update(env or {})
    for var in unset:
        full_env.pop(var, None)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def live_group_members(pgid: int) -> list[int]:
    """Non-zombie processes whose process group is ``pgid``."""
    import psutil

    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return alive

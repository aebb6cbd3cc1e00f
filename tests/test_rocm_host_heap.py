"""rocm.configure_host_heap: fixed glibc thresholds, so that memory freed between jobs goes back to the OS.

Each case runs in a fresh interpreter (thresholds are per process). The child mallocs, fills and frees a 6 MiB block
twice and reports how much of it the process still holds: with glibc's default, the first free raises the mmap
threshold to 6 MiB, so the second block comes from the heap and stays resident after its free; with the fixed
thresholds both blocks are mappings of their own, returned to the OS at free."""
from __future__ import annotations

import json
import sys

import pytest
from rocm_helpers import run_python

CHILD = """
import ctypes, json, os
from rocm.allocator import configure_host_heap
message = configure_host_heap()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
size = 6 * 2**20
base = rss()
for _ in range(2):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
print(json.dumps({"message": message, "kept_mib": (rss() - base) / 2**20}))
"""

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc (Linux) only")


def _child(**env) -> dict:
    unset = [v for v in ("STEADYFRAME_HOST_HEAP", "GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_",
                         "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_") if v not in env]
    r = run_python(CHILD, env=env, unset=unset)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@linux_only
def test_fixed_thresholds_give_freed_memory_back():
    default = _child(STEADYFRAME_HOST_HEAP="off")
    fixed = _child()
    assert "left alone" in default["message"]
    assert "mmap threshold 4 MiB" in fixed["message"] and "trim threshold 8 MiB" in fixed["message"]
    assert default["kept_mib"] > 5, default          # glibc's own behaviour: the second block stays resident
    assert fixed["kept_mib"] < 1, fixed              # ours: both went back to the OS


@linux_only
def test_the_users_malloc_settings_win():
    kept = _child(MALLOC_TRIM_THRESHOLD_="1000000")
    assert "your settings kept (MALLOC_TRIM_THRESHOLD_)" in kept["message"]
    assert "GLIBC_TUNABLES" in _child(GLIBC_TUNABLES="glibc.malloc.trim_threshold=1000000")["message"]
    assert "mmap threshold" in _child(GLIBC_TUNABLES="glibc.rtld.optional_static_tls=512")["message"]


def test_switch_and_platform_messages(monkeypatch):
    from rocm.allocator import configure_host_heap

    assert "left alone" in configure_host_heap({"STEADYFRAME_HOST_HEAP": "off"})
    monkeypatch.setattr(sys, "platform", "darwin")
    assert configure_host_heap({}) == "host heap: not glibc, left alone"

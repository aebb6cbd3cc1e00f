"""Verdicts persist across processes: a fresh process goes straight to the working tier."""

from __future__ import annotations

import json

from rocm_helpers import run_python

BAD = (1, 4, 5, 8, 8)       # tier 1 fails with MIOpen's error text
OOM = (1, 4, 6, 8, 8)       # tier 1 runs out of memory (not persisted)
GOOD = (1, 4, 7, 8, 8)

SCRIPT = """
import json, sys, torch
from rocm.conv_fallback import ConvFallback
from rocm.faults import Fault, FaultPlan
faults = [Fault(**f) for f in json.loads(sys.argv[1])]
fb = ConvFallback(cache_dir=sys.argv[2], fault_plan=FaultPlan(faults), probe=None)
w = torch.randn(4, 4, 3, 3, 3)
tiers = {}
with torch.no_grad():
    for shape in json.loads(sys.argv[3]):
        fb.conv3d(torch.randn(shape), w, padding=1)
        tiers[str(tuple(shape))] = fb.last_tier
fb.flush()
print(json.dumps({"tiers": tiers, "calls": fb.stats().calls_per_tier}))
"""


def _run(tmp_path, faults, shapes):
    code = "import sys; sys.argv = ['x'] + sys.argv[1:]\n" + SCRIPT
    script = tmp_path / "run.py"
    script.write_text(code)
    result = run_python(f"import runpy, sys; sys.argv = ['run.py', {json.dumps(json.dumps(faults))}, "
                        f"{str(tmp_path / 'cache')!r}, {json.dumps(json.dumps(shapes))}]; "
                        f"runpy.run_path({str(script)!r}, run_name='__main__')")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_verdicts_persist_across_processes(tmp_path):
    first = _run(tmp_path, [{"tier": 1, "kind": "no_algorithm", "input_shape": BAD},
                            {"tier": 1, "kind": "oom", "input_shape": OOM}], [BAD, OOM, GOOD])
    assert first["tiers"] == {str(BAD): 2, str(OOM): 2, str(GOOD): 1}
    files = list((tmp_path / "cache").iterdir())
    assert len(files) == 1 and files[0].name.startswith("conv_verdicts_cpu_torch-")   # no temp files left
    saved = json.loads(files[0].read_text())["verdicts"]
    bad_key = next(k for k in saved if k.startswith("conv3d|x=1x4x5x8x8"))
    assert saved[bad_key]["ok_tier"] == 2 and "No suitable algorithm" in saved[bad_key]["failed"]["1"]
    oom_key = next(k for k in saved if k.startswith("conv3d|x=1x4x6x8x8"))
    assert saved[oom_key]["failed"] == {}          # out-of-memory is not persisted

    # Fresh process: tier 1 would raise a non-GPU error for BAD (a tripwire), so it must not be tried there.
    second = _run(tmp_path, [{"tier": 1, "kind": "error", "input_shape": BAD}], [BAD, OOM, GOOD])
    assert second["tiers"] == {str(BAD): 2, str(OOM): 1, str(GOOD): 1}
    assert second["calls"] == {"2": 1, "1": 2}     # tier 1 ran only for OOM and GOOD


def test_forget_transient_drops_only_out_of_memory_verdicts(tmp_path):
    from rocm.verdicts import VerdictStore

    store = VerdictStore(tmp_path / "v.json")
    store.record_failure("a", 1, "vendor: miopenStatusUnknownError")          # persisted
    store.record_failure("b", 1, "oom: HIP out of memory", persist=False)     # memory only
    store.record_success("b", 2)
    store.forget_transient()
    assert 1 in store.get("a").failed
    assert store.get("b").failed == {} and store.get("b").ok_tier == 2

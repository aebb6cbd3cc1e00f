"""The `solo` mark (tests/solo_room.py): a solo test runs while the other worker's tests wait, and they run side by
side otherwise. A nested pytest run on two workers, each test recording when it ran."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = "from solo_room import pytest_configure, pytest_runtest_protocol, pytest_unconfigure  # noqa: F401\n"
RECORD = """import json, os, time
import pytest

def ran(name, seconds):
    start = time.time()
    time.sleep(seconds)
    with open(os.environ["ROOM_LOG"], "a") as log:
        log.write(json.dumps([name, start, time.time()]) + "\\n")
"""


def test_a_solo_test_runs_alone_and_the_others_side_by_side(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_one.py").write_text(RECORD + "".join(
        f"\ndef test_a{i}():\n    ran('a{i}', 0.4)\n" for i in range(3))
        + "\n@pytest.mark.solo\ndef test_solo():\n    ran('solo', 1.5)\n")
    (tmp_path / "test_two.py").write_text(RECORD + "".join(
        f"\ndef test_b{i}():\n    ran('b{i}', 0.4)\n" for i in range(12)))
    log = tmp_path / "ran.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "STEADYFRAME_TEST_ROOM"))}
    env.update(ROOM_LOG=str(log), PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadfile", "-o", "addopts=", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = {name: (start, end) for name, start, end in map(json.loads, log.read_text().splitlines())}
    assert len(runs) == 16
    solo = runs.pop("solo")
    overlapping = [name for name, (start, end) in runs.items() if start < solo[1] and end > solo[0]]
    assert overlapping == [], (solo, runs)
    # the two files ran side by side otherwise (each worker took one): some a and b tests overlap
    assert any(sa < eb and ea > sb for a, (sa, ea) in runs.items() if a.startswith("a")
               for b, (sb, eb) in runs.items() if b.startswith("b")), runs

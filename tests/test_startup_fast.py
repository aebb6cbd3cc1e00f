"""Issue 33 item 13: `python app.py --help`, a bad option and a typo in an input path are answered before torch,
diffusers or Gradio load (they took 4–22 s). Each command runs in its own process, as a user runs it, through a
small runner that says at exit which of those libraries the process had imported: no timing is asserted."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT

HEAVY = ("torch", "diffusers", "gradio", "transformers")
MARK = "heavy imported: "
# runs app.py (a path) or a package's __main__ (a name) as `python app.py ...` / `python -m cli ...` would
RUNNER = (
    "import atexit, runpy, sys\n"
    f"atexit.register(lambda: print({MARK!r} + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr))\n"
    "target = sys.argv.pop(1)\n"
    "if target.endswith('.py'):\n"
    "    sys.argv[0] = target\n"
    "    runpy.run_path(target, run_name='__main__')\n"
    "else:\n"
    "    runpy.run_module(target, run_name='__main__', alter_sys=True)\n")


def run(target: str, *args, cwd=ROOT) -> tuple[subprocess.CompletedProcess, list[str]]:
    """(the finished process, the heavy libraries it imported)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-c", RUNNER, target, *map(str, args)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=60)
    marks = [line for line in r.stderr.splitlines() if line.startswith(MARK)]
    assert marks, r.stderr[-2000:]
    return r, [m for m in marks[-1][len(MARK):].split(",") if m]


def test_app_help_and_a_bad_option_load_no_heavy_library(tmp_path):
    r, heavy = run(str(ROOT / "app.py"), "--help")
    assert r.returncode == 0 and "--port" in r.stdout and "--preset" in r.stdout
    assert heavy == [], f"app.py --help imported {heavy}"
    missing = tmp_path / "no-such-models"
    r, heavy = run(str(ROOT / "app.py"), "--model-dir", missing)
    assert r.returncode == 2 and "--model-dir" in r.stderr and str(missing) in r.stderr
    assert heavy == [], f"app.py with a bad option imported {heavy}"


def test_a_typo_in_the_image_path_is_said_before_torch_loads(tmp_path):
    missing = tmp_path / "boat.pgn"
    # the real preset (its weights are not here either): the path is checked first, with nothing loaded
    r, heavy = run("cli", "generate", "--image", missing, "--prompt", "a boat", "--out", tmp_path / "out")
    assert r.returncode == 2 and f"--image: file not found: {missing}" in r.stderr, r.stderr[-2000:]
    assert heavy == [], f"a missing --image was said after importing {heavy}"
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"image": "boat.pgn", "prompt": "a boat"}) + "\n")
    r, heavy = run("cli", "batch", jobs, "--preset", "tiny", "--out", tmp_path / "out")
    assert r.returncode == 2 and f"line 1: invalid: image: file not found: {missing}" in r.stderr, r.stderr[-2000:]
    assert heavy == [], f"a batch of missing images imported {heavy}"
    r, heavy = run("cli", "batch", tmp_path / "no.jsonl", "--preset", "tiny", "--out", tmp_path / "out")
    assert r.returncode == 2 and f"jobs: cannot read {tmp_path / 'no.jsonl'}" in r.stderr and heavy == []

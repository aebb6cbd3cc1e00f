"""An installable package: the installed commands run, every package folder is installed, the dependencies are
declared once, nothing edits sys.path, and the modules claimed light import no torch."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
LIGHT = ("pipeline.events", "pipeline.cancel", "common.errors", "pipeline.request", "pipeline.resume",
         "jobfolder.folder", "jobs.runner", "jobs.store", "jobs.preflight", "jobs.local", "cli.commands", "cli.queue",
         "rocm", "configs", "common.files", "common.units", "common.patches", "common.environment", "memory.estimate")


def _python(code: str, cwd: Path = ROOT, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=180)


@pytest.mark.parametrize("script,usage", [("steadyframe-cli", "{generate,batch,resume,post,queue,studio}"),
                                          ("steadyframe", "--preset {hunyuan,tiny}")])
def test_the_installed_commands_run(script, usage):
    """The commands `pip install -e .` made (the README's set-up installs the package) start and answer --help."""
    path = Path(sys.executable).parent / script
    assert path.is_file(), f"{script} is not installed: bash scripts/install.sh --dev (pip install -e .[dev])"
    r = subprocess.run([str(path), "--help"], cwd=ROOT.parent, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert f"usage: {script}" in r.stdout and usage in r.stdout


def test_the_packages_found_are_the_repositorys_packages():
    found = set(PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"])
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert found == on_disk and PYPROJECT["tool"]["setuptools"]["py-modules"] == ["app"]


def test_the_requirements_files_install_the_package_whose_dependencies_are_declared_once():
    lines = [ln for ln in (ROOT / "requirements.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    dev = [ln for ln in (ROOT / "requirements-dev.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines == ["-e ."] and dev == ["-e .[dev]"]
    assert not any(d.startswith("torch") for d in PYPROJECT["project"]["dependencies"])     # the user's build
    assert not (ROOT / "pytest.ini").exists() and "pytest" in PYPROJECT["tool"]      # one place for pytest's config


def test_nothing_edits_sys_path():
    offenders = [str(p.relative_to(ROOT)) for folder in ("benchmarks", "tests") for p in (ROOT / folder).glob("*.py")
                 if "sys.path.insert" in p.read_text("utf-8") and p.name != "test_packaging.py"]
    assert offenders == []


def test_the_light_modules_import_neither_torch_nor_diffusers():
    r = _python(f"import sys\nfor m in {LIGHT!r}: __import__(m)\n"
                "print(sorted(m for m in ('torch', 'diffusers', 'transformers', 'gradio') if m in sys.modules))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_a_benchmark_runs_as_a_script_without_installing(tmp_path):
    """`python3 benchmarks/x.py` on a machine where nothing is installed (BENCHMARKS.md's commands)."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "section.py"), "--help"], cwd=tmp_path,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert "--tiny" in r.stdout


def test_every_long_test_named_in_conftest_exists():
    from tests.conftest import LONG_TESTS

    for key in LONG_TESTS:
        file, _, test = key.partition("::")
        path = ROOT / "tests" / file
        assert path.is_file(), key
        assert not test or f"def {test.split('[')[0]}" in path.read_text("utf-8"), key

"""A newcomer's first hour (issue 17): what the README promises, what the app and the command line say at start-up
and on failure, in words that fit where they are read (page or terminal)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from configs import LIMITS, get_preset
from tests.cli_helpers import cli
from tests.conftest import ROOT, make_image, uploaded

README = (ROOT / "README.md").read_text("utf-8")


def _readme_block_after(marker: str) -> str:
    rest = README[README.index(marker):]
    return rest[rest.index("```bash") + 7: rest.index("```", rest.index("```bash") + 7)].strip()


def test_readme_test_command_is_what_ci_runs():
    command = _readme_block_after("Run the tests:")
    assert command in (ROOT / ".ci" / "run").read_text()


def test_readme_chromium_line_updates_the_package_lists_and_answers_yes():
    line = next(line for line in README.splitlines() if "install -y chromium" in line or "install chromium" in line)
    assert "apt-get update &&" in line and "install -y chromium" in line


def test_readme_api_error_example_is_a_message_the_app_really_gives():
    from common.errors import InputError
    from pipeline.request import Request, prepare

    quoted = re.search(r"e\.g\. `(seconds: [^`]+)`", README.replace("\n", " ")).group(1)
    with pytest.raises(InputError) as e:
        prepare(Request(image=None, seconds=121))
    assert str(e.value) == quoted


def _fake_python(tmp_path) -> Path:
    """An interpreter for scripts/install.sh that runs everything with this Python except pip, which it only logs."""
    log = tmp_path / "pip-calls.log"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = -m ] && [ \"$2\" = pip ]; then echo \"$@\" >> {log}; exit 0; fi\n"
                    f"exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    return fake


def test_installer_does_nothing_the_second_time_and_installs_again_after_a_change(tmp_path):
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    for name in ("scripts/install.sh", "scripts/install.py", "pyproject.toml", "requirements.txt", "requirements-dev.txt"):
        (project / name).write_text((ROOT / name).read_text())
    env = dict(os.environ, PYTHON=str(_fake_python(tmp_path)))
    prefix = subprocess.run([sys.executable, "-c", "import sys; print(sys.prefix)"], capture_output=True,
                            text=True).stdout.strip()
    stamp = Path(prefix) / ".steadyframe-install-app"
    saved = stamp.read_text() if stamp.exists() else None
    try:
        if stamp.exists():
            stamp.unlink()
        runs = [subprocess.run(["bash", "scripts/install.sh"], cwd=project, env=env, capture_output=True,
                               text=True, timeout=120) for _ in range(2)]
        (project / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text().replace(
            '"tqdm>=4.66",', '"tqdm>=4.66", "rich",'))                  # a dependency added
        runs.append(subprocess.run(["bash", "scripts/install.sh"], cwd=project, env=env, capture_output=True,
                                   text=True, timeout=120))
    finally:
        if saved is not None:
            stamp.write_text(saved)
        elif stamp.exists():
            stamp.unlink()
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    pip_calls = (tmp_path / "pip-calls.log").read_text().splitlines()
    assert len(pip_calls) == 2 and all(c.endswith("install -e .") for c in pip_calls)
    assert "nothing to do" in runs[1].stdout and "nothing to do" not in runs[2].stdout


def test_missing_real_weights_are_named_with_sizes_place_and_the_tiny_preset(tmp_path, monkeypatch):
    from pipeline.availability import missing_components, missing_weights_message

    hunyuan = get_preset("hunyuan")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    text = missing_weights_message(hunyuan, "original")
    assert "text_encoder (hunyuanvideo-community/HunyuanVideo/text_encoder, 15 GB)" in text
    assert "transformer (lllyasviel/FramePackI2V_HY, 25.7 GB)" in text and "42.3 GB in all" in text
    assert str(tmp_path / "hub") in text and "--preset tiny" in text and "downloaded once" in text
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE is set" in missing_weights_message(hunyuan, "original")
    assert "does not hold them" in missing_weights_message(hunyuan, "original", tmp_path / "models")
    assert missing_weights_message(get_preset("tiny"), "original") is None

    # present in the cache (a snapshot per repo with its files): nothing is missing any more
    for role, src in hunyuan.sources("original").items():
        folder = tmp_path / "hub" / ("models--" + src.repo.replace("/", "--")) / "snapshots" / "abc"
        folder = folder / src.subfolder if src.subfolder else folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text("{}")
    assert missing_components(hunyuan, "original") == [] and missing_weights_message(hunyuan, "original") is None


def test_the_app_says_at_start_what_is_missing_and_logs_a_failed_job_as_error(tmp_path):
    """`python app.py` (real preset, empty cache, offline): the terminal and the page say at start that the
    weights are missing; Start then fails with an ERROR line in the terminal, not only in the page."""
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    from tests.server_helpers import api_client, app_process

    make_image(96, 80).save(tmp_path / "start.png")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    log_path = tmp_path / "app.log"
    # --host-ram-gb: the real preset's plan must fit (on a CPU the whole transformer sits in RAM)
    with app_process(tmp_path / "outputs", "--host-ram-gb", "64", log_path=log_path, env=env,
                     preset="hunyuan") as (url, _):
        import urllib.request

        with urllib.request.urlopen(url + "config", timeout=30) as r:
            page = r.read().decode("utf-8")
        assert "not on this computer yet" in page and "--preset tiny" in page
        client = api_client(url, tmp_path / "dl")
        try:
            with pytest.raises(AppError, match="could not be downloaded"):
                client.predict(image=handle_file(str(tmp_path / "start.png")), seconds=1, steps=1, api_name="/video")
        finally:
            client.close()
    text = log_path.read_text()
    start = text.index("serving on")
    assert re.search(r"WARNING \S+: The real model weights are not on this computer yet", text[:start])
    assert re.search(r"serving on http://127\.0\.0\.1:\d+/ ", text)                  # the real address
    assert re.search(r"ERROR jobs\.runner: job \w+ failed: text_encoder: the weights", text)
    assert "torchvision" not in text
    assert "To create a public link" not in text and "share=True" not in text     # Gradio's advice, not ours


def test_a_failed_job_pops_up_an_error(tmp_path):
    """The page's handler for a job that fails raises gr.Error (an Error pop-up), after the page's updates."""
    import gradio as gr

    import app as app_module
    from common.errors import WeightsNotFound
    from jobs.models import ComponentCache
    from tests.server_helpers import tiny_runner
    from ui import settings as st
    from ui.launch import parse_args

    def loader(*_):
        raise WeightsNotFound("transformer: the weights are not here")

    runner = tiny_runner(tmp_path / "out", None)
    runner.executor.models = ComponentCache("tiny", loader=loader)
    blocks = app_module.build_app(parse_args(["--preset", "tiny", "--outputs", str(tmp_path / "out")]), runner)
    fns = {f.name: f.fn for f in blocks.fns.values()}
    make_image().save(tmp_path / "start.png")
    values = dict(st.default_values(64), image={"path": uploaded(tmp_path / "start.png")}, end_image=None,
                  input_video=None, seconds=1.2)
    job_id = fns["submit"](SimpleNamespace(session_hash="tab"), *[values[n] for n in st.CONTROLS])[0]
    updates = []
    try:
        with pytest.raises(gr.Error) as e:
            for update in fns["run"](job_id):
                updates.append(update)
    finally:
        runner.close(timeout=30)
    assert "weights are not here" in e.value.message and e.value.title == "The job failed"
    assert updates, "the page was updated before the pop-up"


def test_cli_messages_name_the_option_and_the_resolved_path(tmp_path):
    r = cli("generate", "--preset", "tiny", "--image", "missing.png", "--out", tmp_path / "o", cwd=tmp_path)
    assert r.returncode == 2
    assert f"error: --image: file not found: {tmp_path / 'missing.png'}" in r.stderr
    assert "Upload" not in r.stderr
    make_image(100, 80).save(tmp_path / "a.png")
    r = cli("generate", "--preset", "tiny", "--image", tmp_path / "a.png", "--window", 0, "--out", tmp_path / "o")
    assert r.returncode == 2 and "--latent-window: 0 is out of range" in r.stderr
    sub = tmp_path / "jobs"
    sub.mkdir()
    (sub / "jobs.jsonl").write_text(json.dumps({"image": "nope.png"}) + "\n" +
                                    json.dumps({"image": "../a.png", "latent_window": 99}) + "\n")
    r = cli("batch", sub / "jobs.jsonl", "--preset", "tiny", "--out", tmp_path / "o", cwd=ROOT)
    assert f"line 1: invalid: image: file not found: {sub / 'nope.png'}" in r.stderr
    assert "line 2: invalid: latent_window: 99 is out of range" in r.stderr


def test_resuming_a_complete_job_says_where_its_video_is_and_exits_0_before_loading_anything(tmp_path):
    job = tmp_path / "20250101-000000-abcdef"
    job.mkdir()
    (job / "final.mp4").write_bytes(b"\x00" * 10)
    (job / "job.json").write_text(json.dumps({"status": "done", "final": "final.mp4", "settings": {},
                                              "models": {"preset": "tiny"}}))
    code = ("import sys; from cli.commands import main; rc = main(['resume', sys.argv[1]]); "
            "print('torch loaded' if 'torch' in sys.modules else 'nothing loaded'); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, str(job)], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"already complete; its video is {job / 'final.mp4'}" in r.stdout and "nothing loaded" in r.stdout


def test_one_length_limit_everywhere_and_the_rounding_is_said():
    from ui import hints
    from ui import settings as st

    assert st.limits()["seconds"] == LIMITS.seconds == (1.0, 120.0)
    assert hints.plan_hint(2, 9, "original").startswith("2 s is rounded to whole sections: 2 sections")
    assert "(2.4 s at 30 fps)" in hints.plan_hint(2, 9, "original")
    assert "rounded" not in hints.plan_hint(2.4, 9, "original")


def test_cli_progress_bar_names_the_stage_and_counts_every_step_even_skipped_ones(tmp_path):
    make_image(100, 80).save(tmp_path / "a.png")
    r = cli("generate", "--preset", "tiny", "--image", tmp_path / "a.png", "--seconds", 2.4, "--steps", 6,
            "--teacache", 0.9, "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    bar = r.stderr.replace("\r", "\n")
    assert "loading the tiny models" in bar and "text encoders" in bar
    assert "sampling section 1/2" in bar and "sampling section 2/2" in bar
    assert re.search(r"12/12 \[", bar), bar[-2000:]                      # 2 sections × 6 steps, all counted
    assert "0/100" not in bar
    assert "--seconds 2.4" not in bar                                     # 2.4 s is whole sections: no rounding note
    r = cli("generate", "--preset", "tiny", "--image", tmp_path / "a.png", "--seconds", 2, "--steps", 1, "-q",
            "--out", tmp_path / "o")
    assert r.returncode == 0 and r.stderr == ""                          # -q: quiet
    r = cli("generate", "--preset", "tiny", "--image", tmp_path / "a.png", "--seconds", 2, "--steps", 1,
            "--out", tmp_path / "o")
    assert "--seconds 2 is rounded to whole sections: 2 section(s), 73 frames = 2.4 s" in r.stderr

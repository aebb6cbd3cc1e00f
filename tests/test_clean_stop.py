"""Issue 47 item 1: Ctrl-C or SIGTERM during a job ends it "stopped" (job.json and the queue), its threads joined,
and the process exits 130 or 143 with one line; before, the app printed `terminate called without an active
exception` and exited 134, and the command line's SIGTERM left the job "running"."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jobs import store as qs
from tests.conftest import ROOT, make_image
from tests.kill_helpers import job_folder, shared, tail
from tests.server_helpers import app_process, free_port

LONG_JOB = {"prompt": "a long walk", "seconds": 30, "steps": 6, "seed": 3}      # ~10 sections: seconds on the CPU


def _wait_for(what, check, proc_alive, log, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline and proc_alive(), f"no {what}:\n{tail(log)}"
        time.sleep(0.05)


def _section_made(out):
    folder = job_folder(out)
    return folder is not None and (folder / "section_01.mp4").is_file()


@pytest.mark.timeout(240)
def test_sigterm_stops_the_apps_running_job_cleanly(tmp_path):
    image = tmp_path / "in.png"
    make_image(128, 96, seed=2).save(image)
    out = tmp_path / "out"
    out.mkdir()
    log = tmp_path / "app.log"
    with app_process(out, log_path=log) as (_, proc):
        store, _ = qs.QueueStore.open(out)
        entry = store.add({**LONG_JOB, "image": str(image)}, origin="queue")     # the running app takes it up
        _wait_for("first section", lambda: _section_made(out), lambda: proc.poll() is None, log)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the app did not end within 60 s of SIGTERM:\n{tail(log)}")
    text = log.read_text()
    assert code == 143, text[-3000:]
    assert "terminate called" not in text and "Traceback" not in text
    assert "the running job stops after its current step" in text
    folder = job_folder(out)
    info = json.loads((folder / "job.json").read_text())
    assert info["status"] == "stopped" and info["final"] == "final.mp4" and len(info["videos"]) < 10
    assert store.get(entry.id).status == qs.STOPPED
    assert not store.runner_alive()                       # the lease was given back
    store.close()


def _cli_env():
    return dict(os.environ, HF_HUB_OFFLINE="1",
                PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_stops_the_command_lines_job_cleanly(tmp_path, sig):
    image = tmp_path / "in.png"
    make_image(128, 96, seed=2).save(image)
    out = tmp_path / "out"
    argv = ["generate", "--preset", "tiny", "--image", image, "--out", out, "-q",
            *[a for k, v in LONG_JOB.items() for a in (f"--{k}", v)]]
    proc = shared().start(*argv, separate=True, env=_cli_env())
    _wait_for("first section", lambda: _section_made(out), proc.is_alive, proc.err)
    os.kill(proc.pid, getattr(signal, sig))
    proc.join(60)
    err, said = tail(proc.err, None), tail(proc.log, None)
    assert proc.exitcode == 128 + getattr(signal, sig), err
    assert "Traceback" not in err and "stopping after this step (Ctrl-C again to abort)..." in err
    folder = job_folder(out)
    assert said.strip().splitlines()[-1].startswith(f"stopped; kept {folder / 'final.mp4'} (")
    info = json.loads((folder / "job.json").read_text())
    assert info["status"] == "stopped" and len(info["videos"]) < 10
    store, _ = qs.QueueStore.open(out)
    (entry,) = store.entries()
    assert entry.status == qs.STOPPED and not store.runner_alive()
    store.close()



@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_while_the_app_starts_ends_it_in_one_line(tmp_path, sig):
    """Ctrl-C while the app loaded Gradio and the models printed a traceback (KeyboardInterrupt from deep inside an
    import); a signal after the runner started could kill a job it had just taken up."""
    log = tmp_path / "app.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "app.py", "--preset", "tiny", "--port", str(free_port()),
                                 "--outputs", str(tmp_path / "out")], cwd=ROOT, env=env, stdout=log_file,
                                stderr=subprocess.STDOUT)
        try:
            _wait_for("start-up", lambda: " INFO " in log.read_text(), lambda: proc.poll() is None, log)
            proc.send_signal(getattr(signal, sig))
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert code == 128 + getattr(signal, sig), text[-3000:]
    assert "Traceback" not in text and "stopped while starting" in text and "serving on" not in text


def _signal_inside(catches):
    """A stand-in for code of a library that catches `catches` around where the stop signal lands (CI: a SIGINT
    during start-up was taken by such code, and the app served anyway and never stopped)."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2)                          # the handler runs here, in this (the main) thread
    except catches:
        pass


def test_a_stop_while_starting_is_not_an_exception_code_that_catches_exception_takes(tmp_path, monkeypatch, caplog):
    import app

    monkeypatch.setattr(app, "build_app", lambda config, device=None: _signal_inside(Exception) or 1 / 0)
    before = signal.getsignal(signal.SIGINT)        # (an xdist worker ignores SIGINT)
    with caplog.at_level("INFO"):
        code = app.main(["--preset", "tiny", "--port", str(free_port()), "--outputs", str(tmp_path / "out")])
    assert code == 128 + signal.SIGINT
    said = caplog.text
    assert "stopped while starting" in said and "serving on" not in said
    assert signal.getsignal(signal.SIGINT) == before          # the handler put back


def test_a_stop_that_code_swallowed_while_starting_still_stops_before_serving(tmp_path, monkeypatch, caplog):
    import gradio as gr

    import app

    real = app.build_app
    launched = []
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: launched.append(kw))

    def build(config, device=None):
        _signal_inside(BaseException)         # even KeyboardInterrupt-like exceptions taken
        return real(config, device=device)

    monkeypatch.setattr(app, "build_app", build)
    with caplog.at_level("INFO"):
        code = app.main(["--preset", "tiny", "--port", str(free_port()), "--outputs", str(tmp_path / "out")])
    assert launched == [] and "stopped while starting" in caplog.text and "serving on" not in caplog.text
    assert code == 0                           # built, idle: its runner stopped with nothing to stop (as after serving)

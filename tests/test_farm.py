"""The job farm on a local Ray (two CPU workers, tiny preset): jobs side by side, a worker killed mid-job and its job
finished elsewhere with the same video, End on a farm job, and the app without farm options never importing Ray."""
from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time

import pytest

from pipeline.events import Done, LogLine, MemoryReport, Progress, SectionVideo
from pipeline.request import Request, prepare
from tests.conftest import ROOT, job_folders, make_image
from ui.sessions import Sessions

SETTINGS = dict(prompt="a lighthouse in a storm", seconds=3.6, steps=3, teacache=0.0, resolution=64)   # 3 sections


def _request(seed: int) -> Request:
    return Request(image=make_image(96, 80, seed=seed), seed=seed, **SETTINGS)


@pytest.fixture(scope="module")
def farm(tmp_path_factory, tiny_original):
    """Two CPU workers started as the app starts them (farm.executor.start_farm) from its command line, with a LoRA
    folder (--lora-dir) holding style.safetensors."""
    import argparse

    from configs.options import add_process_options, config_from
    from farm.executor import start_farm
    from tests.lora_helpers import write_comfy

    outputs = tmp_path_factory.mktemp("farm-outputs").resolve()
    loras = tmp_path_factory.mktemp("farm-loras")
    write_comfy(tiny_original.transformer, loras / "style.safetensors")
    p = argparse.ArgumentParser()
    add_process_options(p)
    config = config_from(p, p.parse_args(["--preset", "tiny", "--cpu-workers", "2", "--outputs", str(outputs),
                                          "--vram-cap-gb", "20", "--lora-dir", str(loras)]))
    f = start_farm(config, num_cpus=2).farm
    f.outputs = outputs
    yield f
    f.shutdown()


def _farm_runner(farm, outputs):
    """The one runner (started) with the farm as its executor, as the app makes it with --cpu-workers."""
    from configs.runtime import Config
    from farm.executor import FarmExecutor
    from jobs.models import ComponentCache
    from jobs.runner import open_runner

    executor = FarmExecutor(farm, ComponentCache("tiny"))
    return open_runner(Config(preset="tiny", outputs=outputs), executor, device_type="cpu")[0].start()


@pytest.fixture(scope="module")
def runner(farm):
    r = _farm_runner(farm, farm.outputs)
    yield r
    r.close(timeout=60)


def _stream(runner, session, request, record):
    """Run one job through the runner as the page does; record (time, event) pairs."""
    sessions = Sessions(runner)
    job = sessions.submit(request, session=session)
    for batch in sessions.stream(job):
        record.extend((time.monotonic(), e) for e in batch)


def _info(done: Done) -> dict:
    return json.loads((done.job_dir / "job.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_jobs_run_at_once_on_two_workers(runner):
    records = {seed: [] for seed in (11, 12)}
    threads = [threading.Thread(target=_stream, args=(runner, f"s{seed}", _request(seed), records[seed]))
               for seed in records]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=500)
    ends = {}
    for seed, events in records.items():
        done = events[-1][1]
        assert isinstance(done, Done) and not done.stopped, events[-1]
        first_sampling = next(t for t, e in events if isinstance(e, Progress) and e.stage == "sampling")
        ends[seed] = (first_sampling, events[-1][0])
        worker = _info(done)["worker"]
        assert _info(done)["node"]
        progress = [e for _, e in events if isinstance(e, Progress)]
        assert all(e.message.startswith(f"[{worker}]") for e in progress)        # the queue says where it runs
        assert any(isinstance(e, LogLine) and worker in e.message for _, e in events)
        assert any(isinstance(e, MemoryReport) and e.device == "cpu" for _, e in events)   # the worker's memory
    assert {_info(records[s][-1][1])["worker"] for s in records} == {"worker-1", "worker-2"}
    (a0, a1), (b0, b1) = ends.values()
    assert a0 < b1 and b0 < a1, "the two jobs did not overlap: they ran one after the other"
    assert not runner.busy and runner.placements() == {}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_farm_job_uses_a_lora_from_the_lora_folder(farm):
    """--lora-dir reaches the workers: the job finds style.safetensors there (a worker's own `loras` folder has
    none) and job.json records it, with the worker that ran it."""
    from pipeline.cancel import CancelToken

    request = Request(image=make_image(96, 80, seed=5), seed=5, loras="style.safetensors:1.0",
                      **{**SETTINGS, "seconds": 1.2, "steps": 2})
    events = list(farm.run("lora", prepare(request, 640), CancelToken()))
    done = events[-1]
    assert isinstance(done, Done) and not done.stopped, done
    info = _info(done)
    assert [lora["file"] for lora in info["loras"]] == ["style.safetensors"]
    assert info["worker"].startswith("worker-") and info["workers"] == [{"worker": info["worker"],
                                                                          "node": info["node"]}]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_worker_killed_mid_job_continues_elsewhere_with_the_same_video(farm, runner):
    from pipeline.cancel import CancelToken

    uninterrupted = [e for e in farm.run("reference", prepare(_request(21), 640), CancelToken())][-1]
    assert isinstance(uninterrupted, Done) and not uninterrupted.stopped
    pids = {w["name"]: w["pid"] for w in farm.workers()}

    events, killed = [], None
    for event in farm.run("killed", prepare(_request(21), 640), CancelToken()):
        events.append(event)
        if isinstance(event, SectionVideo) and killed is None:        # section 1 done (its checkpoint is saved)
            killed = farm.assignments["killed"]
            os.kill(pids[killed], signal.SIGKILL)
    done = events[-1]
    assert isinstance(done, Done) and not done.stopped, done
    info = _info(done)
    assert info["status"] == "done" and info["resumed"] == 1
    assert [w["worker"] for w in info["workers"]][0] == killed
    assert info["worker"] != killed                                   # finished on the other worker
    said = [e.message for e in events if isinstance(e, LogLine) and e.level == "warning"]
    assert any(killed in m and "lost" in m and "last finished section" in m for m in said), said
    reference = _info(uninterrupted)
    assert info["sections"][-1]["frames_sha256"] == reference["sections"][-1]["frames_sha256"]
    assert (done.job_dir / "final.mp4").read_bytes() == (uninterrupted.job_dir / "final.mp4").read_bytes()
    # Ray restarted the dead worker: it answers again, from a new process
    again = {w["name"]: w["pid"] for w in farm.workers()}
    assert again.keys() == pids.keys() and again[killed] != pids[killed]
    deadline = time.monotonic() + 120
    while farm.reviving and time.monotonic() < deadline:       # and the farm gives it jobs again
        time.sleep(0.2)
    assert farm.reviving == 0 and not any(s.busy for s in farm.slots)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_end_stops_a_job_on_a_worker(runner):
    sessions = Sessions(runner)
    job = sessions.submit(_request(31), session="stopper")
    events = []
    for batch in sessions.stream(job):
        for e in batch:
            events.append(e)
            if isinstance(e, Progress) and e.stage == "sampling" and e.step == 1 and not job.cancel.cancelled:
                assert sessions.cancel("stopper").startswith("Stopping")
    done = events[-1]
    assert isinstance(done, Done) and done.stopped
    info = _info(done)
    assert info["status"] == "stopped" and len(info["sections"]) < 3


def test_a_post_job_runs_on_a_worker(runner, tmp_path):
    """After the video on the farm: the worker runs the post job (no generation models) in the shared outputs."""
    import numpy as np

    from post.steps import request_from
    from video.mp4 import read_frames, write_mp4

    clip = write_mp4(np.zeros((6, 32, 48, 3), np.uint8) + np.arange(6, dtype=np.uint8)[:, None, None, None] * 40,
                     tmp_path / "clip.mp4", fps=30)
    sessions = Sessions(runner)
    job = sessions.submit(request_from({"source": str(clip), "steps": "interpolate=2"}), session="post")
    events = [e for batch in sessions.stream(job) for e in batch]
    done = events[-1]
    assert isinstance(done, Done) and not done.stopped, events[-3:]
    assert read_frames(done.video).shape == (11, 32, 48, 3) and _info(done)["settings"]["kind"] == "post"


def test_the_app_without_farm_options_never_imports_ray(tmp_path):
    from tests.cli_helpers import cli_env
    from tests.kill_helpers import shared

    code = textwrap.dedent(f"""
        import sys
        import app
        from ui.launch import parse_args
        config = parse_args(["--preset", "tiny", "--outputs", {str(tmp_path)!r}])
        app.build_app(config).runner.close()
        from cli.commands import build_parser
        build_parser().parse_args(["batch", "jobs.jsonl", "--preset", "tiny"])
        assert not config.farm.enabled
        loaded = [m for m in sys.modules if m == "ray" or m.startswith("ray.")]
        assert not loaded, loaded
        print("no ray")
    """)
    # a child of the suite's fork server (tests/kill_helpers.py: torch and the pipeline imported, never Ray), not a
    # fresh interpreter: the same imports of the app, without 10 s of torch's
    r = shared().completed([], cwd=ROOT, env=dict(cli_env(), GRADIO_ANALYTICS_ENABLED="False"), timeout=240,
                           code=code)
    assert r.returncode == 0 and "no ray" in r.stdout, r.stderr[-3000:]


def test_farm_options_are_checked():
    import argparse

    from configs.options import add_process_options, config_from

    p = argparse.ArgumentParser()
    add_process_options(p)
    assert config_from(p, p.parse_args(["--gpus", "0,1"])).farm.gpus == (0, 1)
    assert config_from(p, p.parse_args(["--ray", "auto"])).farm.address == "auto"
    assert not config_from(p, p.parse_args([])).farm.enabled
    for bad in (["--gpus", "a,b"], ["--gpus", "0,0"], ["--cpu-workers", "0"], ["--ray", "auto", "--gpus", "0"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_farm_benchmark_smoke_mode(farm, tmp_path, capsys):
    """benchmarks/farm.py --tiny: the same two 1-section jobs through one worker, then through two. It runs on this
    module's farm (two CPU workers started as the benchmark starts its own, farm.dispatch.Farm.start: a third Ray
    and two more workers cost the suite 25 s)."""
    from benchmarks.farm import main

    out = tmp_path / "farm.json"
    assert main(["--tiny", "--jobs", "2", "--seconds", "1.2", "--out", str(out)], farm=farm) == 0
    report = json.loads(out.read_text())
    one, two = report["one_worker"]["jobs"], report["two_workers"]["jobs"]
    assert len(one) == len(two) == 2 and all(j["sections"] == 1 for j in one + two)
    assert {j["worker"] for j in one} == {"worker-1"} and {j["worker"] for j in two} == {"worker-1", "worker-2"}
    assert report["ratio"] == pytest.approx(report["two_workers"]["wall_s"] / report["one_worker"]["wall_s"],
                                            abs=1e-3)
    assert "ratio two/one" in capsys.readouterr().out and report["cap_held"]
    assert all(s.actor is not None for s in farm.slots) and len(farm.workers()) == 2      # the farm left running


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_app_with_cpu_workers_runs_api_and_batch_jobs_on_its_workers(image, tmp_path_factory):
    """`python app.py --preset tiny --cpu-workers 2`: two /video calls run side by side, each on its own worker; a
    CLI batch file given to the same outputs folder goes into the app's queue and runs on the same workers (the CLI
    builds its own farm with the same function, farm.executor.queue_executor, when no app runs the queue)."""
    from tests.cli_helpers import cli
    from tests.server_helpers import api_client, api_job, app_process, job_info

    outputs = tmp_path_factory.mktemp("app-farm")
    work = tmp_path_factory.mktemp("batch")
    make_image(96, 80, seed=3).save(work / "in.png")
    line = {"image": "in.png", "prompt": "waves roll in", "seconds": 1.2, "steps": 2, "resolution": 64}
    (work / "jobs.jsonl").write_text("\n".join(json.dumps({**line, "seed": s}) for s in (1, 2)) + '\n{"seconds": 1}\n')
    settings = dict(prompt="a lighthouse in a storm", seconds=2.4, steps=2, teacache=0.0, resolution=64)
    with app_process(outputs, "--cpu-workers", "2", log_path=outputs.parent / "app-farm.log",
                     start_timeout=300) as (url, _):
        clients = [api_client(url, tmp_path_factory.mktemp(f"dl{i}"))
                   for i in range(2)]
        jobs = [c.submit(**api_job(image, settings, seed=s), api_name="/video") for c, s in zip(clients, (1, 2))]
        for job in jobs:
            job.result(timeout=400)
        for c in clients:
            c.close()
        r = cli("batch", work / "jobs.jsonl", "--preset", "tiny", "--out", outputs, cwd=work, timeout=400)
    assert "2/3 jobs done" in r.stdout, r.stdout + r.stderr[-3000:]
    assert "line 3: invalid" in r.stderr                     # a bad line is refused before any job runs
    infos = [job_info(d) for d in job_folders(outputs)]
    assert sorted(i["status"] for i in infos) == ["done"] * 4
    assert all(i["worker"].startswith("worker-") and i["node"] and len(i["workers"]) == 1 for i in infos)
    api_workers = {i["worker"] for i in infos if i["settings"]["prompt"] == settings["prompt"]}
    assert api_workers == {"worker-1", "worker-2"}                       # the two API jobs ran side by side


class _HeldFarm:
    """The dispatcher's interface with jobs that hold their worker until released (the line logic alone, no Ray)."""

    def __init__(self, size: int, outputs):
        self.size, self.outputs, self.assignments, self.reviving = size, outputs, {}, 0
        self.release = threading.Event()

    def run(self, key, job, cancel, owner=None):
        self.assignments[key] = f"worker-{len(self.assignments) + 1}"
        yield Progress("sampling", 1, 1, 1, 1, 0.0, None, "Sampling 1/1")
        self.release.wait(60)
        self.assignments.pop(key)
        yield Done(self.outputs, None, 0, cancel.cancelled)


def _first(stream, kind, within: float = 60.0):
    """The first event of `kind` a job's stream (`Sessions.stream` with a tick) brings, within `within` seconds."""
    deadline = time.monotonic() + within
    for batch in stream:
        found = [e for e in batch if isinstance(e, kind)]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no {kind.__name__} in {within} s"
    raise AssertionError(f"the stream ended without a {kind.__name__}")


def test_the_queue_fills_every_worker_then_waits(tmp_path):
    from jobs.line import Waiting

    farm = _HeldFarm(2, tmp_path)
    runner = _farm_runner(farm, tmp_path)
    sessions = Sessions(runner)
    try:
        jobs = [sessions.submit(_request(i), session=f"s{i}") for i in range(3)]
        streams = [sessions.stream(j, tick_s=0.05) for j in jobs]
        # two run at once (each one's first progress; on a busy machine the second may first be told it waits
        # behind the first, for as long as the dispatcher takes to start it); the third waits behind both
        firsts = [_first(streams[0], Progress), _first(streams[1], Progress), _first(streams[2], Waiting)]
        assert sorted(f.message for f in firsts[:2]) == ["[worker-1] Sampling 1/1", "[worker-2] Sampling 1/1"]
        assert firsts[2] == Waiting(2, None) and runner.busy
        assert sorted(runner.placements().values()) == ["worker-1", "worker-2"]
        assert sessions.cancel("s2").startswith("Cancelled")     # End on a waiting job: it never runs
        farm.release.set()
        for s in streams[:2]:
            for _ in s:
                pass
        assert not runner.busy and runner.placements() == {}
    finally:
        runner.close(timeout=30)


def test_the_workers_get_the_process_config_with_absolute_folders_and_no_logins(monkeypatch):
    """farm.executor.start_farm hands each worker the one Config (LoRA folder, cap, compile ...), its folders made
    absolute, the web server's --auth left behind (no Ray needed to see what it hands over)."""
    from pathlib import Path

    from configs.runtime import Config, FarmOptions, WebOptions
    from farm import executor

    handed = []
    monkeypatch.setattr(executor.Farm, "start", classmethod(lambda cls, options, worker, num_cpus=None:
                                                            handed.append(worker) or object()))
    config = Config(preset="tiny", outputs=Path("out"), lora_dir=Path("my-loras"), vram_cap_gb=12.0, compile=False,
                    farm=FarmOptions(cpu_workers=2), web=WebOptions(auth=(("alice", "secret"),)))
    executor.start_farm(config)
    (worker,) = handed
    given = worker.config
    assert given.lora_dir == Path("my-loras").resolve() and given.outputs == Path("out").resolve()
    assert (given.preset, given.vram_cap_gb, given.compile) == ("tiny", 12.0, False)
    assert given.web == WebOptions()

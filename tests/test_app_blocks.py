"""build_app(): the event wiring (one GPU job at a time, End outside the queue) and launching with --auth."""
from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import pytest

import app as app_module
from ui.launch import launch_options, parse_args, serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    config = parse_args(["--preset", "tiny", "--outputs", str(tmp_path_factory.mktemp("outputs"))])
    blocks = app_module.build_app(config)
    yield config, blocks
    blocks.runner.close(timeout=30)


def _fn(blocks, name):
    """The function of the events named `name` (one function, possibly wired to several events)."""
    matches = [f for f in blocks.fns.values() if getattr(f, "name", None) == name]
    assert len({getattr(f.fn, "__func__", f.fn) for f in matches}) == 1, name     # (a method: one function)
    return matches[0]


def test_jobs_share_the_gpu_line_and_end_skips_the_queue(built):
    """Every job (Start and Resume on the page, /video and /resume) goes through the runner's one line (the
    ordering itself: tests/test_app_runner.py); End and the live hints never wait in Gradio's queue."""
    _, blocks = built
    gpu_jobs = [f for f in blocks.fns.values() if getattr(f, "name", None) in ("run", "video", "resume")]
    assert len(gpu_jobs) == 4                       # Start and Resume on the page, /video and /resume
    for job in gpu_jobs:
        assert job.concurrency_id == "gpu" and job.queue
    assert _fn(blocks, "stop").queue is False
    assert _fn(blocks, "submit").preprocess is False          # uploads reach the pipeline's safe loader


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_an_event_with_hidden_progress_shows_it_on_no_component(built):
    """app.no_hidden_trackers: Gradio's page runs a hidden progress tracker through every event all the same (an
    idle page's timers kept headless Chromium busy that way); the page's config names no component for them."""
    _, blocks = built
    deps = blocks.get_config_file()["dependencies"]
    hidden = [d for d in deps if d["show_progress"] == "hidden"]
    assert len(hidden) > 30                                # the page's timers, live hints, queue list, ...
    assert all(d["show_progress_on"] == [] for d in hidden), [d["id"] for d in hidden if d["show_progress_on"]]
    shown = [d for d in deps if d["show_progress"] == "full" and d["show_progress_on"]]
    assert shown                                           # a job's progress still shows (on the progress bar)


def test_the_test_browsers_tracker_file_is_the_one_it_was_written_for():
    """tests/browser_helpers.py serves the browser tests Gradio's progress tracker with its loop ended once the
    tracker has left the page (Gradio 6.31's loader otherwise draws 60 frames a second in every open page): the code
    it changes is in the installed Gradio once. When Gradio changes that file, look again (is the loop still left
    running? then find it in the new file)."""
    from pathlib import Path

    import gradio

    from tests.browser_helpers import TRACKER_LOOP

    assets = Path(gradio.__file__).parent / "templates" / "frontend" / "assets"
    (tracker,) = assets.glob("statustracker-*.js")
    assert tracker.read_text(encoding="utf-8").count(TRACKER_LOOP) == 1


@pytest.mark.parametrize("auth", [None, "user:pw"])
def test_launch_binds_localhost_and_auth_protects_the_app(built, tmp_path, auth):
    argv = ["--preset", "tiny", "--outputs", str(tmp_path), "--port", str(_free_port())]
    config = parse_args(argv + (["--auth", auth] if auth else []))
    blocks = app_module.build_app(config)
    kwargs = launch_options(config).kwargs()
    assert kwargs["server_name"] == "127.0.0.1"
    serve(blocks, **kwargs, prevent_thread_lock=True)
    try:
        base = f"http://127.0.0.1:{config.web.port}"
        assert _get(base + "/") == 200                         # the page itself (a login form with --auth)
        assert _get(base + "/config") == (401 if auth else 200)
    finally:
        blocks.close()
        blocks.runner.close(timeout=30)


def test_handlers_turn_a_job_into_updates(tmp_path, tiny_original):
    """submit -> run -> finish and stop, called as Gradio would (no browser): a broken image is refused with the
    pipeline's message, a good job streams updates ending on final.mp4, End with nothing running says so."""
    from types import SimpleNamespace

    import gradio as gr

    from tests.conftest import make_image, uploaded
    from tests.server_helpers import tiny_runner
    from ui import settings as st

    runner = tiny_runner(tmp_path / "out", tiny_original)
    blocks = app_module.build_app(parse_args(["--preset", "tiny", "--outputs", str(tmp_path / "out")]), runner)
    submit, run, finish, stop = (_fn(blocks, n).fn for n in ("submit", "run", "finish", "stop"))
    session = SimpleNamespace(session_hash="tab-1")
    values = dict(st.default_values(64), seconds=1.2, steps=2, end_image=None, input_video=None)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    values["image"] = {"path": uploaded(broken), "orig_name": "broken.png"}
    with pytest.raises(gr.Error) as e:
        submit(session, *[values[n] for n in st.CONTROLS])
    # the page names the field by its label
    assert e.value.message.startswith("Start image:") and blocks.sessions.last_error("tab-1") == e.value.message

    make_image().save(tmp_path / "start.png")
    values["image"] = {"path": uploaded(tmp_path / "start.png")}
    ticket_id, start_btn, end_btn, status, _ = submit(session, *[values[n] for n in st.CONTROLS])
    assert start_btn["interactive"] is False and end_btn["interactive"] is True and status == "Starting…"
    updates = list(run(ticket_id))
    values_seen = [v for u in updates for v in u.values() if isinstance(v, str)]
    assert any(v.endswith("section_01.mp4") for v in values_seen)
    assert any(v.endswith("final.mp4") for v in values_seen)
    assert any("Done" in v for v in values_seen)
    start_btn, end_btn, gallery, job_dirs, selected, *_, resume_btn = finish(ticket_id, None, session)
    assert start_btn["interactive"] is True and len(gallery) == 1 and len(job_dirs) == 1
    assert selected is None and resume_btn["interactive"] is False
    assert stop(session)[0] == "■ Nothing to stop."
    (update,) = list(run("no-such-ticket"))                     # changes nothing on the page (and is a valid
    assert list(update.values()) == [gr.skip()]                # answer: Gradio refuses an empty dict)
    runner.close(timeout=30)


def test_the_start_check_waits_for_a_page_slower_than_gradios_3_s():
    """A page whose first answer takes 3.5 s (a busy machine's first render): Gradio's own check says "localhost is
    not accessible" (launch() then raises), the app's start check waits for it (ui/launch.py `patient_url_ok`)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import gradio.networking as networking

    from ui.launch import patient_url_ok

    answered = []

    class Slow(BaseHTTPRequestHandler):
        def do_HEAD(self):
            if not answered:
                time.sleep(3.5)
            answered.append(1)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        assert networking.url_ok(url) is False                 # Gradio's: its first 3 s request timed out
        answered.clear()
        assert patient_url_ok(url, within_s=20) is True
        assert not patient_url_ok("http://127.0.0.1:9/", within_s=1)    # nothing listening: no, within its time
    finally:
        server.shutdown()
        server.server_close()


def test_a_late_end_answer_never_stays_over_the_jobs_end(built, monkeypatch):
    """The CI (a full run, tests/test_browser_ui.py's phone test): End's answer ("Stopping at the next step…") and
    the job's stream reach the page by two roads; End sets the job's cancel flag before it answers, so on a busy
    machine its answer landed after the stream's "Stopped" and the page said "Stopping…" for 180 s of a job that had
    stopped in 2.9 s. End's follow-up, which the page asks only once it shows End's answer, shows the job's end again
    if the stream has sent it; if it has not, the stream sends it after. Either way the page ends on the job's end."""
    from types import SimpleNamespace

    import gradio as gr

    from pipeline.events import Done, Progress
    from ui.sessions import STOPPING

    _, blocks = built
    stop = _fn(blocks, "stop")
    follow_up = _fn(blocks, "shown_end")
    assert follow_up.trigger_after == stop._id and follow_up.queue is False           # asked after End's answer
    assert [o._id for o in follow_up.outputs] == [stop.outputs[0]._id]                # ... and it writes the status
    panel = stop.fn.__wrapped__.__self__                                               # (ui/guard.py: functools.wraps)
    ui = panel.ui

    job = SimpleNamespace(id="job-1", entry="job-1", started=True, finished=False,
                          cancel=SimpleNamespace(cancelled=False),
                          request=SimpleNamespace(fps=30, mode="original", seed=1))
    progress = Progress("sampling", 1, 3, 2, 6, 1.0, None)
    ended = Done(job_dir=None, video=None, frames=0, stopped=True, timings={"total": 2.9})

    def stream(job_, tick_s=None):
        yield [progress]
        yield [ended]

    monkeypatch.setattr(panel, "runner", SimpleNamespace(get=lambda job_id: job if job_id == job.id else None))
    monkeypatch.setattr(panel, "sessions", SimpleNamespace(current=lambda session: job, stream=stream,
                                                           cancel=lambda session: STOPPING))
    tab = SimpleNamespace(session_hash="tab-1", username=None, client=SimpleNamespace(host="127.0.0.1"))
    page = {}

    def show(updates):          # the page: the last answer to reach a component is what it shows
        for component, value in updates.items():
            if value != gr.skip():
                page[component] = value

    def end_answer():
        status, *_ = stop.fn(tab)
        show({ui.status: status})

    # End's answer lands after the stream's last update (the CI): the follow-up shows the end again
    for updates in panel.run(job.id, tab):
        show(updates)
    assert "Stopped" in page[ui.status]
    end_answer()
    assert STOPPING in page[ui.status]
    show({ui.status: follow_up.fn(tab)})
    assert "Stopped" in page[ui.status], page[ui.status]

    # End's answer lands first (the usual order): the follow-up changes nothing, the stream's end comes after
    job.id = job.entry = "job-2"
    updates = panel.run(job.id, tab)
    show(next(updates))
    show(next(updates))                             # the progress: the job runs
    end_answer()
    assert follow_up.fn(tab) == gr.skip()
    for u in updates:
        show(u)
    assert "Stopped" in page[ui.status], page[ui.status]

"""Fuzz of the app's whole public surface (`python app.py --preset tiny` in its own process): every event of the page
by fn_index, as a browser sends it (raw HTTP), and the documented API through gradio_client, with hostile values —
huge, negative, NaN and infinite numbers, wrong types, huge strings, nested JSON, missing fields, malformed bodies,
files of the wrong kind and size. For each call: a clear error or a valid answer within a bound. Afterwards: no
thread of the app is left busy (thread CPU times from /proc), the app still makes a normal video, and nothing was
written outside the outputs and temporary folders.

First, before any of that, the same app idles: it uses under 1 % of one core over 7 s with no job and no client
(CPU time from /proc: a poll every 10 ms would cost several times that), and is back there a few seconds after a
burst of 60 hostile live-hint calls (values that used to pin a core each). (This was test_server_idle.py, with an
app of its own: one app started and stopped less.)"""
from __future__ import annotations

import json
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import fuzz_helpers as fz
from tests.conftest import ROOT, make_image
from tests.server_helpers import api_client, app_process

pytestmark = pytest.mark.slow

ANSWER_S = 60                  # any call: an answer (valid or an error) within this
LIVE_ANSWER_S = 5              # an un-queued live handler (hints, memory plan): far less in practice
REPO_SKIP = (".venv", ".git", ".pytest_cache", ".hypothesis", "test-artifacts", "outputs")
IDLE_SHARE_MAX = 0.01          # of one core, for an idle app
HUGE_TEXT = "9" * 300_000
HUGE_WORD = "x" * 1_000_000


def _deep(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["nan", "inf", "-inf", "1e308", "1e309", "-0", "1e12", "0x10", " 5 ", "１２", "original", "f1",
                     "unipc", "euler", "..", "../../etc/passwd", "\x00", "\ud800", "é" * 3]),
    st.just(HUGE_TEXT), st.just(HUGE_WORD), st.just(1e308), st.just(-1e308), st.just(2**63), st.just(10**25))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                                            inner, max_size=4),
                      max_leaves=12)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """The app in its own process, its folders (outputs, Gradio's temp, TMPDIR, HOME) in one test folder, and files
    to upload (none of them a usable image)."""
    root = tmp_path_factory.mktemp("fuzz")
    dirs = {name: root / name for name in ("outputs", "gradio", "tmp", "home")}
    for d in dirs.values():
        d.mkdir()
    env = {"GRADIO_TEMP_DIR": str(dirs["gradio"]), "TMPDIR": str(dirs["tmp"]), "HOME": str(dirs["home"]),
           "MPLCONFIGDIR": str(dirs["tmp"] / "matplotlib")}
    repo_before = fz.files_under(ROOT, REPO_SKIP)
    with app_process(dirs["outputs"], log_path=root / "app.log", env=env) as (url, proc):
        uploads = {}
        for name, content in [("random.png", bytes(range(256)) * 16), ("empty.png", b""),
                              ("text.jpg", b"not a jpeg\n" * 100), ("page.html", b"<script>alert(1)</script>"),
                              ("truncated.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 50)]:
            status, body = fz.upload(url, name, content)
            assert status == 200, body
            uploads[name] = json.loads(body)[0]
        try:                                                                    # over the 64 MB upload limit:
            status, _ = fz.upload(url, "big.png", b"\x00" * (65 * 1024 * 1024))  # refused with 400/413, or the
        except (ConnectionError, urllib.error.URLError) as e:                   # connection closed by the server
            status = "closed while sending"                                     # before the body was all sent
            assert isinstance(getattr(e, "reason", e), ConnectionError), e      # (the CI saw that once)
        assert status in (400, 413, "closed while sending"), status
        yield {"url": url, "proc": proc, "dirs": dirs, "root": root, "events": fz.events(url), "uploads": uploads,
               "repo_before": repo_before}


def _share(pid: int, seconds: float) -> float:
    before, t0 = fz.process_cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (fz.process_cpu_seconds(pid) - before) / (time.monotonic() - t0)


def test_idle_app_uses_no_cpu_before_and_after_a_burst_of_hostile_hints(target):
    """Runs first in this module (pytest keeps file order): before any call but the fixture's uploads."""
    url, proc = target["url"], target["proc"]
    time.sleep(2)                                   # start-up work (first page build) settles
    idle = _share(proc.pid, 7)
    assert idle < IDLE_SHARE_MAX, f"idle app used {idle:.2%} of a core"

    hints = next(e for e in target["events"] if e.name == "show_hints")
    # the hint's inputs (ui/panel_controls.py hint_inputs): mode, end image, seconds, window, cfg, rescale,
    # negative prompt, crf, teacache, steps, prompt (a timeline too), prompt blend, magcache, resolution, width,
    # height
    hostile = [[mode, None, seconds, window, 1, 0, "", 16, 0.15, steps, prompt, blend, 0, "1e400", -1, 10**30]
               for mode in ("original", "f1")
               for seconds in (120, 1200, 1e9, 1e308, "1e12", "nan", "9" * 5000)
               for window in (1, 0.5, 33, -1, "1")
               for steps, prompt, blend in ((25, "[0s: a cat] [2s: a dog] [1e300s: a bird]", 16),
                                            ("1e400", "[0s: x] " * 500, "1e400"))]
    calls = [hostile[(7 * i) % len(hostile)] for i in range(60)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda data: fz.call(url, hints, data, timeout=30), calls))
    assert len(answers) == 60 and all(a.seconds < 30 for a in answers)
    assert any("is not between" in a.body or "⚠" in a.body for a in answers)   # the limit is explained
    time.sleep(2)
    after = _share(proc.pid, 6)
    assert after < IDLE_SHARE_MAX, f"after the burst the app used {after:.2%} of a core"


def _file_payloads(target) -> list:
    files = [{"path": p, "meta": {"_type": "gradio.FileData"}} for p in target["uploads"].values()]
    return files + [{"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}},
                    {"path": "../../../../etc/hostname", "meta": {"_type": "gradio.FileData"}},
                    {"path": str(ROOT / "README.md"), "meta": {"_type": "gradio.FileData"}, "size": -1},
                    {"url": "http://127.0.0.1:9/x.png", "meta": {"_type": "gradio.FileData"}}]


def _check(answer: fz.Answer, event: fz.Event) -> None:
    bound = ANSWER_S if event.queued else LIVE_ANSWER_S
    assert answer.seconds < bound, f"{event.name}: {answer.seconds:.1f} s for one call"
    assert "Traceback" not in answer.body, f"{event.name}: a traceback reached the client: {answer.body[:500]}"


def test_every_event_survives_a_fixed_battery(target):
    """Each event of the page (by fn_index) with the classic bad inputs, and malformed request bodies."""
    url, files = target["url"], _file_payloads(target)
    battery = [lambda n: [1e308] * n, lambda n: ["nan"] * n, lambda n: [None] * n, lambda n: [HUGE_TEXT] * n,
               lambda n: [HUGE_WORD] * n, lambda n: [{"a": [1, {"b": None}]}] * n, lambda n: [-1] * n,
               lambda n: [], lambda n: [0] * (n + 5), lambda n: {"not": "a list"}, lambda n: [_deep(50)] * n,
               lambda n: [files[i % len(files)] for i in range(n)]]
    for i, event in enumerate(target["events"]):         # each event gets a third of the battery, in turn
        for make in battery[i % 3::3]:
            _check(fz.call(url, event, make(len(event.inputs)), timeout=ANSWER_S), event)
        _check(fz.call(url, event, None, event_data={"index": "x" * 1000, "value": _deep(30)}), event)
    for raw in (b"{not json", b"[" * 100_000, json.dumps({"data": [], "fn_index": 10**9}).encode(),
                json.dumps({"data": [], "fn_index": -1}).encode(), json.dumps({"fn_index": "x"}).encode(),
                b"\xff\xfe" * 1000):
        for event in (target["events"][1], next(e for e in target["events"] if e.name == "video")):
            answer = fz.call(url, event, None, raw=raw)
            _check(answer, event)
            assert not answer.ok


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_calls_by_fn_index(target, data):
    """Hypothesis picks an event and fills its inputs (or sends something that is not a list at all)."""
    event = data.draw(st.sampled_from(target["events"]), label="event")
    files = _file_payloads(target)
    one = st.one_of(values, st.sampled_from(files)) if "image" in event.inputs else values
    payload = data.draw(st.one_of(st.lists(one, min_size=len(event.inputs), max_size=len(event.inputs)),
                                  st.lists(one, max_size=len(event.inputs) + 3), values), label="data")
    _check(fz.call(target["url"], event, payload), event)


API_PARAMS = ("image", "end_image", "prompt", "negative_prompt", "seed", "seconds", "mode", "steps", "gs", "cfg",
              "rescale", "latent_window", "sampler", "resolution", "teacache", "preserved_gb", "crf")


@pytest.fixture(scope="module")
def client(target, tmp_path_factory):
    client = api_client(target["url"], tmp_path_factory.mktemp("dl"))
    yield client
    client.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_api_through_gradio_client(client, data, tmp_path_factory):
    """The documented endpoints through gradio_client: hostile keyword values are refused with an AppError (or the
    client refuses to send them, or the server a body over 1 MB with 413); /resume with any job id is refused; /stop answers."""
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    from ui.launch import BODY_BYTES_MAX

    bad = tmp_path_factory.mktemp("bad") / data.draw(st.sampled_from(["a.png", "b.jpg", "c.webp", "d.txt"]))
    bad.write_bytes(data.draw(st.binary(max_size=2000), label="file bytes"))
    kwargs = {"image": handle_file(str(bad))}
    for name in data.draw(st.lists(st.sampled_from(API_PARAMS[2:]), max_size=5, unique=True), label="fields"):
        kwargs[name] = data.draw(scalars, label=name)
    import httpx

    with pytest.raises((AppError, ValueError, TypeError, httpx.HTTPStatusError)) as refused:
        client.predict(**kwargs, api_name="/video")
    if isinstance(refused.value, httpx.HTTPStatusError):               # a body over 1 MB (ui/launch.py BodyCap) ...
        assert refused.value.response.status_code == 413
        sent = sum(len(fz.encode(v)) for k, v in kwargs.items() if k != "image")
        assert sent > BODY_BYTES_MAX - (64 << 10), f"a {sent}-byte call refused as too large"    # ... and only that
    with pytest.raises(AppError):
        client.predict(data.draw(st.one_of(st.text(max_size=300), st.just("../" * 50)), label="job_id"),
                       api_name="/resume")
    assert "Nothing to stop" in str(client.predict(api_name="/stop"))


def test_after_the_fuzz_the_app_is_idle_serves_and_wrote_nothing_elsewhere(target, tmp_path):
    """Runs last in this module (pytest keeps file order): after every call above."""
    from gradio_client import handle_file

    pid = target["proc"].pid
    busy = fz.busy_threads(pid)
    assert not busy, f"threads still busy after the fuzz (share of a core): {busy}"
    outputs = target["dirs"]["outputs"]
    assert not [d for d in outputs.iterdir() if d.name not in (".examples", ".staged", ".queue")], \
        "a refused call left a job folder behind"
    assert not any((outputs / ".staged").glob("*")), "a refused call left its staged images behind"

    make_image(96, 80).save(tmp_path / "start.png")
    client = api_client(target["url"], tmp_path / "dl")
    try:
        video, summary = client.predict(image=handle_file(str(tmp_path / "start.png")), prompt="a calm lake",
                                        seconds=1.2, steps=1, api_name="/video")
    finally:
        client.close()
    assert summary["status"] == "done" and Path(video).stat().st_size > 0

    written = fz.files_under(target["root"], ("outputs", "gradio", "tmp"))
    assert written <= {"app.log"} | {p for p in written if p.startswith("home/.cache/")}, written
    assert fz.files_under(ROOT, REPO_SKIP) - target["repo_before"] <= \
        {p for p in fz.files_under(ROOT, REPO_SKIP) if "__pycache__" in p}

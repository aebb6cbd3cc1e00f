"""The app on a network, probed by hostile clients (127.0.0.1 only, bounded loops): `python app.py --preset tiny` in
its own process.

- No client reads what it did not upload: a path on the server given as an image, an end image, a video, a LoRA or
  a jobs file's image (to /video, /queue_add, /queue_add_images, /queue_import, Start, the memory plan) is refused
  with one message whether the file exists or not; nothing is copied into the outputs or shown.
- The page shows what it made through copies; nothing of the outputs folder is served (the queue's database,
  job.json, the videos under their own paths).
- No client can starve the others: two clients looping the memory plan at 2048×2048 leave a third client's hints
  and random seed answering within a second; one client cannot fill Gradio's queue; the size limits (images per
  request, a jobs file's lines, the LoRA box) answer at once; a job started during the abuse runs; the server's
  memory goes back to its idle figure after the bursts.
"""
from __future__ import annotations

import io
import json
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from tests import fuzz_helpers as fz
from tests.conftest import make_image
from tests.server_helpers import api_client, app_process
from ui.settings import CONTROLS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

JOB = dict(prompt="a quiet sea", seconds=1.2, steps=2, seed=3)
SAME_REFUSAL = "only a file uploaded to this app can be used here"
LATENCY_MAX_S = 1.0     # a live call during the abuse: at most this, or 5x its time before it on a slower machine


def _png(width: int, height: int, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    make_image(width, height, seed=seed).save(buf, format="PNG")
    return buf.getvalue()


def _zeros_png(side: int) -> bytes:
    """A black side×side PNG: a few hundred kB to send, side² pixels to decode."""
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((side, side), np.uint8), "L").save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _words(text: str) -> str:
    return re.sub(r"\{[^}]*\}|'[^']*'|\S*/\S*", "<path>", text)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _file_url(url: str, path) -> str:
    return url + "gradio_api/file=" + urllib.request.pathname2url(str(path))


def _refusal(client, api_name: str, **kwargs) -> str:
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as e:
        client.predict(**kwargs, api_name=api_name)
    return str(e.value)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("abuse")
    secret = root / "server-secret.png"            # a file on the server no client uploaded
    secret.write_bytes(_png(96, 80, seed=9))
    with app_process(root / "outputs", log_path=root / "app.log") as (url, proc):
        yield url, proc, root / "outputs", secret, root


@pytest.fixture(scope="module")
def client(app):
    url, _, _, _, root = app
    return api_client(url, root / "downloads")


def test_server_files_are_never_read_copied_or_served(app, client, tmp_path):
    from gradio_client import handle_file

    url, _, outputs, secret, _ = app
    start = tmp_path / "start.png"
    start.write_bytes(_png(96, 80))
    raw = {"path": str(secret)}                                # a path, without Gradio's file marker
    missing = str(secret.with_name("no-such-file.png"))
    attempts = [
        ("/video", lambda path: dict(image={"path": path}, **JOB)),
        ("/video", lambda path: dict(image=handle_file(str(start)), end_image={"path": path}, **JOB)),
        ("/video", lambda path: dict(input_video={"path": path}, mode="f1", **JOB)),
        ("/queue_add", lambda path: dict(image={"path": path}, **JOB)),
        ("/queue_add", lambda path: dict(image=path, **JOB)),
        ("/queue_add_images", lambda path: dict(images=[handle_file(str(start))], settings={"end_image": path})),
        ("/queue_add_images", lambda path: dict(images=[{"path": path}], settings={"prompt": "x"})),
        ("/queue_import", lambda path: dict(jobs_file={"path": path})),
    ]
    for api_name, kwargs in attempts:
        there = _refusal(client, api_name, **kwargs(str(secret)))
        gone = _refusal(client, api_name, **kwargs(missing))
        # refused, and the answer says nothing of whether the path exists (the same words, paths aside)
        assert _words(there) == _words(gone), (api_name, there, gone)
        assert "not found" not in there and "does not exist" not in there, there
    # the page's own events: Start, and the memory plan (which reads an image's size from its header)
    events = {e.name: e for e in fz.events(url)}
    plain = json.loads(fz.call(url, events["memory_plan"], [6, 640, 0, 0, 9, None]).body)["data"][0]
    shown = fz.call(url, events["memory_plan"], [6, 640, 0, 0, 9, raw]).body
    assert json.loads(shown)["data"][0] == plain                  # the same plan as with no image at all
    values = [raw if name == "image" else None for name in CONTROLS]
    answer = fz.call(url, events["submit"], values)
    assert not answer.ok and SAME_REFUSAL in answer.body
    jobs = outputs / "jobs.jsonl"
    jobs.write_text(json.dumps({"image": str(secret), "prompt": "x"}) + "\n")
    status, body = fz.upload(url, "jobs.jsonl", jobs.read_bytes())
    assert status == 200
    text = _refusal(client, "/queue_import", jobs_file=handle_file(str(jobs)))
    assert "may name no file but the queue's copies" in text
    lora = _refusal(client, "/video", image=handle_file(str(start)), loras="/etc/x.safetensors:1", **JOB)
    assert "name a file of the LoRA folder" in lora
    jobs.unlink()
    # nothing of the secret file reached the outputs, and nothing was queued or started
    copies = [p for p in outputs.rglob("*") if p.is_file() and p.read_bytes() == secret.read_bytes()]
    assert copies == [] and client.predict(api_name="/queue_list") == []
    assert not [d for d in outputs.iterdir() if d.is_dir() and not d.name.startswith(".")]
    # and the server's file itself is not served
    assert _get(_file_url(url, secret)) == 403


def test_only_what_the_page_shows_is_served(app, client, tmp_path):
    from gradio_client import handle_file

    url, _, outputs, _, _ = app
    start = tmp_path / "start.png"
    start.write_bytes(_png(96, 80))
    video, summary = client.predict(image=handle_file(str(start)), **JOB, api_name="/video")
    job = outputs / summary["job_id"]
    assert summary["status"] == "done" and (job / "final.mp4").is_file()
    for private in (outputs / ".queue" / "queue.db", job / "job.json", job / "final.mp4", job / "input.png"):
        assert private.is_file() and _get(_file_url(url, private)) == 403, private
    # what the API returned is a copy that is served (and holds the video)
    assert open(video, "rb").read() == (job / "final.mp4").read_bytes()


def _ask(url, event, data, session) -> tuple[float, object]:
    answer = fz.call(url, event, data, session=session, timeout=30)
    data = json.loads(answer.body).get("data") if answer.ok else None
    return answer.seconds, (data or [None])[0]


def test_hostile_clients_cannot_starve_the_others(app, client, tmp_path):
    from gradio_client import handle_file

    url, proc, outputs, _, _ = app
    events = {e.name: e for e in fz.events(url)}
    server = psutil.Process(proc.pid)
    start = tmp_path / "start.png"
    start.write_bytes(_png(96, 80))
    client.predict(image=handle_file(str(start)), **JOB, api_name="/video")      # models built: the idle figure
    time.sleep(3)
    idle_rss = server.memory_info().rss

    # the same live call before the abuse: the bound below is relative to this machine's speed now
    quiet = min(_ask(url, events["random_seed"], [], "quiet")[0] for _ in range(3))
    latency_max_s = max(LATENCY_MAX_S, 5 * quiet)
    status, body = fz.upload(url, "big.png", _png(2048, 2048))
    assert status == 200
    big = {"path": json.loads(body)[0], "meta": {"_type": "gradio.FileData"}}
    stop = threading.Event()
    hostile_calls = []

    def hostile(session):
        while not stop.is_set():
            fz.call(url, events["memory_plan"], [6, 2048, 0, 0, 64, big], session=session, timeout=60)
            hostile_calls.append(1)

    attackers = [threading.Thread(target=hostile, args=(f"hostile-{n}",), daemon=True) for n in range(2)]
    for t in attackers:
        t.start()
    try:
        # a job started during the abuse still runs
        job = client.submit(image=handle_file(str(start)), **{**JOB, "seed": 4}, api_name="/video")
        victim = uuid.uuid4().hex[:11]
        hint = ["original", None, 5, 9, 1, 0, "", 16, 0.15, 25, "x", 0, 0, 640, 0, 0]   # (magcache, the size)
        slow = []
        for _ in range(10):
            seconds, seed = _ask(url, events["random_seed"], [], victim)
            if not (seconds < latency_max_s and isinstance(seed, int)):
                slow.append(("random seed", round(seconds, 2), seed))
            seconds, text = _ask(url, events["show_hints"], hint, victim)
            if not (seconds < latency_max_s and isinstance(text, str)):
                slow.append(("hints", round(seconds, 2), text))
            time.sleep(0.2)
        assert not slow, slow
        assert len(hostile_calls) >= 4                # the attack did run meanwhile
        # size limits answer at once, naming the limit
        t0 = time.monotonic()
        lora = fz.call(url, events["added"], ["a.safetensors", 1.0, "x.safetensors:1, " * 100_000], session=victim)
        assert lora.seconds < latency_max_s
        many = [handle_file(str(start))] * 33
        assert "at most 32" in _refusal(client, "/queue_add_images", images=many, settings={"prompt": "x"})
        lines = tmp_path / "lines.jsonl"
        lines.write_text('{"prompt": "x"}\n' * 600)
        assert "at most 500" in _refusal(client, "/queue_import", jobs_file=handle_file(str(lines)))
        assert time.monotonic() - t0 < 30
        # one client cannot fill Gradio's queue, however many session ids it makes up: its events beyond 16
        # waiting or running (this address's) are refused
        status, body = fz.upload(url, "bomb.png", _zeros_png(8192))       # slow to check: 67 Mpixels to decode
        bomb = {"path": json.loads(body)[0], "meta": {"_type": "gradio.FileData"}}
        check = events["check_image"]
        # (all 24 at once: sent one after another, on a slow machine or under coverage the first checks could end
        # before the last joins came, and nothing was beyond the limit to refuse)
        with ThreadPoolExecutor(24) as pool:
            codes = list(pool.map(lambda n: fz._post(url + "gradio_api/queue/join", fz.encode({
                "data": [bomb], "fn_index": check.fn_index, "session_hash": f"flooder-{n}", "event_data": None,
                "trigger_id": None}), 30), range(24)))
        refused = [body for code, body in codes if code != 200]
        assert refused and all("Too many requests" in body for body in refused), codes
        _, summary = job.result(timeout=300)
        assert summary["status"] == "done"
    finally:
        stop.set()
        for t in attackers:
            t.join(90)
    # the memory the bursts took goes back within a minute
    deadline = time.monotonic() + 60
    while server.memory_info().rss > 1.2 * idle_rss and time.monotonic() < deadline:
        time.sleep(2)
    rss = server.memory_info().rss
    assert rss <= 1.2 * idle_rss, f"RSS {rss / 2**20:.0f} MiB a minute after the bursts; idle {idle_rss / 2**20:.0f}"


PROMPT_BURST = 20                   # calls with a 20 MB prompt (issue 41: RSS 607 -> 1230 MB, not returned)


def _settled_rss(server, seconds: float = 15) -> int:
    """The process's RSS once two reads a second apart differ by less than 2 % (or after `seconds`)."""
    before, deadline = server.memory_info().rss, time.monotonic() + seconds
    while True:
        time.sleep(1)
        now = server.memory_info().rss
        if abs(now - before) < 0.02 * before or time.monotonic() > deadline:
            return now
        before = now


def test_a_burst_of_20_mb_prompts_leaves_the_memory_where_it_was(app):
    """Twenty 20 MB prompts at once, to the live hints, the token count, /video and /queue_add, then twenty just
    under the body cap to the hints and the token count: every oversized call is answered 413 and the smaller
    ones are answered; the server's RSS is back within 20 % of its idle figure (issue 41: "RSS back within 20 %
    of idle a minute after a burst"), well before a minute on an idle machine."""
    import logging

    url, proc, _, _, _ = app
    events = {e.name: e for e in fz.events(url)}
    server = psutil.Process(proc.pid)
    idle = _settled_rss(server)
    hint = ["original", None, 5, 9, 1, 0, "", 16, 0.15, 25, "x", 0, 0, 640, 0, 0]
    big = "a cat " * (20 * 2**20 // 6)                                          # 20 MB of prompt
    near = "a cat " * ((2**20 - 4096) // 6)                                     # just under the 1 MB cap
    peak, sampling = [idle], threading.Event()

    def sample():
        while not sampling.is_set():
            peak.append(server.memory_info().rss)
            time.sleep(0.05)

    def send(n: int, prompt: str):
        name = ("show_hints", "token_count", "video", "queue_add")[n % 4] if prompt is big else \
            ("show_hints", "token_count")[n % 2]
        event = events[name]
        data = [prompt] if name == "token_count" else hint[:10] + [prompt] + hint[11:] if name == "show_hints" else \
            [{"prompt": prompt}]
        route = "gradio_api/queue/join" if event.queued else "gradio_api/run/predict"
        body = fz.encode({"data": data, "fn_index": event.fn_index, "session_hash": f"burst-{n}",
                          "event_data": None, "trigger_id": None})
        try:
            return fz._post(url + route, body, 120)
        except OSError as e:                   # (a connection reset: no answer at all)
            return None, repr(e)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    answers: dict = {}
    stages = []                                    # the settled RSS after each burst
    try:
        for prompt in (big, near):
            threads = [threading.Thread(target=lambda n=n, p=prompt: answers.__setitem__((p is big, n), send(n, p)))
                       for n in range(PROMPT_BURST)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            stages.append(_settled_rss(server, 5))
    finally:
        sampling.set()
        watcher.join(10)
    oversized = [status for (was_big, _), (status, _) in answers.items() if was_big]
    assert oversized == [413] * PROMPT_BURST, str(sorted((k, v[0], v[1][:60]) for k, v in answers.items() if k[0]))
    under = [(status, text[:120]) for (was_big, _), (status, text) in answers.items() if not was_big]
    assert len(under) == PROMPT_BURST and all(status == 200 for status, _ in under), under
    t0, deadline = time.monotonic(), time.monotonic() + 60
    while server.memory_info().rss > 1.2 * idle and time.monotonic() < deadline:
        time.sleep(1)
    after = _settled_rss(server, 10)
    mib = [round(r / 2**20) for r in (idle, max(peak), *stages, after)]
    logging.getLogger(__name__).info(
        "prompt bursts: idle RSS %d MiB, peak %d MiB, %d MiB after the 20 MB ones, %d MiB after the 1 MB ones, "
        "%d MiB %.0f s later (%+.1f %% of idle)", *mib, time.monotonic() - t0, 100 * (after / idle - 1))
    assert after <= 1.2 * idle, (f"RSS {after / 2**20:.0f} MiB after the burst (peak {max(peak) / 2**20:.0f}); "
                                 f"idle {idle / 2**20:.0f}")

"""Raw-HTTP access to a launched app for the fuzz tests: its event table from /config, calls by fn_index as a
browser makes them (un-queued events: POST /gradio_api/run/predict; queued ones: /gradio_api/queue/join and the
session's event stream), uploads, and the CPU time of each of the app's threads read from /proc."""
from __future__ import annotations

import json
import os
import secrets
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    fn_index: int
    name: str
    queued: bool
    inputs: tuple[str, ...]         # component types, e.g. ("slider", "image")


@dataclass
class Answer:
    ok: bool                        # a valid answer (False: an error the app reported)
    seconds: float
    body: str


def events(url: str) -> list[Event]:
    """Every event of the page that runs Python (js-only events have no backend function)."""
    with urllib.request.urlopen(url + "config", timeout=30) as r:
        config = json.load(r)
    types = {c["id"]: c["type"] for c in config["components"]}
    return [Event(d["id"], str(d.get("api_name")), bool(d.get("queue")), tuple(types[i] for i in d["inputs"]))
            for d in config["dependencies"] if d.get("backend_fn")]


def _post(url: str, body: bytes, timeout: float, content_type="application/json") -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def encode(payload) -> bytes:
    """JSON as a browser would send it; NaN/inf (which JSON lacks) as JavaScript's JSON.stringify sends them."""
    return json.dumps(payload, allow_nan=True).encode("utf-8")


def call(url: str, event: Event, data, *, event_data=None, timeout: float = 60.0, raw: bytes | None = None,
         session: str | None = None) -> Answer:
    """Call `event` with `data` (any JSON value; normally a list, one value per input) as the page does.
    `raw` replaces the whole request body (malformed JSON and the like). `session`: the page's session (a new one
    per call by default)."""
    session = session or uuid.uuid4().hex[:11]
    body = raw if raw is not None else encode({"data": data, "fn_index": event.fn_index, "event_data": event_data,
                                               "session_hash": session, "trigger_id": None})
    t0 = time.monotonic()
    if not event.queued:
        status, text = _post(url + "gradio_api/run/predict", body, timeout)
        return Answer(status == 200 and '"error"' not in text[:200], time.monotonic() - t0, text[:2000])
    status, text = _post(url + "gradio_api/queue/join", body, timeout)
    if status != 200:
        return Answer(False, time.monotonic() - t0, text[:2000])
    event_id = json.loads(text)["event_id"]
    stream = urllib.request.urlopen(url + f"gradio_api/queue/data?session_hash={session}", timeout=timeout)
    with stream:
        for line in stream:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{event.name}: no answer within {timeout} s")
            if not line.startswith(b"data:"):
                continue
            message = json.loads(line[5:])
            if message.get("event_id") == event_id and message.get("msg") == "process_completed":
                return Answer(bool(message.get("success")), time.monotonic() - t0, json.dumps(message)[:2000])
    return Answer(False, time.monotonic() - t0, "the event stream closed without an answer")


def upload(url: str, name: str, content: bytes, timeout: float = 60.0) -> tuple[int, str]:
    """POST /gradio_api/upload as the page does; returns (status, body): the body lists the server-side paths."""
    boundary = secrets.token_hex(12)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    return _post(url + "gradio_api/upload", body, timeout, f"multipart/form-data; boundary={boundary}")


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each thread of process `pid`, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue                                   # the thread ended meanwhile
        out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_threads(pid: int, seconds: float = 3.0, share: float = 0.2) -> dict[str, float]:
    """Threads that used more than `share` of a core over `seconds` (a stuck handler spins at ~1.0)."""
    before = thread_cpu_seconds(pid)
    time.sleep(seconds)
    after = thread_cpu_seconds(pid)
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    return {tid: round(s / seconds, 3) for tid, s in used.items() if s / seconds > share}


def files_under(root, skip: tuple[str, ...] = ()) -> set[str]:
    """Relative paths of every file under `root`, leaving out top-level folders named in `skip`."""
    out = set()
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in skip]
        out.update(os.path.normpath(os.path.join(rel, f)) for f in files)
    return out

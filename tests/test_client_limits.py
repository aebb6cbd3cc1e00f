"""Limits a client cannot reset (ui/guard.py, jobs/runner.py QueueCaps, ui/queue_api.py): the queue on disk refuses
jobs past its caps (in all and per user) before any work, /queue_list answers a page at a time, and the checks of
added jobs never hold the concurrency group of everyone's list, moves and removes."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from common.errors import InputError
from jobs.runner import QueueCaps
from tests.conftest import make_image, uploaded
from tests.server_helpers import api_client, launched, tiny_runner
from ui.access import Access
from ui.queue_api import LIST_PAGE, QueueActions


@pytest.fixture
def actions(tmp_path, tiny_original):
    runner = tiny_runner(tmp_path / "out", tiny_original)             # not started: nothing runs
    yield QueueActions(runner, Access.of([("alice", "a"), ("bob", "b")]))
    runner.store.close()


def test_the_disk_queue_refuses_past_its_caps(actions, tmp_path):
    picture = tmp_path / "in.png"
    make_image(96, 80).save(picture)
    actions.runner.caps = QueueCaps(total=5, per_client=3)
    assert len(actions.add_images([uploaded(picture)] * 3, {"prompt": "a"}, "alice")) == 3
    with pytest.raises(InputError, match="at most 3") as e:
        actions.add_images([uploaded(picture)], {"prompt": "a"}, "alice")
    assert e.value.field == "queue"
    assert len(actions.add_images([uploaded(picture)] * 2, {"prompt": "b"}, "bob")) == 2
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"prompt": "c", "start_from": "noise"}\n')
    for call in (lambda: actions.add_images([uploaded(picture)], {"prompt": "b"}, "bob"),
                 lambda: actions.import_jsonl(uploaded(jobs), "bob"),
                 lambda: actions.add({"image": uploaded(picture), "prompt": "b"}, "bob")):
        with pytest.raises(InputError, match="takes at most 5"):
            call()
    assert len(actions.store.entries()) == 5


def test_one_adding_call_checks_a_bounded_number_of_pixels(actions, tmp_path, monkeypatch):
    """Checking images is the slow part of adding jobs (~2.5 s for an 8192×8192 PNG on this machine): one call's
    images are summed from their headers before any is decoded, so that no call holds a slot of the adding group
    for long (32 images of 8192×8192 once held it for ~80 s)."""
    import json

    from ui import queue_api

    picture = tmp_path / "in.png"
    make_image(96, 80).save(picture)
    monkeypatch.setattr(queue_api, "REQUEST_PIXELS_MAX", 3 * 96 * 80)
    added = actions.add_images([uploaded(picture)] * 3, {"prompt": "a"}, "alice")
    with pytest.raises(InputError, match="megapixels of images in one call") as e:
        actions.add_images([uploaded(picture)] * 4, {"prompt": "a"}, "alice")
    assert e.value.field == "images" and len(actions.store.entries()) == 3
    with pytest.raises(InputError, match="megapixels of images in one call"):      # a keyframe's image counts too
        actions.add_images([uploaded(picture)] * 2, {"prompt": "a", "keyframes": f"[1s] {uploaded(picture)}"}, "alice")
    assert len(actions.store.entries()) == 3
    exported = Path(actions.export_path("alice")).read_text("utf-8").splitlines()[0]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text((exported + "\n") * 4)                             # one copy named four times: four checks
    with pytest.raises(InputError, match="megapixels of images in one call") as e:
        actions.import_jsonl(uploaded(jobs), "alice")
    assert e.value.field == "jobs file" and len(actions.store.entries()) == 3
    jobs.write_text((exported + "\n") * 3)
    assert [json.loads(exported)["image"]] == [f"{added[0].id}/start.png"]
    assert len(actions.import_jsonl(uploaded(jobs), "alice")) == 3


def test_queue_list_answers_a_page_at_a_time(actions):
    for n in range(LIST_PAGE + 5):
        actions.store.add({"prompt": f"p{n}", "start_from": "noise"}, owner="alice")
    first = actions.listing("alice")
    assert len(first) == LIST_PAGE and first[0]["prompt"] == "p0"
    rest = actions.listing("alice", LIST_PAGE, LIST_PAGE)
    assert [e["prompt"] for e in rest] == [f"p{n}" for n in range(LIST_PAGE, LIST_PAGE + 5)]
    assert len(actions.listing("alice", 0, 10 ** 9)) == LIST_PAGE and actions.listing("bob") == []


def test_checking_added_jobs_never_holds_the_queue_group(tmp_path, tiny_original):
    from gradio_client import handle_file


    picture = tmp_path / "in.png"
    make_image(96, 80).save(picture)
    with launched(tmp_path / "outputs", tiny_original) as server:
        api = {fn.api_name: fn.fn for fn in server.blocks.fns.values()}
        actions = api["queue_add_images"].__self__.actions
        release, started = threading.Event(), []

        def slow_checks(images, values, user=None, client=None):     # as 12 large images take to check
            started.append(1)
            release.wait(30)
            return []

        actions.add_images = slow_checks
        client = api_client(server.url, tmp_path / "dl")
        try:
            held = [client.submit(images=[handle_file(str(picture))], settings={}, api_name="/queue_add_images")
                    for _ in range(3)]
            deadline = time.monotonic() + 30
            while len(started) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(started) == 2                          # the adding group is full
            t0 = time.monotonic()
            assert client.predict(0, 100, api_name="/queue_list") == []
            client.predict(api_name="/queue_export")
            assert time.monotonic() - t0 < 5                  # answered while the checks run
        finally:
            release.set()
            for job in held:
                job.result(timeout=60)
            client.close()


def test_a_client_is_its_login_or_its_address_never_its_session_id():
    from types import SimpleNamespace as NS

    from ui.guard import client_key

    def req(host, session="s1", username=None, **headers):
        return NS(client=NS(host=host), session_hash=session, username=username, headers=headers)

    assert client_key(req("10.0.0.5", "a")) == client_key(req("10.0.0.5", "b")) == "address 10.0.0.5"
    assert client_key(req("10.0.0.5", username="alice")) == client_key(req("10.0.0.9", username="alice"))
    tunnel = req("127.0.0.1", **{"x-forwarded-for": "203.0.113.7, 10.1.1.1"})
    assert client_key(tunnel) == "address 127.0.0.1"                           # without --share: not trusted
    assert client_key(tunnel, forwarded=True) == "address 203.0.113.7"        # --share: the visitor's address
    assert client_key(req("10.0.0.5", **{"x-forwarded-for": "1.2.3.4"}), forwarded=True) == "address 10.0.0.5"


def test_fresh_session_ids_neither_get_more_slots_nor_grow_the_guard(monkeypatch):
    from types import SimpleNamespace as NS

    from ui import guard as guard_module
    from ui.guard import KEPT_SESSIONS_MAX, HandlerGuard

    monkeypatch.setattr(guard_module, "LATEST_WAIT_S", 0.5)   # the first refused call waits that long for a slot
    guard = HandlerGuard(limit=8, per_session=1)
    inside, release = threading.Event(), threading.Event()

    def hint(x):
        inside.set()
        release.wait(10)
        return x

    wrapped = guard.wrap(hint, lambda: "busy", latest_wins=True)
    client = NS(client=NS(host="10.0.0.5"), username=None, headers={})
    first = threading.Thread(target=wrapped, args=(1, NS(**vars(client), session_hash="s0")))
    first.start()
    assert inside.wait(10)
    answers = [wrapped(2, NS(**vars(client), session_hash=f"fresh-{n}")) for n in range(KEPT_SESSIONS_MAX * 4)]
    assert set(answers) == {"busy"}                  # one call of this client at a time, whatever its session ids
    newest, _ = wrapped.kept
    assert len(newest) <= KEPT_SESSIONS_MAX          # what it keeps of refused calls is bounded
    other = NS(client=NS(host="10.0.0.6"), username=None, headers={}, session_hash="x")
    plain = guard.wrap(lambda x: x, lambda: "busy")
    assert plain(3, other) == 3                      # another client has its own slot
    release.set()
    first.join(10)


def test_fresh_session_ids_do_not_raise_a_clients_queue_limit(tmp_path, tiny_original):
    import json

    from tests import fuzz_helpers as fz

    picture = tmp_path / "in.png"
    make_image(96, 80).save(picture)
    with launched(tmp_path / "outputs", tiny_original) as server:
        api = {fn.api_name: fn.fn for fn in server.blocks.fns.values()}
        actions = api["queue_add_images"].__self__.actions
        release = threading.Event()
        # held until all 24 calls are in (released in `finally`): a bound that cannot run out on a loaded machine
        actions.add_images = lambda images, values, user=None, client=None: (release.wait(600), [])[1]
        event, = (e for e in fz.events(server.url) if e.name == "queue_add_images")
        status, body = fz.upload(server.url, "in.png", picture.read_bytes())
        image = {"path": json.loads(body)[0], "meta": {"_type": "gradio.FileData"}}
        codes = []
        try:
            for n in range(24):                                  # a new session id for each call
                payload = fz.encode({"data": [[image], {}], "fn_index": event.fn_index, "session_hash": f"s{n}",
                                     "event_data": None, "trigger_id": None})
                codes.append(fz._post(server.url + "gradio_api/queue/join", payload, 30))
        finally:
            release.set()
        refused = [text for code, text in codes if code != 200]
        assert len(refused) == 24 - 16 and all("Too many requests" in text for text in refused), codes[-3:]
        # a request body other than an upload is capped (a 20 MB prompt is refused before it is read whole)
        huge = fz.encode({"data": ["x" * (3 << 20)], "fn_index": event.fn_index, "session_hash": "big",
                          "event_data": None, "trigger_id": None})
        status, text = fz._post(server.url + "gradio_api/queue/join", huge, 30)
        assert status == 413 and "request body over 1 MB" in text
        # ... whatever it claims to be (only Gradio's upload routes take multipart bodies, bounded by their own
        # limit), and sent without a length (chunked): a 413 too, not the route's own "error parsing the body"
        for route in ("gradio_api/queue/join", "gradio_api/run/predict"):
            status, text = fz._post(server.url + route, huge, 30, "multipart/form-data; boundary=x")
            assert status == 413 and "request body over 1 MB" in text, (route, status, text[:200])
            for chunk in (1 << 16, len(huge)):
                status, text = _post_chunked(server.url + route, huge, chunk)
                assert status == 413 and "request body over 1 MB" in text, (route, chunk, status, text[:200])
        assert fz.upload(server.url, "big.png", b"\0" * (3 << 20))[0] == 200       # an upload over 1 MB is not capped
        assert fz._post(server.url + "gradio_api/queue/join", payload, 30)[0] in (200, 503)    # still serving


def _post_chunked(url: str, body: bytes, chunk: int) -> tuple[int, str]:
    """POST `body` without a Content-Length (Transfer-Encoding: chunked, `chunk` bytes a piece)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        connection.request("POST", where.path, body=(body[i:i + chunk] for i in range(0, len(body), chunk)),
                           headers={"Content-Type": "application/json"}, encode_chunked=True)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def _from_address(monkeypatch, host: str) -> None:
    """This test's HTTP calls (tests/fuzz_helpers.py) leave from `host` (another loopback address: another client
    as the server sees it)."""
    import functools
    import http.client
    import urllib.request

    class Handler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(functools.partial(http.client.HTTPConnection, source_address=(host, 0)), req)

    monkeypatch.setattr(urllib.request, "urlopen", urllib.request.build_opener(Handler).open)


def test_one_address_cannot_fill_the_disk_queue_and_its_export_names_no_server_path(tmp_path, tiny_original,
                                                                                   monkeypatch):
    """Without --auth: each queue entry records the address that added it and the per-client cap counts it, so one
    address cannot fill the queue on disk while another can still add; the export of a job one client added
    names the queue's copy of its image, never a server path, and imports again."""
    import json

    from jobs import store as qs
    from jobs.runner import QueueCaps
    from tests import fuzz_helpers as fz

    outputs = tmp_path / "outputs"
    picture = tmp_path / "in.png"
    make_image(96, 80).save(picture)
    elsewhere, _ = qs.QueueStore.open(outputs)
    assert elsewhere.take_lease("another app")             # another live process runs the queue: jobs stay waiting
    try:
        with launched(outputs, tiny_original) as server:
            server.runner.caps = QueueCaps(total=6, per_client=3)
            events = {e.name: e for e in fz.events(server.url)}

            def call(name, *data):                      # (ok, the answer's first 2000 characters)
                answer = fz.call(server.url, events[name], list(data), timeout=60)
                return answer.ok, answer.body

            def upload(name: str, content: bytes) -> dict:
                status, body = fz.upload(server.url, name, content)
                assert status == 200, body
                return {"path": json.loads(body)[0], "orig_name": name, "meta": {"_type": "gradio.FileData"}}

            def jobs_file(n: int) -> dict:
                return upload("jobs.jsonl", b'{"prompt": "p", "start_from": "noise"}\n' * n)

            _from_address(monkeypatch, "127.0.0.2")                      # client A
            ok, answer = call("queue_add_images", [upload("in.png", picture.read_bytes())], {"prompt": "a"})
            assert ok, answer
            (added,) = server.runner.store.entries()
            ok, answer = call("queue_export")
            assert ok, answer
            text = Path(json.loads(answer)["output"]["data"][0]["path"]).read_text("utf-8")
            (line,) = [json.loads(t) for t in text.splitlines()]
            assert line["image"] == f"{added.id}/start.png"               # the queue's copy, by its name there
            for server_path in (str(outputs), str(outputs.resolve()), qs.QUEUE_DIR, tempfile_root()):
                assert server_path not in text, (server_path, text)
            again = upload("again.jsonl", text.encode("utf-8"))        # what it exported imports again
            ok, answer = call("queue_import", again)
            assert ok and '"image": "start.png"' in answer, answer

            ok, answer = call("queue_import", jobs_file(2))             # A's third and fourth: past its cap
            assert not ok and "one address may have at most 3" in str(answer), answer
            ok, answer = call("queue_import", jobs_file(1))             # its third
            assert ok, answer
            ok, answer = call("queue_add_images", [upload("in.png", picture.read_bytes())], {"prompt": "a"})
            assert not ok and "you have 3 jobs waiting and one address may have at most 3" in str(answer)

            _from_address(monkeypatch, "127.0.0.1")                      # client B still adds
            ok, answer = call("queue_import", jobs_file(3))
            assert ok, answer
            ok, answer = call("queue_import", jobs_file(1))             # the queue's own cap, in all
            assert not ok and "the queue takes at most 6" in str(answer), answer
            clients = [e.client for e in server.runner.store.entries([qs.WAITING])]
            assert clients == ["address 127.0.0.2"] * 3 + ["address 127.0.0.1"] * 3
    finally:
        elsewhere.release_lease("another app")
        elsewhere.close()


def tempfile_root() -> str:
    """The folder Gradio's uploads and the exports are kept under (a server path a client must not see)."""
    from gradio.utils import get_upload_folder

    return str(Path(get_upload_folder()))

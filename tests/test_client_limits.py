"""Limits a client cannot reset (ui/guard.py, jobs/runner.py QueueCaps, ui/queue_api.py): the queue on disk refuses
jobs past its caps (in all and per user) before any work, /queue_list answers a page at a time, and the checks of
added jobs never hold the concurrency group of everyone's list, moves and removes."""
from __future__ import annotations

import threading
import time

import pytest

from common.errors import InputError
from jobs.runner import QueueCaps
from tests.conftest import make_image, uploaded
from tests.server_helpers import launched, tiny_runner
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
    actions.runner.caps = QueueCaps(total=5, per_owner=3)
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


def test_queue_list_answers_a_page_at_a_time(actions):
    for n in range(LIST_PAGE + 5):
        actions.store.add({"prompt": f"p{n}", "start_from": "noise"}, owner="alice")
    first = actions.listing("alice")
    assert len(first) == LIST_PAGE and first[0]["prompt"] == "p0"
    rest = actions.listing("alice", LIST_PAGE, LIST_PAGE)
    assert [e["prompt"] for e in rest] == [f"p{n}" for n in range(LIST_PAGE, LIST_PAGE + 5)]
    assert len(actions.listing("alice", 0, 10 ** 9)) == LIST_PAGE and actions.listing("bob") == []


def test_checking_added_jobs_never_holds_the_queue_group(tmp_path, tiny_original):
    from gradio_client import Client, handle_file

    picture = tmp_path / "in.png"
    make_image(96, 80).save(picture)
    with launched(tmp_path / "outputs", tiny_original) as server:
        api = {fn.api_name: fn.fn for fn in server.blocks.fns.values()}
        actions = api["queue_add_images"].__self__.actions
        release, started = threading.Event(), []

        def slow_checks(images, values, user=None):          # as 12 large images take to check
            started.append(1)
            release.wait(30)
            return []

        actions.add_images = slow_checks
        client = Client(server.url, verbose=False, download_files=str(tmp_path / "dl"))
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

"""A damaged queue database is moved aside with a warning and the app's runner starts on an empty queue (the queue
surviving the app being killed: tests/test_one_queue.py)."""
from __future__ import annotations

import logging

import torch

from app import app_runner
from configs.runtime import Config
from jobs import store as qs


def test_a_damaged_queue_database_is_moved_aside_and_the_app_starts(tmp_path, caplog):
    outputs = tmp_path / "out"
    outputs.mkdir()
    qs.QueueStore(outputs).folder.mkdir()
    qs.QueueStore(outputs).path.write_bytes(b"\x00garbage, not SQLite\x00" * 64)
    with caplog.at_level(logging.WARNING):
        runner, warning = app_runner(Config(preset="tiny", outputs=outputs), torch.device("cpu"))
    try:
        assert "could not be read" in warning and "moved to" in warning     # shown on the queue panel
        assert any("could not be read" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        assert runner.store.entries() == [] and runner.idle
        runner.store.add({"prompt": "a new queue"})                          # and it works
        assert [e.settings["prompt"] for e in runner.store.entries()] == ["a new queue"]
    finally:
        runner.close()
    aside = list(qs.QueueStore(outputs).folder.glob(qs.DB_NAME + ".damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"\x00garbage")


def test_the_page_announces_the_jobs_the_last_run_left_in_the_queue(tmp_path):
    """Jobs left queued by the last run (one interrupted while it ran) are said on the queue panel when a page opens,
    while some of them are still to run (issue 33: they were picked up silently)."""
    from types import SimpleNamespace

    from ui.access import Access
    from ui.panel_queue import QueuePanel
    from ui.queue_api import QueueActions

    outputs = tmp_path / "out"
    outputs.mkdir()
    store, _ = qs.QueueStore.open(outputs)
    first = store.add({"prompt": "was running"})
    store.add({"prompt": "was waiting"})
    store.update(first.id, status=qs.RUNNING)                # the app died while it ran
    left = store.entries([qs.WAITING, qs.RUNNING])
    runner = SimpleNamespace(store=store)
    panel = QueuePanel(SimpleNamespace(access=Access.of(None), runner=runner), QueueActions(runner, Access.of(None)),
                       None)
    assert panel.recovered_text(None) == ""                  # nothing recovered: nothing said
    panel.recovered = {e.id: e.status == qs.RUNNING for e in left}
    text = panel.recovered_text(None)
    assert text.startswith("ℹ 2 queued jobs from before the restart run now, in order (1 interrupted: it continues")
    for e in left:
        store.update(e.id, status="done")
    assert panel.recovered_text(None) == ""                  # all ran: the note goes
    store.close()

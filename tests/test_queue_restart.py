"""A damaged queue database is moved aside with a warning and the app's runner starts on an empty queue (the queue
surviving the app being killed: tests/test_one_queue.py)."""
from __future__ import annotations

import logging

import gradio as gr
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


def test_the_lists_timer_sends_a_tab_the_list_only_when_it_changed(tmp_path):
    """The queue list's timer (every REFRESH_S in every open tab) sends a tab nothing while its list is what the tab
    shows (Gradio's page draws a data frame again whenever it is sent one); a change, a new pick, a button's answer
    in between, or another tab are sent."""
    from types import SimpleNamespace

    from ui.access import Access
    from ui.panel_queue import QueuePanel
    from ui.queue_api import QueueActions

    outputs = tmp_path / "out"
    outputs.mkdir()
    store, _ = qs.QueueStore.open(outputs)
    try:
        runner = SimpleNamespace(store=store)
        panel = QueuePanel(SimpleNamespace(access=Access.of(None), runner=runner),
                           QueueActions(runner, Access.of(None)), None)
        tab, other = (SimpleNamespace(username=None, session_hash=h) for h in ("tab", "other"))
        skipped = (gr.skip(), gr.skip())

        def sent(answer) -> bool:
            return answer != skipped

        first = store.add({"prompt": "a fox"})
        assert sent(panel.tick(None, tab))                         # the first look
        assert not sent(panel.tick(None, tab))                     # the same list: nothing
        assert sent(panel.tick(None, other))                       # another tab has its own
        store.add({"prompt": "a hare"})
        table, pick = panel.tick(None, tab)                        # a new job: sent
        assert [r[3] for r in table] == ["a fox", "a hare"]
        assert not sent(panel.tick(None, tab))
        assert sent(panel.tick(first.id, tab))                     # the tab picked a row
        assert not sent(panel.tick(first.id, tab))
        panel.refresh(None, tab)                                   # a button's answer showed the list without it
        assert sent(panel.tick(first.id, tab))
        nobody = SimpleNamespace(username=None, session_hash=None)      # no tab to remember: always sent
        assert sent(panel.tick(first.id, nobody)) and sent(panel.tick(first.id, nobody))
    finally:
        store.close()


def test_an_interrupted_job_put_back_in_line_is_picked_removed_and_loaded_as_a_waiting_one(tmp_path, tiny_original):
    """Issue 44: the queue panel's row of a job the last run left running (put back in line, to continue in its
    folder) is picked by a click like a waiting one's, its settings load into the page, and Remove takes it out of
    the queue (its job folder stays, to be resumed)."""
    from types import SimpleNamespace

    from tests.conftest import make_image
    from tests.server_helpers import tiny_runner
    from ui.access import Access
    from ui.panel_queue import QueuePanel, rows
    from ui.queue_api import QueueActions
    from ui.settings import CONTROLS

    runner = tiny_runner(tmp_path / "out", tiny_original)              # not started: nothing runs
    try:
        store = runner.store
        image = tmp_path / "in.png"
        make_image(96, 80).save(image)
        folder = tmp_path / "out" / "20250101-000000-abcdef"
        folder.mkdir(parents=True)
        entry = store.add({"image": str(image), "prompt": "was running", "seconds": 2.4}, job_dir=folder.name)
        store.add({"image": str(image), "prompt": "was waiting"})
        store.update(entry.id, status=qs.WAITING, message=qs.INTERRUPTED)      # as the next runner puts it back
        assert store.get(entry.id).interrupted
        ctx = SimpleNamespace(access=Access.of(None), runner=runner, default_resolution=64, public_notice="")
        panel = QueuePanel(ctx, QueueActions(runner, Access.of(None)), None)
        request = SimpleNamespace(username=None, session_hash="tab")
        table, pick = panel.refresh(None, request)
        row = next(r for r in table if r[1] == entry.id)
        picked = QueuePanel.pick_row(SimpleNamespace(row_value=row))
        assert picked == entry.id and entry.id in [value for _, value in pick["choices"]]
        table, pick = panel.refresh(picked, request)                   # the list's next refresh keeps the pick
        assert pick["value"] == entry.id
        values = dict(zip(CONTROLS, panel.load(picked, request)))
        assert values["prompt"] == "was running" and values["seconds"] == 2.4
        text, table, pick = panel.remove(picked, request)
        assert f"Removed job {entry.id}" in text and store.get(entry.id) is None
        assert [r[3] for r in table] == ["was waiting"] == [r[3] for r in rows(store.entries())]
        assert folder.is_dir()                                         # the folder stays, to be resumed
    finally:
        runner.store.close()

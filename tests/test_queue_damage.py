"""Issue 47 item 4: the queue survives its own damage. A database that cannot be read keeps its waiting jobs (what
SQLite can still read of it, and the journal copy beside it, `entries.json`) with their images; only a writer
moves the damaged file aside (`queue list` reads and changes nothing); a zero-byte queue.db takes the journal's jobs
back; a database another program keeps locked is waited for with one line, and given up with one line (exit 1),
never a traceback. Before, `queue list` moved a damaged file aside (its warning printed twice), the waiting jobs
were gone with their images orphaned, a zero-byte queue.db emptied the queue silently, and a locked one ended in
`sqlite3.OperationalError: database is locked`."""
from __future__ import annotations

import os
import sqlite3
import threading
import time

import pytest

from cli import queue as cli_queue
from jobs import store as qs
from tests.conftest import ROOT, make_image
from tests.kill_helpers import shared


def cli(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return shared().completed([str(a) for a in args], env=env, timeout=120)


@pytest.fixture
def queued(tmp_path):
    """An outputs folder whose queue holds two waiting jobs (with their images) and a finished one."""
    image = tmp_path / "in.png"
    make_image(96, 80, seed=1).save(image)
    out = tmp_path / "out"
    store, _ = qs.QueueStore.open(out)
    done = store.add({"image": str(image), "prompt": "finished"})
    store.update(done.id, status=qs.DONE)
    waiting = [store.add({"image": str(image), "prompt": p, "seconds": 1.2}) for p in ("first", "second")]
    store.close()
    return out, [e.id for e in waiting]


def _images(out, ids):
    return [sorted(p.name for p in (qs.QueueStore(out).images_root / i).iterdir()) for i in ids]


def test_a_damaged_queue_keeps_its_waiting_jobs_and_only_a_writer_moves_it(queued):
    out, ids = queued
    db = qs.QueueStore(out).path
    db.write_bytes(b"not a database, a damaged one " * 200)
    for suffix in ("-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    before = db.read_bytes()
    r = cli("queue", "list", "--out", out)
    assert r.returncode == 0, r.stderr
    (warning,) = r.stderr.strip().splitlines()                   # one line, once
    assert warning == (f"warning: the queue database {db} could not be read (file is not a database); shown: the 2 "
                       f"job(s) recovered from it and its journal (the app or the next queue change repairs it)")
    assert [line.split()[0] for line in r.stdout.splitlines()] == ids
    assert db.read_bytes() == before and not list(db.parent.glob("queue.db.damaged-*"))    # the reader moved nothing

    store, found = qs.QueueStore.open(out)                       # a writer: the app, `queue add`, a command line
    aside = list(db.parent.glob("queue.db.damaged-*"))
    assert found.warning == (f"the queue database {db} could not be read (file is not a database); it was moved to "
                             f"{aside[0].name} and the queue starts again with the 2 job(s) recovered from it and "
                             f"its journal")
    assert [(e.id, e.status, e.settings["prompt"]) for e in store.entries()] == [
        (ids[0], qs.WAITING, "first"), (ids[1], qs.WAITING, "second")]
    assert _images(out, ids) == [["start.png"], ["start.png"]]    # their images, where the entries say
    assert all(os.path.isfile(e.images["image"]) for e in store.entries())
    store.close()


def test_a_zero_byte_queue_database_takes_its_jobs_back_from_the_journal(queued):
    out, ids = queued
    db = qs.QueueStore(out).path
    for suffix in ("", "-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    db.write_bytes(b"")
    store, found = qs.QueueStore.open(out)
    assert found.warning == (f"the queue database {db} was empty; the 2 unfinished job(s) of its journal "
                             f"(entries.json) are back in the queue")
    assert [e.id for e in store.entries([qs.WAITING])] == ids
    store.close()


def _hold_lock(db_path, seconds: float, ready: threading.Event):
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    ready.set()
    time.sleep(seconds)
    db.execute("ROLLBACK")
    db.close()


def test_a_locked_queue_database_is_waited_for_with_one_line(queued):
    out, ids = queued
    ready = threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(qs.QueueStore(out).path, 4.0, ready))
    holder.start()
    ready.wait(10)
    r = cli("queue", "remove", ids[0], "--out", out)
    holder.join()
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"removed {ids[0]}"
    (line,) = r.stderr.strip().splitlines()
    assert line.endswith(f"WARNING jobs.store: the queue database {qs.QueueStore(out).path} is locked by another "
                         f"program; waiting for it (up to 120 s)")


def test_a_database_locked_for_too_long_ends_in_one_line(queued, monkeypatch, capsys):
    out, ids = queued
    monkeypatch.setattr(qs, "LOCK_WAIT_S", 0.5)
    monkeypatch.setattr(cli_queue.cli_log, "setup_logging", lambda **_: None)     # (this process's logging as it is)
    ready = threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(qs.QueueStore(out).path, 3.0, ready))
    holder.start()
    ready.wait(10)
    try:
        code = cli_queue.main(["remove", ids[0], "--out", str(out)])
    finally:
        holder.join()
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (f"error: the queue database {qs.QueueStore(out).path} is locked by "
                                            f"another program (a database browser, a backup?); close it and try "
                                            f"again")
    store, _ = qs.QueueStore.open(out)
    assert [e.id for e in store.entries([qs.WAITING])] == ids          # nothing changed
    store.close()

"""The one job queue, on disk: one SQLite database in the outputs folder (outputs/.queue/queue.db) and the queued
jobs' own copies of their images (outputs/.queue/images/<entry id>/), so the queue survives a restart, a crash or a
power loss. Every way of starting a job adds it here (the page's Start, the API, the queue panel, the command
line, a batch file), and the one runner (jobs/runner.py) runs it.

An entry is a job's settings (control values by name, as in job.json) and its images, a place in line, a status
(waiting, running, done, stopped, failed), its progress, where it came from (page, api, queue, cli, batch), who
started it and, once it has one, its job folder. One process at a time holds the runner's lease (`take_lease`):
the one that runs the queue. When a process takes it, the entries left running by the process that held it
before (killed, or gone) wait again first in line, and each continues in its job folder (pipeline/resume.py).

Storage: the standard library's sqlite3 in WAL mode, one connection per thread, every change in one
transaction (`BEGIN IMMEDIATE`), so the app, its API calls and `python -m cli queue` in another process see
one consistent queue in one order. A database that cannot be read (a damaged file, another program's file, a
newer schema) is moved aside (`queue.db.damaged-<time>`) with a warning and a new, empty queue is started.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import secrets
import shutil
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import psutil

from common.errors import InputError
from common.files import atomic_copy, atomic_write_bytes, file_sha256
from jobs.jsonl import FILE_NAMES, IMAGE_FIELDS, VIDEO_SHA256

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3                      # 2: entries.owner and .origin; 3: .client (older ones are brought up to it)
QUEUE_DIR = ".queue"                    # under outputs/: hidden from the gallery (its name starts with a dot)
DB_NAME = "queue.db"                    # in QUEUE_DIR
IMAGES_DIR = "images"                   # in QUEUE_DIR: <entry id>/start.png, end.png
WAITING, RUNNING, DONE, STOPPED, FAILED = "waiting", "running", "done", "stopped", "failed"
FINISHED = (DONE, STOPPED, FAILED)
INTERRUPTED = "interrupted: continues in its job folder"     # the message of an entry a dead runner left running
SHOWN_INTERRUPTED = "interrupted"     # how a reader shows an entry whose runner died (`read`): `queue remove` takes it
ORIGINS = ("page", "api", "queue", "cli", "batch")      # where an entry came from (the page's Start: "page")
LEASE_STALE_S = 30.0        # a lease of another computer's runner not renewed this long is free (it died there)
BUSY_TIMEOUT_S = 2.0        # SQLite's own wait for a lock, each try
LOCK_WAIT_S = 120.0         # how long a change waits for a database another process keeps locked, in all
JOURNAL_NAME = "entries.json"   # in QUEUE_DIR: the unfinished entries as of the last change (the database's spare)
COLUMNS = ("id", "position", "status", "settings", "images", "job_dir", "progress", "message", "created", "updated",
           "owner", "origin", "client")
JOURNALED = ("id", "position", "status", "settings", "images", "job_dir", "created", "owner", "origin", "client")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id        TEXT PRIMARY KEY,
    position  INTEGER NOT NULL,
    status    TEXT NOT NULL,
    settings  TEXT NOT NULL,
    images    TEXT NOT NULL,
    job_dir   TEXT,
    progress  REAL NOT NULL DEFAULT 0,
    message   TEXT NOT NULL DEFAULT '',
    created   REAL NOT NULL,
    updated   REAL NOT NULL,
    owner     TEXT,
    origin    TEXT NOT NULL DEFAULT 'queue',
    client    TEXT
);
CREATE INDEX IF NOT EXISTS entries_position ON entries (position);
"""


@dataclass(frozen=True)
class Entry:
    id: str
    position: int
    status: str
    settings: dict
    images: dict                        # {"image": path, "end_image": path or None}: the queue's own copies
    job_dir: str | None = None          # the job's folder name under outputs/, once the job has one
    progress: float = 0.0
    message: str = ""
    created: float = 0.0
    updated: float = 0.0
    owner: str | None = None            # the app's user who added it (ui/access.py); None without logins
    origin: str = "queue"               # page, api, queue, cli, batch
    client: str | None = None           # who added it, as the app's limits key a client (ui/guard.py client_key:
                                        # "login NAME", else "address HOST"); None: the command line

    @property
    def interrupted(self) -> bool:
        """It was running when its runner went away: it waits again, to continue in its job folder."""
        return self.status == WAITING and self.message == INTERRUPTED

    def values(self) -> dict:
        """Settings and image paths by control name (a Request's fields)."""
        return {**self.settings, **{k: v for k, v in self.images.items() if v and k in FILE_NAMES}}

    def summary(self) -> dict:
        """The entry as the API and the export show it."""
        return {"id": self.id, "status": self.status, "progress": round(self.progress, 4),
                "message": self.message, "job_id": self.job_dir, "origin": self.origin, **self.values()}


def _png(image) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    (image if isinstance(image, Image.Image) else Image.fromarray(image)).save(buf, format="PNG")
    return buf.getvalue()


def _started(pid: int) -> float | None:
    """When the process `pid` of this computer started (None: there is none)."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def _lease(token: str, now: float) -> dict:
    return {"token": token, "pid": os.getpid(), "started": _started(os.getpid()), "host": socket.gethostname(),
            "renewed": now}


def _lease_gone(held: dict, now: float) -> bool:
    """The holder is gone. On this computer: its process ended (its pid is free, or another process has it now);
    a live holder keeps its lease however long since it renewed it (a paused or busy process is not gone). On
    another computer, where its process cannot be seen: it stopped renewing for LEASE_STALE_S (a holder that finds
    its lease taken stops its jobs: jobs/runner.py)."""
    if held.get("host") == socket.gethostname():
        try:
            started = _started(int(held.get("pid", -1)))
        except (TypeError, ValueError):
            return True
        recorded = held.get("started")
        return started is None or (isinstance(recorded, (int, float)) and abs(started - recorded) > 1.0)
    return now - float(held.get("renewed", 0)) > LEASE_STALE_S


def missing(entry_id) -> InputError:
    """What asking for an entry that is not there (or not the asker's) gets."""
    return InputError("queued job", f"there is no job {repr(entry_id)[:60]} in the queue; use an id from the queue's "
                                    f"list")


@dataclass
class Recovered:
    """What `QueueStore.open` found: a warning when the database had to be recovered or moved aside."""
    warning: str | None = None


class QueueLocked(RuntimeError):
    """Another process kept the queue's database locked for LOCK_WAIT_S."""


SQLITE_BUSY, SQLITE_LOCKED = 5, 6       # SQLite's result codes (the sqlite3 module names them from Python 3.11 on)


def _locked(error: sqlite3.OperationalError) -> bool:
    return getattr(error, "sqlite_errorcode", None) in (SQLITE_BUSY, SQLITE_LOCKED)


def _selected(db) -> str:
    """COLUMNS as a SELECT list of `db`'s entries table, NULL for those an older schema lacks (a reader that changes
    nothing reads a database the next writer brings up to SCHEMA_VERSION)."""
    have = {r[1] for r in db.execute("PRAGMA table_info(entries)")}
    return ", ".join(c if c in have else f"NULL AS {c}" for c in COLUMNS)


def _rows_of(path: Path) -> list[tuple]:
    """The entries' rows SQLite can still read from a damaged database, one row at a time (a damaged page loses its
    own rows only); [] when nothing can be read. Read-only: the file is not changed."""
    rows: list[tuple] = []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error:
        return rows
    try:
        rowids = [r[0] for r in db.execute("SELECT rowid FROM entries")]
        selected = _selected(db)
        for rowid in rowids:
            try:
                row = db.execute(f"SELECT {selected} FROM entries WHERE rowid = ?", (rowid,)).fetchone()
                json.loads(row[3]), json.loads(row[4])
                rows.append(tuple(row))
            except (sqlite3.Error, TypeError, ValueError):
                continue
    except sqlite3.Error:
        pass
    finally:
        db.close()
    return rows


def _journal_rows(folder: Path) -> list[tuple]:
    """The unfinished entries the journal copy (JOURNAL_NAME) kept as of the last change; [] when it has none."""
    try:
        data = json.loads((folder / JOURNAL_NAME).read_text("utf-8"))
        defaults = {"progress": 0.0, "message": "recovered from the queue's journal", "owner": None,
                    "origin": "queue", "client": None}
        return [tuple(json.dumps(e[c]) if c in ("settings", "images") else e[c] if c in e else
                      defaults.get(c, e["created"]) for c in COLUMNS) for e in data["entries"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


class QueueStore:
    """The queue of one outputs folder. Thread-safe (a connection per thread); several processes may share it."""

    def __init__(self, outputs: Path):
        self.outputs = Path(outputs)
        self.folder = self.outputs / QUEUE_DIR
        self.path = self.folder / DB_NAME
        self.images_root = self.folder / IMAGES_DIR
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._guard = threading.Lock()

    # ---- opening ----------------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, outputs: Path) -> tuple["QueueStore", Recovered]:
        """The store of `outputs` (created when missing). A database that cannot be read is recovered: the entries
        SQLite can still read from it, and the unfinished ones of the journal copy that it lost, go into a new
        database (their ids, order and images kept), and the damaged file is moved aside. A database found empty
        (a zero-byte file) takes the journal's entries back. Waits for a database another process keeps locked
        (QueueLocked after LOCK_WAIT_S)."""
        store = cls(outputs)
        store.folder.mkdir(parents=True, exist_ok=True)
        found = Recovered()
        try:
            store._waiting(store._check)
        except sqlite3.DatabaseError as e:
            found.warning = store._recover(e)
        else:
            found.warning = store._refill()
        return store, found

    @classmethod
    def read(cls, outputs: Path) -> tuple[list[Entry], str | None]:
        """The entries, for a reader that changes nothing (`queue list`, `export`): a damaged database is read as far
        as it can be, with the journal's unfinished entries it lost, and left where it is (the next writer recovers
        it); (entries, a warning or None)."""
        store = cls(outputs)
        if not store.path.is_file():
            return [], None
        try:
            with contextlib.closing(sqlite3.connect(f"file:{store.path}?mode=ro", uri=True,
                                                    timeout=BUSY_TIMEOUT_S)) as db:
                if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                    raise sqlite3.DatabaseError("integrity check failed")
                rows = db.execute(f"SELECT {_selected(db)} FROM entries ORDER BY position").fetchall()
                lease = db.execute("SELECT value FROM meta WHERE key = 'runner'").fetchone()
            if rows or store.path.stat().st_size:
                orphaned = lease is None or _lease_gone(json.loads(lease[0]), time.time())
                return [cls._shown(cls._entry(r), orphaned) for r in rows], None
        except sqlite3.DatabaseError as e:
            rows = store._salvaged()
            return [cls._entry(r) for r in rows], (
                f"the queue database {store.path} could not be read ({str(e).splitlines()[0][:200]}); shown: the "
                f"{len(rows)} job(s) recovered from it and its journal (the app or the next queue change repairs it)")
        rows = _journal_rows(store.folder)
        return [cls._entry(r) for r in rows], (f"the queue database {store.path} is empty; shown: the {len(rows)} "
                                               f"job(s) of its journal" if rows else None)

    def _salvaged(self) -> list[tuple]:
        """The rows readable from the database, and the journal's unfinished entries it does not hold, in order."""
        rows = _rows_of(self.path)
        ids = {r[0] for r in rows}
        rows += [r for r in _journal_rows(self.folder) if r[0] not in ids]
        return sorted(rows, key=lambda r: r[1])

    def _recover(self, error: Exception) -> str:
        self.close()
        rows = self._salvaged()
        warning = self._move_aside(error, len(rows))
        self._check()
        self._insert(rows)
        return warning

    def _refill(self) -> str | None:
        """A database found empty while the journal holds unfinished entries (a zero-byte or replaced file): the
        journal's entries are taken back."""
        if self._db().execute("SELECT COUNT(*) FROM entries").fetchone()[0]:
            return None
        rows = _journal_rows(self.folder)
        if not rows:
            return None
        self._insert(rows)
        warning = (f"the queue database {self.path} was empty; the {len(rows)} unfinished job(s) of its journal "
                   f"({JOURNAL_NAME}) are back in the queue")
        log.warning(warning)
        return warning

    def _insert(self, rows: list[tuple]) -> None:
        with self._write() as db:
            for row in rows:
                db.execute(f"INSERT OR IGNORE INTO entries ({', '.join(COLUMNS)}) VALUES "
                           f"({', '.join('?' * len(COLUMNS))})", row)

    def _check(self) -> None:
        db = self._db()
        db.execute("PRAGMA journal_mode=WAL")
        problem = db.execute("PRAGMA quick_check").fetchone()[0]
        if problem != "ok":
            raise sqlite3.DatabaseError(f"integrity check: {problem}")
        db.executescript(SCHEMA)
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif row[0] in ("1", "2"):
            with self._write() as tx:           # (another process may have done it meanwhile)
                found = tx.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
                if found == "1":                # before owners: every entry is the app's (no owner), queued
                    tx.execute("ALTER TABLE entries ADD COLUMN owner TEXT")
                    tx.execute("ALTER TABLE entries ADD COLUMN origin TEXT NOT NULL DEFAULT 'queue'")
                    tx.execute("UPDATE entries SET status = ? WHERE status = 'in line'", (WAITING,))
                if found in ("1", "2"):         # before clients: no entry counts against a client's cap
                    tx.execute("ALTER TABLE entries ADD COLUMN client TEXT")
                    tx.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))
        elif row[0] != str(SCHEMA_VERSION):
            raise sqlite3.DatabaseError(f"schema version {row[0]}; this version of the app reads {SCHEMA_VERSION}")

    def _move_aside(self, error: Exception, kept: int = 0) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.path.with_name(f"{DB_NAME}.damaged-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = Path(str(self.path) + suffix)
            if source.exists():
                source.replace(Path(str(target) + suffix))
        warning = (f"the queue database {self.path} could not be read ({str(error).splitlines()[0][:200]}); it was "
                   f"moved to {target.name} and the queue starts again with the {kept} job(s) recovered from it and "
                   f"its journal")
        log.warning(warning)
        return warning

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._local.db = db
            with self._guard:
                self._connections.append(db)
        return db

    def close(self) -> None:
        with self._guard:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()

    class _Transaction:
        def __init__(self, db, store):
            self.db, self.store = db, store

        def __enter__(self):
            self.store._waiting(lambda: self.db.execute("BEGIN IMMEDIATE"))
            return self.db

        def __exit__(self, kind, value, tb):
            if kind is None:
                self.store._journal(self.db)
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")
            return False

    def _write(self):
        return self._Transaction(self._db(), self)

    def _locked_text(self) -> str:
        return (f"the queue database {self.path} is locked by another program (a database browser, a backup?); "
                f"close it and try again")

    def _waiting(self, start):
        """`start()`, waiting (LOCK_WAIT_S in all, said once in the log) while another process keeps the database
        locked; QueueLocked then."""
        deadline, said = time.monotonic() + LOCK_WAIT_S, False
        while True:
            try:
                return start()
            except sqlite3.OperationalError as e:
                if not _locked(e):
                    raise
                if time.monotonic() > deadline:
                    raise QueueLocked(self._locked_text()) from None
                if not said:
                    log.warning("the queue database %s is locked by another program; waiting for it (up to %.0f s)",
                                self.path, LOCK_WAIT_S)
                    said = True

    def _journal(self, db) -> None:
        """(In a write transaction.) The unfinished entries, copied beside the database: what a damaged or emptied
        database is recovered from (`open`)."""
        rows = db.execute(f"SELECT {', '.join(JOURNALED)} FROM entries WHERE status IN (?, ?) ORDER BY position",
                          (WAITING, RUNNING)).fetchall()
        text = json.dumps({"entries": [{c: (json.loads(v) if c in ("settings", "images") else v)
                                        for c, v in zip(JOURNALED, r)} for r in rows]})
        path = self.folder / JOURNAL_NAME
        try:
            if path.read_text("utf-8") == text:          # (a job's progress changes nothing kept here)
                return
        except OSError:
            pass
        try:
            atomic_write_bytes(path, text.encode("utf-8"), fsync=False)
        except OSError as e:             # (a full disk): the change itself still commits; the spare is older
            log.warning("the queue's journal copy %s could not be written: %s", path, e)

    # ---- reading ----------------------------------------------------------------------------------------------------
    @staticmethod
    def _entry(row) -> Entry:
        return Entry(row[0], row[1], row[2], json.loads(row[3]), json.loads(row[4]), row[5], row[6], row[7], row[8],
                     row[9], row[10], row[11], row[12])

    def entries(self, statuses: Iterable[str] | None = None) -> list[Entry]:
        """Entries in line order (finished ones too unless `statuses` says which)."""
        rows = self._db().execute("SELECT * FROM entries ORDER BY position").fetchall()
        wanted = set(statuses) if statuses is not None else None
        return [self._entry(r) for r in rows if wanted is None or r[2] in wanted]

    def get(self, entry_id: str) -> Entry | None:
        row = self._db().execute("SELECT * FROM entries WHERE id = ?", (str(entry_id),)).fetchone()
        return self._entry(row) if row else None

    def require(self, entry_id, *, waiting: bool = False) -> Entry:
        """The entry `entry_id`; InputError("job") when there is none (or it is not waiting, with waiting=True)."""
        entry = self.get(entry_id) if isinstance(entry_id, str) else None
        if entry is None:
            raise missing(entry_id)
        if waiting and entry.status != WAITING:
            raise InputError("queued job", f"job {entry.id} is {entry.status}; only a waiting job can be changed")
        return entry

    # ---- changing ---------------------------------------------------------------------------------------------------
    def add(self, values: Mapping[str, Any], *, owner: str | None = None, origin: str = "queue",
            job_dir: str | None = None, client: str | None = None) -> Entry:
        """Append a job (its values checked by `checked_values`) last in line; its images are copied into the
        queue's folder first. `job_dir`: it continues that job folder (a resume)."""
        return self.add_many([values], owner=owner, origin=origin, job_dir=job_dir, client=client)[0]

    def add_many(self, many: list[Mapping[str, Any]], *, job_dir: str | None = None, message: str = "",
                 owner: str | None = None, origin: str = "queue", client: str | None = None) -> list[Entry]:
        """Append several jobs in this order, in one transaction (another client's jobs never come between).
        `owner`: the app's user who added them; `origin`: where they came from (ORIGINS); `client`: who added them
        (Entry.client: what the app's per-client cap counts)."""
        if origin not in ORIGINS:
            raise ValueError(f"origin: {origin!r} is not one of {ORIGINS}")
        staged = [(secrets.token_hex(6), *self._split(values)) for values in many]
        ids = []
        try:
            for entry_id, _, images in staged:
                images.update(self._stage(entry_id, images))
            now = time.time()
            with self._write() as db:
                top = db.execute("SELECT COALESCE(MAX(position), 0) FROM entries").fetchone()[0]
                for n, (entry_id, settings, images) in enumerate(staged, 1):
                    db.execute("INSERT INTO entries (id, position, status, settings, images, job_dir, message, "
                               "created, updated, owner, origin, client) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               (entry_id, top + n, WAITING, json.dumps(settings), json.dumps(images), job_dir,
                                message, now, now, owner, origin, client))
                    ids.append(entry_id)
        except BaseException:
            for entry_id, _, _ in staged:
                shutil.rmtree(self.images_root / entry_id, ignore_errors=True)
            raise
        return [self.require(i) for i in ids]

    @staticmethod
    def _split(values: Mapping[str, Any]) -> tuple[dict, dict]:
        """(settings, files): a file is a path, or an image given as data (a PIL image, an array), kept as it is
        until `_stage` copies it."""
        names = dict(IMAGE_FIELDS)
        settings = {k: v for k, v in values.items() if k not in names}
        images = {k: (str(values[k]) if isinstance(values.get(k), (str, Path)) else values.get(k))
                  if values.get(k) is not None and values.get(k) != "" else None for k in names}
        return settings, images

    def _stage(self, entry_id: str, images: dict) -> dict:
        """The entry's own copies of its files (an image given as data is saved as a PNG)."""
        folder = self.images_root / entry_id
        out: dict[str, Any] = {}
        for name, stem in IMAGE_FIELDS:
            source = images.get(name)
            if source is None:
                continue
            if not isinstance(source, (str, Path)):          # an image as data: kept as a PNG
                folder.mkdir(parents=True, exist_ok=True)
                out[name] = str(atomic_write_bytes(folder / f"{stem}.png", _png(source)))
                continue
            source = Path(source)
            if source.parent == folder:
                out[name] = str(source)
                continue
            if source.is_dir():             # a finished job folder to extend: read where it is
                out[name] = str(source)
                continue
            folder.mkdir(parents=True, exist_ok=True)
            out[name] = str(atomic_copy(source, folder / (stem + source.suffix.lower()[:8])))
        video = out.get("input_video")
        if video and Path(video).parent == folder:       # the copy's hash, checked before the job runs
            out[VIDEO_SHA256] = images.get(VIDEO_SHA256) if Path(images.get("input_video") or "") == Path(video) \
                and images.get(VIDEO_SHA256) else file_sha256(video)
        return out

    def edit(self, entry_id: str, values: Mapping[str, Any]) -> Entry:
        """Replace a waiting job's settings (and images, when given) with `values` (checked by the caller)."""
        entry = self.require(entry_id, waiting=True)
        settings, images = self._split(values)
        images = {k: v or entry.images.get(k) if k == "image" else v for k, v in images.items()}
        if images.get("input_video") and images["input_video"] == entry.images.get("input_video"):
            images[VIDEO_SHA256] = entry.images.get(VIDEO_SHA256)       # the same copy: its hash as queued
        images.update(self._stage(entry.id, images))
        with self._write() as db:
            changed = db.execute("UPDATE entries SET settings = ?, images = ?, updated = ? WHERE id = ? AND "
                                 "status = ?", (json.dumps(settings), json.dumps(images), time.time(), entry.id,
                                                WAITING)).rowcount
        if not changed:
            raise InputError("queued job", f"job {entry.id} started meanwhile; only a waiting job can be changed")
        self._drop_unused_images(entry.id, images)
        return self.require(entry.id)

    def _drop_unused_images(self, entry_id: str, images: dict) -> None:
        folder = self.images_root / entry_id
        keep = {Path(p).name for p in images.values() if p}
        if folder.is_dir():
            for f in folder.iterdir():
                if f.name not in keep:
                    f.unlink(missing_ok=True)

    def move(self, entry_id: str, index: int) -> list[Entry]:
        """Put a waiting job at `index` (0: first) among the waiting jobs; the others keep their order."""
        entry = self.require(entry_id, waiting=True)
        with self._write() as db:
            rows = db.execute("SELECT id, position FROM entries WHERE status = ? ORDER BY position",
                              (WAITING,)).fetchall()
            ids = [r[0] for r in rows if r[0] != entry.id]
            if len(ids) == len(rows):
                raise InputError("queued job", f"job {entry.id} started meanwhile; only a waiting job can be moved")
            index = max(0, min(int(index), len(ids)))
            ids.insert(index, entry.id)
            for entry_id_, position in zip(ids, sorted(r[1] for r in rows)):
                db.execute("UPDATE entries SET position = ? WHERE id = ?", (position, entry_id_))
        return self.entries()

    def remove(self, entry_id: str) -> Entry:
        """Take a waiting, finished or interrupted job (left running by a runner that died) out of the queue at once
        (its images go with it; its job folder stays, to be resumed)."""
        entry = self.require(entry_id)
        with self._write() as db:
            lease = db.execute("SELECT value FROM meta WHERE key = 'runner'").fetchone()
            orphaned = lease is None or _lease_gone(json.loads(lease[0]), time.time())    # its runner died
            gone = db.execute("DELETE FROM entries WHERE id = ? AND (status != ? OR ?)",
                              (entry.id, RUNNING, orphaned)).rowcount
        if not gone:
            raise InputError("queued job", f"job {entry.id} is {entry.status}; press End (or stop it) instead")
        shutil.rmtree(self.images_root / entry.id, ignore_errors=True)
        return entry

    def forget(self, entry_id: str) -> None:
        """A job started from a page or the API has ended and its page has the result: out of the queue, whatever
        its status, with its images."""
        with self._write() as db:
            db.execute("DELETE FROM entries WHERE id = ?", (str(entry_id),))
        shutil.rmtree(self.images_root / str(entry_id), ignore_errors=True)

    def clear_finished(self, sees=None) -> int:
        """Take the finished, stopped and failed jobs out (`sees(owner)`: only those it accepts); returns how many.
        One that changed meanwhile (started again) is left as it is."""
        gone = 0
        for e in self.entries(FINISHED):
            if sees is None or sees(e.owner):
                try:
                    self.remove(e.id)
                    gone += 1
                except InputError:
                    pass
        return gone

    # ---- the worker's side ------------------------------------------------------------------------------------------
    @staticmethod
    def _shown(entry: Entry, orphaned: bool) -> Entry:
        """An entry as a reader shows it: "interrupted" when its runner died (left running with no live runner, or
        put back in line by the next one to continue in its folder)."""
        if (entry.status == RUNNING and orphaned) or entry.interrupted:
            return dataclasses.replace(entry, status=SHOWN_INTERRUPTED)
        return entry

    def next_waiting(self, among: set[str] | None = None) -> Entry | None:
        """The first waiting entry (`among`: of these ids only)."""
        if among is None:
            row = self._db().execute("SELECT * FROM entries WHERE status = ? ORDER BY position LIMIT 1",
                                     (WAITING,)).fetchone()
            return self._entry(row) if row else None
        rows = self._db().execute("SELECT * FROM entries WHERE status = ? ORDER BY position", (WAITING,)).fetchall()
        return next((e for e in map(self._entry, rows) if e.id in among), None)

    def claim(self, entry_id: str) -> bool:
        """Mark a waiting entry running (False: it was removed, moved on or started meanwhile)."""
        with self._write() as db:
            return db.execute("UPDATE entries SET status = ?, message = '', updated = ? WHERE id = ? AND status = ?",
                              (RUNNING, time.time(), entry_id, WAITING)).rowcount == 1

    def update(self, entry_id: str, **changes) -> None:
        """Set some of status, progress, message, job_dir (the worker, as the job goes)."""
        allowed = {"status", "progress", "message", "job_dir"}
        if not changes or set(changes) - allowed:
            raise ValueError(f"update: {sorted(set(changes) - allowed)}")
        names = ", ".join(f"{k} = ?" for k in changes)
        with self._write() as db:
            db.execute(f"UPDATE entries SET {names}, updated = ? WHERE id = ?",
                       (*changes.values(), time.time(), entry_id))

    def release_images(self, entry_id: str) -> None:
        """A finished job no longer needs the queue's copies (its job folder keeps the user's images)."""
        shutil.rmtree(self.images_root / entry_id, ignore_errors=True)

    # ---- the runner's lease ---------------------------------------------------------------------------------------
    def take_lease(self, token: str) -> bool:
        """Become the process that runs this queue, if no live one is (False: another process holds the lease).
        Taking it puts the entries the previous holder left running back first in line (it is gone: they continue
        in their job folders)."""
        now = time.time()
        with self._write() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'runner'").fetchone()
            held = json.loads(row[0]) if row else None
            if held is not None and held.get("token") != token and not _lease_gone(held, now):
                return False
            db.execute("INSERT OR REPLACE INTO meta VALUES ('runner', ?)", (json.dumps(_lease(token, now)),))
            if held is None or held.get("token") != token:
                self._requeue_running(db)
        return True

    def renew_lease(self, token: str) -> bool:
        """Still the runner (the lease is renewed); False when another process took it meanwhile."""
        with self._write() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'runner'").fetchone()
            if row is None or json.loads(row[0]).get("token") != token:
                return False
            db.execute("UPDATE meta SET value = ? WHERE key = 'runner'", (json.dumps(_lease(token, time.time())),))
        return True

    def holds_lease(self, token: str) -> bool:
        """Is `token` still the queue's runner? (A read only: a job asks it before each write to its folder.)"""
        row = self._db().execute("SELECT value FROM meta WHERE key = 'runner'").fetchone()
        return row is not None and json.loads(row[0]).get("token") == token

    def release_lease(self, token: str) -> None:
        with self._write() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'runner'").fetchone()
            if row is not None and json.loads(row[0]).get("token") == token:
                db.execute("DELETE FROM meta WHERE key = 'runner'")

    def runner_alive(self) -> bool:
        """Does a live process run this queue now?"""
        row = self._db().execute("SELECT value FROM meta WHERE key = 'runner'").fetchone()
        return row is not None and not _lease_gone(json.loads(row[0]), time.time())

    @staticmethod
    def _requeue_running(db) -> None:
        """(Taking the lease.) Entries left running by the previous runner wait again, first in line."""
        rows = db.execute("SELECT id FROM entries WHERE status = ? ORDER BY position", (RUNNING,)).fetchall()
        top = db.execute("SELECT COALESCE(MIN(position), 0) FROM entries").fetchone()[0]
        for n, (entry_id,) in enumerate(rows):
            db.execute("UPDATE entries SET position = ?, status = ?, message = ? WHERE id = ?",
                       (top - len(rows) + n, WAITING, INTERRUPTED, entry_id))
        if rows:
            log.info("queue: %d interrupted job(s) continue: %s", len(rows), ", ".join(r[0] for r in rows))

    # ---- JSON lines -------------------------------------------------------------------------------------------------
    def export_jsonl(self, statuses: Iterable[str] = (WAITING, RUNNING), keep=None) -> str:
        """The unfinished jobs as JSON lines (`export_lines`). `keep`: only the entries with these ids."""
        return export_lines([e for e in self.entries(statuses) if keep is None or e.id in keep])


def export_lines(entries: list[Entry]) -> str:
    """Entries as JSON lines, one job's settings and image paths a line, in this order (what `import_jsonl` and
    `python -m cli batch` read). Image paths are absolute: `batch` reads a file's relative paths relative to the
    file, wherever it was written."""
    lines = []
    for e in entries:
        values = {k: (str(Path(v).resolve()) if k in FILE_NAMES and isinstance(v, str) else v)
                  for k, v in e.values().items() if v is not None}
        lines.append(json.dumps(values, ensure_ascii=False))
    return "".join(line + "\n" for line in lines)

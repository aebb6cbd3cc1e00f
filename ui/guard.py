"""Bounds on what one client can make the server do.

- `HandlerGuard`: the page's un-queued handlers (live hints, the memory plan, the token count, End, the random seed,
  the LoRA picker) bypass Gradio's queue, so nothing else stops a client from starting as many at once as it likes.
  A guarded handler runs at most `limit` calls at a time, and at most `per_session` of one client (`client_key`:
  its login, else its address; never the session id Gradio lets a client choose); a call beyond that returns its
  `busy` answer at once instead of waiting for a thread. What it keeps of refused calls is bounded and expires. Cheap handlers and
  expensive ones have guards of their own (ui/context.py), so a client hammering the memory plan never makes
  another client's hints or random seed wait.
- `limit_queue_per_client`: the queued handlers (jobs, uploads' checks, the queue panel) wait in Gradio's queue;
  one client (`client_key`: one login, else one address, this computer's too) may have only so many events in it
  at once, so no client can fill it for the others, however many session ids it makes up.
- `HeapKeeper`: after a burst of work the C heap keeps the memory the handlers' threads freed; it is given back to
  the OS once the burst is over.

Together with input checks that make every handler's work bounded (ui/hints.py, the limits in configs/), no burst
of calls can hold the server's cores or its memory.
"""
from __future__ import annotations

import functools
import inspect
import ipaddress
import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from rocm.allocator import release_host_heap

log = logging.getLogger(__name__)


KEPT_SESSIONS_MAX = 256          # refused calls' values kept for re-running (latest_wins), at most ...
KEPT_S = 60.0                    # ... and for at most this long
LATEST_WAIT_S = 5.0              # a live display's call (latest_wins) refused for want of a slot waits this long for one


def client_key(request, username: str | None = None, *, forwarded: bool = False) -> str:
    """Who a request comes from, as far as the server can tell: its login when there is one, else the address of
    its connection; with --share (`forwarded`), a connection from this computer (the share tunnel) is keyed by the
    address the tunnel forwards (X-Forwarded-For). Never Gradio's session_hash: a client chooses that."""
    username = username if username is not None else getattr(request, "username", None)
    if isinstance(username, str) and username:
        return f"login {username}"
    host = getattr(getattr(request, "client", None), "host", None)
    if forwarded and _is_loopback(host):
        headers = getattr(request, "headers", None)
        given = headers.get("x-forwarded-for") if headers is not None and hasattr(headers, "get") else None
        if isinstance(given, str) and given.strip():
            return f"address {given.split(',')[0].strip()[:64]}"
    return f"address {host}"


def _is_loopback(host) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class HandlerGuard:
    def __init__(self, limit: int = 2, per_session: int = 1, keeper: "HeapKeeper | None" = None,
                 forwarded: bool = False):
        self.limit, self.per_session = limit, per_session
        self.keeper = keeper
        self.forwarded = forwarded              # --share: clients through the tunnel keyed by the forwarded address
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)      # a slot was given back
        self._waiting = 0                                  # latest_wins calls waiting for a slot (at most `limit`)
        self._waiters: dict[str | None, int] = {}          # ... of each client (at most one)
        self._gave_up: OrderedDict = OrderedDict()         # clients whose last wait ran out: refused at once until
                                                           # one of their calls gets a slot (bounded)
        self._running = 0
        self._sessions: dict[str, int] = {}
        self.refused = 0

    def _enter(self, session: str | None) -> bool:
        with self._lock:
            if self._running >= self.limit or (session and self._sessions.get(session, 0) >= self.per_session):
                self.refused += 1
                return False
            self._running += 1
            if session:
                self._sessions[session] = self._sessions.get(session, 0) + 1
            return True

    def _enter_soon(self, session: str | None, timeout: float) -> bool:
        """`_enter`, waiting up to `timeout` for a slot: at most `limit` callers wait at once and one of each client,
        and a client whose wait ran out is refused at once until one of its calls gets a slot again (a client
        making up session ids holds no more threads than that)."""
        if self._enter(session):
            with self._lock:
                self._gave_up.pop(session, None)
            return True
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._waiting >= self.limit or self._waiters.get(session) or session in self._gave_up:
                return False
            self._waiting += 1
            self._waiters[session] = 1
            try:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._gave_up[session] = None
                        while len(self._gave_up) > KEPT_SESSIONS_MAX:
                            self._gave_up.popitem(last=False)
                        return False
                    self._freed.wait(left)
                    if self._running < self.limit and \
                            not (session and self._sessions.get(session, 0) >= self.per_session):
                        self.refused -= 1            # (counted by the `_enter` above) it ran after all
                        self._running += 1
                        if session:
                            self._sessions[session] = self._sessions.get(session, 0) + 1
                        return True
            finally:
                self._waiting -= 1
                self._waiters.pop(session, None)

    def _leave(self, session: str | None) -> None:
        with self._lock:
            self._running -= 1
            if session:
                left = self._sessions.pop(session) - 1
                if left:
                    self._sessions[session] = left
            idle = self._running == 0
            self._freed.notify_all()
        if idle and self.keeper is not None:
            self.keeper.worked()

    def wrap(self, fn: Callable, busy: Callable[[], object], latest_wins: bool = False) -> Callable:
        """`fn` that runs only while a slot is free (for everyone and for the calling session); otherwise returns
        `busy()` at once. Gradio sees `fn`'s parameters plus a gr.Request (the session) at the end.

        `latest_wins`, for a live display that several events fill from the same inputs (the hints, the memory
        plan): one call of a session runs at a time, and a call refused meanwhile is not lost. The running call,
        once done, runs again with the newest refused values and answers with that, so the display ends showing
        what the page holds now: refused calls answer `busy()` (a skip: the display keeps what it has), and no
        older answer can arrive after a newer one (on a busy machine the last change's answer was a skip, or an
        earlier call's answer arrived last, and the hints stayed stale). A call refused because the guard's slots
        (or its client's: every tab of one address shares them) are taken waits up to LATEST_WAIT_S for one: no
        later call of its tab may come to answer for it (a second tab's load took the address's slots while the
        first tab's seconds changed, and its hints kept the old plan: issue 44)."""
        import gradio as gr

        params = list(inspect.signature(fn).parameters.values())
        takes = len(params)
        # Gradio passes a gr.Request to a positional parameter annotated so: one more, after fn's own
        extra = inspect.Parameter("guard_request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                  annotation=gr.Request)
        newest: OrderedDict = OrderedDict()   # session -> (when, the values of its latest refused call): bounded
        running: set[str] = set()              # sessions with a call of this handler running (latest_wins)

        def keep(session, values) -> None:     # (under the lock) the newest refused values, bounded and expiring
            newest[session] = (time.monotonic(), values)
            newest.move_to_end(session)
            while len(newest) > KEPT_SESSIONS_MAX or \
                    (newest and time.monotonic() - next(iter(newest.values()))[0] > KEPT_S):
                newest.popitem(last=False)

        def later_values(session):
            kept = newest.pop(session, None)
            return None if kept is None or time.monotonic() - kept[0] > KEPT_S else kept[1]

        guarded_state = (newest, running)

        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            request = args[takes] if len(args) > takes else kwargs.pop("guard_request", None)
            session = getattr(request, "session_hash", None)
            client = client_key(request, forwarded=self.forwarded) if request is not None else None
            values = (args[:takes], kwargs)
            follows = bool(latest_wins and session)
            if follows:
                with self._lock:
                    if session in running:                # answered by the call that runs
                        keep(session, values)
                        return busy()
                    running.add(session)
                    newest.pop(session, None)              # this call is newer than any refused before it
            if not (self._enter_soon(client, LATEST_WAIT_S) if follows else self._enter(client)):
                if follows:
                    with self._lock:
                        running.discard(session)
                        keep(session, values)             # the session's next call supersedes it
                return busy()
            try:
                result = fn(*values[0], **values[1])
                while follows:
                    with self._lock:
                        later = later_values(session)
                        if later is None:
                            running.discard(session)
                            break
                    result = fn(*later[0], **later[1])
                return result
            finally:
                if follows:
                    with self._lock:
                        running.discard(session)
                self._leave(client)

        marked: Any = guarded                           # (attributes a function does not declare)
        marked.kept = guarded_state                     # (for tests: what it holds)
        marked.__signature__ = inspect.Signature([*params, extra])
        guarded.__annotations__ = {**getattr(fn, "__annotations__", {}), "guard_request": gr.Request}
        return guarded


class HeapKeeper:
    """Give the C heap's free pages back to the OS (glibc's malloc_trim) a moment after a burst of work ends:
    the handlers' threads each keep an arena of what they freed (decoded images, parsed text)."""

    def __init__(self, delay_s: float = 2.0):
        self.delay_s = delay_s
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self.trims = 0

    def worked(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.delay_s, self._trim)
            self._timer.daemon = True
            self._timer.start()

    def _trim(self) -> None:
        release_host_heap()
        self.trims += 1


def limit_queue_per_client(blocks, per_login: int, per_address: int, *, forwarded: bool = False) -> None:
    """Refuse a new event (HTTP 503, Gradio's "queue full" answer, with a message naming the limit) from a client
    (`client_key`: its login, else its address; with --share the forwarded one) that already has as many waiting or
    running in Gradio's queue. Gradio 6.31 has no such limit of its own: this wraps `blocks._queue.push`, the one
    entry of every queued call, and fails loudly if that is gone."""
    queue = blocks._queue
    push = queue.push
    if not inspect.iscoroutinefunction(push) or not hasattr(queue, "event_ids_to_events"):
        raise RuntimeError("Gradio's queue has changed: the per-client limit (ui/guard.py) cannot be applied")

    async def limited(body, request, username):
        who = client_key(request, username, forwarded=forwarded)
        count = sum(client_key(event.request, event.username, forwarded=forwarded) == who
                    for event in list(queue.event_ids_to_events.values()))
        limit, named = (per_login, "this login") if who.startswith("login ") else (per_address, "this address")
        if count >= limit:
            log.info("refused a queued call: %s has %d waiting or running (limit %d)", who, count, limit)
            return False, (f"Too many requests at once: {named} already has {count} waiting or running (at most "
                           f"{limit}); wait for them to finish."), "queue_full"
        return await push(body, request, username)

    queue.push = limited

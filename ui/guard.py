"""Bounds on what one client can make the server do.

- `HandlerGuard`: the page's un-queued handlers (live hints, the memory plan, the token count, End, the random seed,
  the LoRA picker) bypass Gradio's queue, so nothing else stops a client from starting as many at once as it likes.
  A guarded handler runs at most `limit` calls at a time, and at most `per_session` of one browser tab or API
  client; a call beyond that returns its `busy` answer at once instead of waiting for a thread. Cheap handlers and
  expensive ones have guards of their own (ui/context.py), so a client hammering the memory plan never makes
  another client's hints or random seed wait.
- `limit_queue_per_client`: the queued handlers (jobs, uploads' checks, the queue panel) wait in Gradio's queue;
  one client (one session, one login, one network address other than this computer) may have only so many events
  in it at once, so no client can fill it for the others.
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
from typing import Callable
from rocm.allocator import release_host_heap

log = logging.getLogger(__name__)


class HandlerGuard:
    def __init__(self, limit: int = 2, per_session: int = 1, keeper: "HeapKeeper | None" = None):
        self.limit, self.per_session = limit, per_session
        self.keeper = keeper
        self._lock = threading.Lock()
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

    def _leave(self, session: str | None) -> None:
        with self._lock:
            self._running -= 1
            if session:
                left = self._sessions.pop(session) - 1
                if left:
                    self._sessions[session] = left
            idle = self._running == 0
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
        earlier call's answer arrived last, and the hints stayed stale)."""
        import gradio as gr

        params = list(inspect.signature(fn).parameters.values())
        takes = len(params)
        # Gradio passes a gr.Request to a positional parameter annotated so: one more, after fn's own
        extra = inspect.Parameter("guard_request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                  annotation=gr.Request)
        newest: dict[str, tuple] = {}         # session -> the values of its latest refused call
        running: set[str] = set()              # sessions with a call of this handler running (latest_wins)

        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            request = args[takes] if len(args) > takes else kwargs.pop("guard_request", None)
            session = getattr(request, "session_hash", None)
            values = (args[:takes], kwargs)
            follows = bool(latest_wins and session)
            if follows:
                with self._lock:
                    if session in running:                # answered by the call that runs
                        newest[session] = values
                        return busy()
                    running.add(session)
                    newest.pop(session, None)              # this call is newer than any refused before it
            if not self._enter(session):
                if follows:
                    with self._lock:
                        running.discard(session)
                        newest[session] = values           # the session's next call supersedes it
                return busy()
            try:
                result = fn(*values[0], **values[1])
                while follows:
                    with self._lock:
                        later = newest.pop(session, None)
                        if later is None:
                            running.discard(session)
                            break
                    result = fn(*later[0], **later[1])
                return result
            finally:
                if follows:
                    with self._lock:
                        running.discard(session)
                self._leave(session)

        guarded.__signature__ = inspect.Signature([*params, extra])
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


def _client_address(request) -> str | None:
    """The address of a remote client (None for this computer: every local client shares it, a --share tunnel
    too, so it says nothing about who is asking)."""
    host = getattr(getattr(request, "client", None), "host", None)
    try:
        return None if host is None or ipaddress.ip_address(host).is_loopback else host
    except ValueError:
        return host


def limit_queue_per_client(blocks, per_session: int, per_login: int, per_address: int) -> None:
    """Refuse a new event (HTTP 503, Gradio's "queue full" answer, with a message naming the limit) from a client
    that already has as many waiting or running in Gradio's queue. Gradio 6.31 has no such limit of its own: this
    wraps `blocks._queue.push`, the one entry of every queued call, and fails loudly if that is gone."""
    queue = blocks._queue
    push = queue.push
    if not inspect.iscoroutinefunction(push) or not hasattr(queue, "event_ids_to_events"):
        raise RuntimeError("Gradio's queue has changed: the per-client limit (ui/guard.py) cannot be applied")

    async def limited(body, request, username):
        session, address = getattr(body, "session_hash", None), _client_address(request)
        sessions = logins = addresses = 0
        for event in list(queue.event_ids_to_events.values()):
            sessions += session is not None and event.session_hash == session
            logins += username is not None and event.username == username
            addresses += address is not None and _client_address(event.request) == address
        for count, limit, who in ((sessions, per_session, "this page (or API client)"),
                                  (logins, per_login, "this login"), (addresses, per_address, "this address")):
            if count >= limit:
                log.info("refused a queued call: %s has %d waiting or running (limit %d)", who, count, limit)
                return False, (f"Too many requests at once: {who} already has {count} waiting or running (at most "
                               f"{limit}); wait for them to finish."), "queue_full"
        return await push(body, request, username)

    queue.push = limited

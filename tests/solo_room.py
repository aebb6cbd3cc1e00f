"""Tests that time the app against the machine's speed (marked `solo`: the ETA's) run while the other test worker
waits between its tests; tests/conftest.py takes these hooks.

A readers-writer lock on two files of a folder the controlling pytest makes (its workers inherit the variable
`ROOM`): every other test holds the room shared; a solo test takes the gate first (so the other worker's next test
waits at it), then the room alone, once the other worker's running test has ended. Without it the other worker's
load came and went during the measured job: a CI run's section 1 ran at twice the speed of the next three, and its
ETA at section 2 said 2 s with 4.6 s left. A whole test item is held (its module fixtures' setup and teardown
included), outside pytest-timeout's limit, which each test keeps for its own run. Written here because pytest-xdist
has no such mark (its groups put tests on one worker; they do not stop the other).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import pytest

ROOM = "STEADYFRAME_TEST_ROOM"


def pytest_configure(config):
    config.addinivalue_line("markers", "solo: runs while no other test of the suite runs (times the machine)")
    if not hasattr(config, "workerinput") and (config.getoption("numprocesses", None) or 0):
        import tempfile

        config._steadyframe_room = tempfile.mkdtemp(prefix="steadyframe-tests-")
        os.environ[ROOM] = config._steadyframe_room


def pytest_unconfigure(config):
    room = getattr(config, "_steadyframe_room", None)
    if room:
        import shutil

        os.environ.pop(ROOM, None)
        shutil.rmtree(room, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    with _room(alone=item.get_closest_marker("solo") is not None):
        yield


@contextmanager
def _room(alone: bool):
    try:
        import fcntl
    except ImportError:                # Windows: no flock; the tests run side by side as before
        fcntl = None
    folder = os.environ.get(ROOM)
    if fcntl is None or not folder or not os.path.isdir(folder):
        yield
        return
    with open(os.path.join(folder, "gate"), "a") as gate, open(os.path.join(folder, "room"), "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)

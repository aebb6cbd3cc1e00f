"""Bounded work for every handler, without a server: the section planner is closed-form and refuses values beyond
the limits before it counts, the live hints answer any raw value fast, un-queued handlers are limited in
concurrency, and saved job records (gallery, reuse, resume) are read with bounds whatever a hand edit put there."""
from __future__ import annotations

import json
import threading
import time
import types

import pytest

from configs import DEFAULTS, LIMITS, get_preset
from pipeline import sections as sec
from ui import hints
from ui import settings as st
from ui.guard import HandlerGuard


def _fastest(fn, repeat: int = 3) -> float:
    """The fastest of a few runs (a bound on pathological cost, not a timing claim)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _plan_by_summing(plan: sec.SectionPlan) -> list[int]:
    """The frame counts the slow way: every section's decoded frames, cross-faded onto the video so far."""
    out, total = [], 0
    for s in plan.sections:
        part = sec.pixel_frames(plan.decode_frames(s))
        total = part if s.is_first else total + part - sec.overlap_frames(plan.window)
        out.append(total)
    return out


@pytest.mark.parametrize("mode", ["original", "f1"])
@pytest.mark.parametrize("window", [1, 2, 5, 9, 33])
def test_closed_form_frame_counts_equal_the_section_by_section_sum(mode, window):
    for count in list(range(1, 13)) + [57, 100]:
        plan = sec.SectionPlan(mode, window, count)
        assert plan.frame_counts() == _plan_by_summing(plan)
        assert plan.total_frames == plan.frame_counts()[-1]


def test_the_longest_plan_takes_under_10_ms():
    plan = sec.make_plan("original", LIMITS.seconds[1], 1)            # 900 sections
    assert plan.count == 900
    assert _fastest(lambda: sec.make_plan("original", 120, 1).frame_counts()) < 0.010
    assert _fastest(lambda: sec.make_plan("f1", 120, 1).total_frames) < 0.010


@pytest.mark.parametrize("seconds, window, fps, field", [
    (1e9, 9, 30, "seconds"), (121, 9, 30, "seconds"), (float("nan"), 9, 30, "seconds"), (float("inf"), 1, 30, "seconds"),
    (0, 9, 30, "seconds"), (-5, 9, 30, "seconds"), ("1e12", 9, 30, "seconds"), ([1], 9, 30, "seconds"),
    (5, 0, 30, "latent window"), (5, 34, 30, "latent window"), (5, 1.5, 30, "latent window"),
    (5, 9, 10**9, "fps"), (5, 9, 0, "fps")])
def test_the_planner_refuses_values_beyond_the_limits_before_counting(seconds, window, fps, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        sec.make_plan("original", seconds, window, fps)


HOSTILE = [1e9, 1e308, -1e308, float("nan"), float("inf"), "1e12", "9" * 100_000, "x" * 1_000_000, None, True,
           [1, 2], {"a": {"b": [1]}}, 10**30, 1200, 120]


@pytest.mark.parametrize("seconds", HOSTILE)
def test_live_hints_answer_any_raw_value_within_50_ms(seconds):
    for window in (1, 9, "1", None, 10**9, float("nan")):
        for mode in ("original", "f1", None, "x" * 10_000, ["original"]):
            took = _fastest(lambda: hints.hints_markdown(
                hints.plan_hint(seconds, window, mode, DEFAULTS.fps),
                hints.combination_problems(mode=mode, has_end_image=False, cfg=seconds, rescale=window,
                                           negative_prompt=seconds, crf=seconds, teacache=seconds)), repeat=2)
            assert took < 0.050, (seconds, window, mode, took)


def test_live_hints_explain_a_length_beyond_the_limit():
    assert hints.plan_hint(1e9, 9, "original").startswith("⚠ Total video length: 1e+09 is beyond the slider")
    assert "120" in hints.plan_hint(1e9, 9, "original")
    assert "900 sections" in hints.plan_hint(120, 1, "original")
    assert hints.plan_hint("9" * 100_000, 9, "original") == ""                  # not a number worth reading
    md = hints.hints_markdown(hints.plan_hint(1e9, 9, "original"), [])
    assert md.startswith("⚠") and "ℹ" not in md


def test_preserved_memory_hint_refuses_out_of_range_values_without_computing(monkeypatch):
    tiny = get_preset("tiny")
    computed = []
    real = hints.describe_preserved                                      # memory/estimate.py's
    monkeypatch.setattr(hints, "describe_preserved", lambda *a, **k: computed.append(a) or real(*a, **k))
    for value in (float("nan"), float("inf"), -1, "x" * 1_000_000, [6]):
        assert hints.preserved_hint(tiny, 20, value, "cuda").startswith("(enter a number between 0 and")
    too_big = hints.preserved_hint(tiny, 20, 1e12, "cuda", max_gb=20)      # above the cap: says so, plainly
    assert too_big.startswith("⚠ **1e+12 GB cannot work:**") and "up to 20 GB" in too_big
    assert computed == []                                                    # no plan was computed for any of them
    assert "resident" in hints.preserved_hint(get_preset("hunyuan"), 20, 6, "cuda")
    assert len(computed) == 1


def test_guard_limits_concurrent_calls_and_answers_busy_at_once():
    guard = HandlerGuard(limit=2)
    inside, release = threading.Semaphore(0), threading.Event()

    def slow(x):
        inside.release()
        release.wait(10)
        return x

    wrapped = guard.wrap(slow, lambda: "busy")
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(wrapped(i))) for i in range(2)]
    for t in threads:
        t.start()
    assert inside.acquire(timeout=10) and inside.acquire(timeout=10)        # both slots taken
    assert [wrapped(9) for _ in range(5)] == ["busy"] * 5 and guard.refused == 5
    release.set()
    for t in threads:
        t.join(10)
    assert sorted(results) == [0, 1]
    assert wrapped(7) == 7                                                  # slots are given back


def test_a_live_display_ends_showing_the_newest_values_of_a_busy_tab():
    """Three changes of one tab while its first hint call is still running: the two later ones answer busy at once
    (one call of a tab at a time, though the guard would let two run: an older answer must never arrive after a
    newer one), and the running call answers with the newest values (the display would otherwise stay stale)."""
    guard = HandlerGuard(limit=8, per_session=2)
    inside, release, seen = threading.Semaphore(0), threading.Event(), []

    def hint(seconds):
        seen.append(seconds)
        if len(seen) == 1:
            inside.release()
            release.wait(10)
        return f"{seconds} s"

    wrapped = guard.wrap(hint, lambda: "busy", latest_wins=True)
    tab = types.SimpleNamespace(session_hash="tab")
    answer = []
    first = threading.Thread(target=lambda: answer.append(wrapped(5, tab)))
    first.start()
    assert inside.acquire(timeout=10)
    assert wrapped(2.4, tab) == "busy" and wrapped(1.2, tab) == "busy"
    assert wrapped(3, types.SimpleNamespace(session_hash="other")) == "3 s"     # another tab is not held up
    release.set()
    first.join(10)
    assert answer == ["1.2 s"] and seen == [5, 3, 1.2]                          # the newest only, once
    assert wrapped(4, tab) == "4 s" and seen[-1] == 4


def _tab_of(session):
    """A request of tab `session` from this computer's address (the tabs of one address share its slots)."""
    return types.SimpleNamespace(session_hash=session, username=None, client=types.SimpleNamespace(host="127.0.0.1"))


def _slot_holder(inside: threading.Semaphore, release: threading.Event):
    """A handler that says it runs (`inside`) and holds its slot until `release`."""
    def other(x):
        inside.release()
        release.wait(10)
        return x
    return other


def test_a_live_display_refused_for_its_addresss_slots_still_shows_the_newest_values():
    """Issue 44 (a second tab's load took the address's quick slots while the first tab's seconds changed, and its
    hints kept the old plan: 'never said 8 sections'): a tab's hint call refused because another tab of the same
    address holds the slots answers once a slot is free, with its values; before, it answered busy and nothing
    came after it. A tab's call that waits too long, or beyond `limit` waiters, is still refused."""
    from ui import guard as guard_module

    guard = HandlerGuard(limit=8, per_session=1)
    inside, release = threading.Semaphore(0), threading.Event()

    other = _slot_holder(inside, release)             # the other tab's call that holds the address's slot

    holder = threading.Thread(target=guard.wrap(other, lambda: "busy"), args=(1, _tab_of("b")))
    holder.start()
    assert inside.acquire(timeout=10)
    hint = guard.wrap(lambda seconds: f"{seconds} s", lambda: "busy", latest_wins=True)
    answer = []
    first = threading.Thread(target=lambda: answer.append(hint(9.6, _tab_of("a"))))
    first.start()
    first.join(0.3)
    assert first.is_alive() and not answer          # waiting for the address's slot, not answered busy
    release.set()
    first.join(10)
    holder.join(10)
    assert answer == ["9.6 s"] and guard.refused == 0
    release.clear()
    holder = threading.Thread(target=guard.wrap(other, lambda: "busy"), args=(1, _tab_of("b")))
    holder.start()
    assert inside.acquire(timeout=10)
    old, guard_module.LATEST_WAIT_S = guard_module.LATEST_WAIT_S, 0.2
    try:
        assert hint(4.8, _tab_of("a")) == "busy"      # the slot stayed taken: refused after the wait
    finally:
        guard_module.LATEST_WAIT_S = old
        release.set()
        holder.join(10)
    assert hint(2.4, _tab_of("a")) == "2.4 s"


def _live_app(guard, value=9.6):
    """A page with one live display (`value` s in a number box, its text in a Markdown) through `guard`: the guarded
    handler that the change, load and tick events all reach, and which of them call it `confirming` (the tick)."""
    import gradio as gr

    from ui.panel_controls import live_display

    with gr.Blocks() as app:
        seconds = gr.Number(value)
        shown = gr.Markdown()
        live_display(guard, lambda value: f"{value} s", [seconds], shown, [seconds], on_load=app)
    timers = [b for b in app.blocks.values() if isinstance(b, gr.Timer)]
    assert len(timers) == 1 and timers[0].active is False
    events = {}
    for d in app.fns.values():
        for target in d.targets:
            kind = "tick" if target[0] == timers[0]._id else target[1]
            events[kind] = d
            assert [o._id for o in d.outputs] == [shown._id, timers[0]._id]
            assert [i._id for i in d.inputs] == [seconds._id]       # the page sends only its values
    assert set(events) == {"tick", "change", "load"}
    call = events["tick"].fn.guarded
    assert all(d.fn.guarded is call for d in events.values())    # one guarded handler: one call of a tab at a time
    confirming = {}
    for kind, d in events.items():             # what each event's handler passes on (a slot is free: answered)
        confirming[kind] = d.fn(value, _tab_of(f"probe-{kind}"))[1].active is False
    return call, confirming


def test_a_live_display_refused_after_its_wait_asks_again_by_itself():
    """Issue 44 (the second tab's hints under a busy suite: its call waited 5 s for the address's slot, was refused,
    and nothing asked again, so the hints kept the old plan): a refused call of a live display turns its tab's retry
    timer on, the timer's tick calls the same handler with the page's values, and the answer turns the timer off."""
    import gradio as gr

    from ui import guard as guard_module

    guard = HandlerGuard(limit=8, per_session=1)
    inside, release = threading.Semaphore(0), threading.Event()
    other = _slot_holder(inside, release)
    call, confirming = _live_app(guard)
    assert confirming == {"tick": True, "change": False, "load": False}

    holder = threading.Thread(target=guard.wrap(other, lambda: "busy"), args=(1, _tab_of("b")))
    holder.start()
    assert inside.acquire(timeout=10)
    old, guard_module.LATEST_WAIT_S = guard_module.LATEST_WAIT_S, 0.2
    try:
        skipped, timer = call(4.8, False, _tab_of("a"))  # refused after its wait: the display keeps what it has ...
        assert timer.active is True                      # ... and its tab's timer will ask again
        assert skipped == gr.skip()
    finally:
        guard_module.LATEST_WAIT_S = old
        release.set()
        holder.join(10)
    text, timer = call(4.8, True, _tab_of("a"))           # the tick once the slot is free: answered, timer off
    assert text == "4.8 s" and timer.active is False


def test_a_live_display_ends_on_the_pages_values_when_an_older_answer_arrives_last():
    """Issue 44 (the CI: a tab's hints kept the page load's default 5 s for 120 s after 9.6 was typed): the guard runs
    one call of a tab at a time, but the answers come back on separate connections, so the load's answer can arrive
    after the change's. Every change's answer turns the tab's timer on; its tick (sent after both arrived) answers
    with the page's values and turns it off. Replayed here as the page applies answers, in the worst order."""
    import gradio as gr

    call, _ = _live_app(HandlerGuard(limit=8, per_session=1))
    tab = _tab_of("a")
    loaded = call(5, False, tab)                        # the page load's call (the default), answered first ...
    changed = call(9.6, False, tab)                     # ... then the typed value's
    page = {"shown": None, "timer": False}

    def arrive(answer):
        text, timer = answer
        if text != gr.skip():
            page["shown"] = text
        page["timer"] = timer.active

    arrive(changed)
    arrive(loaded)                                      # the older answer last: the display shows 5 s ...
    assert page == {"shown": "5 s", "timer": True}      # ... but the timer is on
    arrive(call(9.6, True, tab))                        # its tick, with what the box holds
    assert page == {"shown": "9.6 s", "timer": False}


def _job(tmp_path, name: str, settings) -> "object":
    d = tmp_path / name
    d.mkdir()
    (d / "job.json").write_text(json.dumps({"status": "stopped", "settings": settings,
                                            "models": {"preset": "tiny"}, "videos": []}))
    return d


def test_reuse_settings_keeps_only_valid_values_of_a_hand_edited_job(tmp_path):
    settings = {"seconds": 1e12, "steps": 10**9, "seed": 7, "mode": "f1", "sampler": "x" * 10_000,
                "latent_window": 5, "prompt": {"nested": [1]}, "crf": 18, "preserved_gb": float("nan")}
    values = st.values_from_settings(settings, 64)
    d = st.default_values(64)
    assert values["seconds"] == d["seconds"] and values["steps"] == d["steps"] and values["sampler"] == d["sampler"]
    assert values["prompt"] == d["prompt"] and values["preserved_gb"] == d["preserved_gb"]
    assert (values["seed"], values["mode"], values["latent_window"], values["crf"]) == (7, "f1", 5, 18)


def test_job_records_are_read_with_bounds(tmp_path):
    from jobfolder.folder import JOB_JSON_MAX_BYTES, load_job
    from ui import jobs_gallery

    good = _job(tmp_path, "20250101-000000-aaaaaa", {"seconds": 2, "seed": 1})
    huge = tmp_path / "20250101-000001-bbbbbb"
    huge.mkdir()
    (huge / "job.json").write_text('{"settings": {"prompt": "' + "x" * JOB_JSON_MAX_BYTES + '"}}')
    deep = tmp_path / "20250101-000002-cccccc"
    deep.mkdir()
    (deep / "job.json").write_text("[" * 200_000 + "]" * 200_000)
    for bad in (huge, deep):
        with pytest.raises(ValueError):
            load_job(bad)
        assert jobs_gallery.read_job(bad) is None
    assert [e.dir for e in jobs_gallery.list_jobs(tmp_path)] == [good]


def test_resume_refuses_a_hand_edited_job_before_loading_anything(tmp_path):
    from common.errors import InputError
    from jobfolder.checkpoint import CHECKPOINT
    from pipeline.resume import resume_request

    job = _job(tmp_path, "20250101-000000-dddddd", {"seconds": 1e12, "seed": 1})
    (job / CHECKPOINT).write_bytes(b"")
    with pytest.raises(InputError, match=r"job\.json: seconds: 1000000000000\.0 is out of range"):
        resume_request(job)

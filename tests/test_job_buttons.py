"""Issue 44 item 6: a greyed-out Resume or Extend in Past jobs says why on the button (before, Extend was greyed
out for a finished original-mode job with no word of why)."""
from __future__ import annotations

from types import SimpleNamespace

from ui.panel_jobs import reasoned_buttons


def _job(status="done", mode="original", resumable=False):
    return SimpleNamespace(status=status, settings={"mode": mode}, resumable=resumable)


def test_a_finished_original_mode_job_says_why_resume_and_extend_are_off():
    resume, extend = reasoned_buttons(_job())
    assert resume["interactive"] is False and resume["value"] == "Resume: it is done"
    assert extend["interactive"] is False and "F1-mode jobs only" in extend["value"]


def test_buttons_that_work_keep_their_names():
    resume, extend = reasoned_buttons(_job(status="stopped", mode="f1", resumable=True))
    assert (resume["interactive"], resume["value"], extend["interactive"], extend["value"]) == (
        True, "Resume", True, "Extend")
    resume, _ = reasoned_buttons(_job(status="failed", resumable=False))
    assert resume["interactive"] is False and "no finished section" in resume["value"]

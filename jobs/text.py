"""Jobs in words, plain text: a job's progress ('sampling · section 1/2 · step 3/25 · elapsed 12 s · ETA 1 min'),
a waiting job's place in line, durations. The queue writes these into its entries; the page and the command line
show them."""
from __future__ import annotations

from jobs.line import Waiting
from pipeline.events import Progress


def format_seconds(s: float | None) -> str:
    if s is None:
        return "…"
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def progress_parts(p: Progress) -> list[str]:
    parts = [p.stage]
    if p.sections and p.section > 0:
        parts.append(f"section {p.section}/{p.sections}")
    elif p.sections:
        parts.append(f"{p.sections} section{'s' if p.sections != 1 else ''} planned")
    if p.step and p.steps:
        parts.append(f"step {p.step}/{p.steps}")
    parts.append(f"elapsed {format_seconds(p.elapsed_s)}")
    if p.eta_s is not None:
        parts.append(f"ETA {format_seconds(p.eta_s)}" if p.eta_s >= 0.5 else "ETA: any moment now")
        if p.eta_note:
            parts[-1] += f" ({p.eta_note})"
    return parts


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def waiting_text(w: Waiting) -> str:
    """'Waiting for the GPU: you are 2nd in line (1 job ahead of yours). It should start in about 40 s.'"""
    jobs = "1 job" if w.ahead == 1 else f"{w.ahead} jobs"
    when = (f"It should start in about {format_seconds(w.wait_s)}." if w.wait_s is not None else
            "No wait estimate yet: this app has not timed a job; it starts as soon as those finish.")
    return f"Waiting for the GPU: you are {ordinal(w.ahead + 1)} in line ({jobs} ahead of yours). {when}"


def progress_line(p: Progress) -> str:
    """The progress bar's text as plain text: 'sampling · section 1/2 · step 3/25 · elapsed 12 s · ETA 1 min'."""
    return " · ".join(progress_parts(p))

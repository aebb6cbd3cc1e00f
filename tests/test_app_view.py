"""ui/ helpers without a browser: events -> component values, hints, settings, plots."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.errors import InputError
from configs import DEFAULTS, MEMORY, get_preset
from jobs.text import format_seconds
from pipeline.events import Cancelled, Done, Failed, LogLine, MemoryReport, Preview, Progress, SectionVideo
from tests.conftest import make_image, uploaded
from ui import hints, plots
from ui import settings as st
from ui.view import JobView, enlarge, progress_html


def test_progress_bar_shows_stage_section_step_eta():
    p = Progress("sampling", 2, 3, 4, 8, 12.0, 75.0, "Sampling 4/8")
    html = progress_html(p)
    assert "sampling" in html and "section 2/3" in html and "step 4/8" in html
    assert "ETA 1 min 15 s" in html and "elapsed 12 s" in html
    assert f"width:{round(100 * p.fraction, 1)}%" in html
    assert "Idle" in progress_html(None)
    assert "3 sections planned" in progress_html(Progress("text encoders", 0, 3, 0, 8, 0.5, None))
    assert "&lt;b&gt;" in progress_html(Progress("<b>", 0, 0, 0, 0, 0.0, None))  # escaped


def test_format_seconds():
    assert format_seconds(None) == "…"
    assert format_seconds(5.4) == "5 s"
    assert format_seconds(3725) == "1 h 02 min"


def test_enlarge_keeps_pixels_and_bounds_width():
    img = np.arange(6 * 72 * 3, dtype=np.uint8).reshape(6, 72, 3)
    big = enlarge(img)
    assert big.shape[0] >= 192 or big.shape[1] * 2 > 1536
    assert big.shape[1] <= 1536 and big.shape[0] % 6 == 0
    assert (big[:: big.shape[0] // 6, :: big.shape[1] // 72] == img).all()
    wide = np.zeros((76, 720, 3), np.uint8)
    assert enlarge(wide).shape == (152, 1440, 3)


def test_view_turns_events_into_changed_values(tmp_path):
    view = JobView(fps=30)
    view.apply(Progress("text encoders", 0, 2, 0, 6, 0.1, None))
    view.apply(LogLine("info", "[before text encoders] CPU run"))
    changes = view.take_changes()
    assert set(changes) == {"progress", "log", "status"}          # the first progress: "Running…"
    assert "text encoders" in changes["progress"] and "CPU run" in changes["log"] and changes["status"] == "Running…"
    assert view.take_changes() == {}

    view.apply(Preview(np.zeros((6, 72, 3), np.uint8), 1, 1))
    assert view.take_changes()["preview"].shape == (6 * 21, 72 * 21, 3)   # width-bound: 72 * 21 <= 1536

    view.apply(SectionVideo(tmp_path / "section_01.mp4", 33, 1.1, 1, 2))
    changes = view.take_changes()
    assert changes["video"].endswith("section_01.mp4") and "Section 1/2" in changes["status"]

    view.apply(LogLine("warning", "conv fallback used"))
    assert "WARNING: conv fallback used" in view.take_changes()["log"]

    view.apply(MemoryReport([], [], "cpu"))
    view.apply(Done(tmp_path, tmp_path / "final.mp4", 73, False, {"total": 8.0}))
    changes = view.take_changes()
    assert changes["video"].endswith("final.mp4")
    assert "Done" in changes["status"] and "73 frames (2.4 s)" in changes["status"]
    assert isinstance(changes["memory"], MemoryReport)
    assert "done" in changes["progress"] and "width:100.0%" in changes["progress"]


def test_view_stopped_failed_cancelled(tmp_path):
    view = JobView()
    view.apply(Done(tmp_path, tmp_path / "final.mp4", 33, True, {}))
    assert "Stopped" in view.status and "kept" in view.status
    view = JobView()
    view.apply(Done(tmp_path, None, 0, True, {}))
    assert "no video" in view.status
    view = JobView()
    view.apply(Failed("RuntimeError: boom", "Traceback ...\nRuntimeError: boom", tmp_path, tmp_path / "s.mp4"))
    changes = view.take_changes()
    assert "Failed" in changes["status"] and "boom" in changes["status"] and "kept" in changes["status"]
    assert "Traceback" in changes["log"] and changes["video"].endswith("s.mp4")
    view = JobView()
    view.apply(Cancelled())
    assert "Cancelled" in view.take_changes()["status"]


def test_a_waiting_job_says_its_place_again_on_every_tick():
    """A look at the runner's job that the tab asked for just before its Start could answer after the Start's
    'Waiting for the GPU' and cover it with the other job's line (the second-tab browser test failed so under
    load): while the job waits, each tick says its place again; once it runs, ticks move the clock only."""
    from jobs.line import Waiting

    view = JobView()
    view.apply(Waiting(1, 12.0))
    first = view.take_changes()["status"]
    assert "Waiting for the GPU" in first
    view.tick()
    assert view.take_changes().get("status") == first
    view.apply(Progress("sampling", 1, 2, 1, 3, 1.0, 5.0, "sampling"))
    view.take_changes()
    view.tick()
    assert "status" not in view.take_changes()


def test_log_panel_is_bounded():
    view = JobView()
    for i in range(2000):
        view.apply(LogLine("info", f"line {i}"))
    text = view.take_changes()["log"]
    assert "line 1999" in text and "line 0\n" not in text and text.count("\n") < 600


def test_hints_explain_invalid_and_useless_combinations():
    kw = dict(mode="f1", has_end_image=True, cfg=1.0, rescale=0.5, negative_prompt="blurry", crf=0,
              teacache=0.2)
    problems = hints.combination_problems(**kw)
    texts = " ".join(t for _, t in problems)
    assert ("error", problems[0][1]) == problems[0] and "original" in problems[0][1]
    assert "negative prompt is ignored" in texts and "rescale" in texts and "CRF 0" in texts
    assert "TeaCache" in texts
    ok = hints.combination_problems(mode="original", has_end_image=True, cfg=1.0, rescale=0.0,
                                    negative_prompt="", crf=16, teacache=0.15)
    assert ok == []
    both = hints.combination_problems(mode="original", has_end_image=False, cfg=1.0, rescale=0.0,
                                      negative_prompt="", crf=16, teacache=0.15, magcache=0.1)
    assert both[0][0] == "error" and "needs TeaCache off" in both[0][1]       # the pre-flight refuses the pair
    assert hints.combination_problems(mode="original", has_end_image=False, cfg=1.0, rescale=0.0,
                                      negative_prompt="", crf=16, teacache=0, magcache=0.1) == []
    assert "2 sections" in hints.plan_hint(2.4, 9, "original") and "73 frames" in hints.plan_hint(2.4, 9, "original")
    assert hints.plan_hint("x", 9, "original") == ""
    # the fields by the labels the page shows (not the code's "seconds:" / "latent window:")
    # a number typed past a slider's end: the page moves the slider to its end (Start too): the hint says so
    assert hints.plan_hint(200, 9, "original").startswith("⚠ Total video length: 200 is beyond the slider (1–120); "
                                                          "the job gets 120. 100 sections")
    assert hints.plan_hint(5, 40, "original").startswith("⚠ Latent window size: 40 is beyond the slider (1–33); "
                                                         "the job gets 33.")
    assert hints.plan_hint(5, 4.5, "original").startswith("⚠ Latent window size: 4.5 is not a whole number between")
    timed = hints.timeline_hint("[0s: a cat] [2s: a dog]", 5, 9, "original", 0)
    assert "- 0.00–1.23 s: 'a cat'" in timed                 # the first section starts with the start image
    md = hints.hints_markdown("plan", problems)
    assert md.startswith("ℹ plan") and "⚠" in md


def test_preserved_hint_on_cpu_and_gpu():
    tiny = get_preset("tiny")
    assert "CPU run" in hints.preserved_hint(tiny, 20, 6, "cpu")
    gpu = hints.preserved_hint(get_preset("hunyuan"), 20, 6, "cuda")
    assert "resident" in gpu and "streamed" in gpu
    assert "could not" in hints.preserved_hint(tiny, "x", 6, "cuda")


def test_settings_round_trip_and_conversions(tmp_path):
    from pipeline.request import Request

    values = dict(zip(st.CONTROLS, [None] * len(st.CONTROLS)))
    values.update(st.default_values(64))
    make_image(64, 64).save(tmp_path / "a.png")
    upload = uploaded(tmp_path / "a.png")
    values.update(image={"path": upload, "orig_name": "a.png"}, end_image=None, seed=42.0,
                  steps=6.0, latent_window=9.0, resolution=64.0, crf=16.0, prompt=None)
    req = st.request_from_values(values)
    assert req.image == upload and req.end_image is None
    values["image"] = {"path": str(tmp_path / "a.png")}         # a path on the server, not an upload: refused
    with pytest.raises(InputError, match="^image: only a file uploaded to this app"):
        st.request_from_values(values)
    assert req.seed == 42 and isinstance(req.steps, int) and req.prompt == ""
    back = st.values_from_settings(req.settings(), 64)
    assert back["seed"] == 42 and back["steps"] == 6 and back["resolution"] == 64
    assert st.values_from_settings({}, 640) == {k: v for k, v in st.default_values(640).items()}
    assert set(st.SETTINGS) <= set(Request.__dataclass_fields__)
    d = st.default_values(64)
    assert d["seed"] == DEFAULTS.seed and d["steps"] == DEFAULTS.steps and d["preserved_gb"] == MEMORY.preserved_gb


@pytest.mark.parametrize("value,expected", [(None, None), ("", None), ("/x/y.png", "/x/y.png"),
                                            ({"path": "/u/p.png"}, "/u/p.png"), ({"path": None}, None),
                                            (Path("/z.png"), "/z.png")])
def test_upload_path(value, expected):
    assert st.upload_path(value) == expected


def test_memory_plot_and_timings_table():
    from memory.manager import StageRecord
    from memory.snapshot import MemorySnapshot

    GB = 1024 ** 3

    def snap(label, t, a, r):
        return MemorySnapshot(label, t, "cuda:0", int(a * GB), int(r * GB), 0, 0, 10 * GB, 20 * GB, 3 * GB)

    timeline = [snap("before text encoders", 0.0, 0, 0), snap("after text encoders", 2.0, 0.1, 0.5),
                snap("before transformer", 2.1, 0.1, 0.5), snap("after transformer", 9.0, 0.2, 1.0)]
    records = [StageRecord("text encoders", ("text_encoder",), 0.0, ended=2.0, load_s=0.5, unload_s=0.3,
                           peak_allocated=int(8 * GB), peak_reserved=int(9 * GB)),
               StageRecord("transformer", ("transformer",), 2.1, ended=9.0, load_s=1.0, unload_s=0.5,
                           peak_allocated=int(15 * GB), peak_reserved=int(17 * GB))]
    img = plots.memory_timeline_image(timeline, records, "cuda:0")
    assert img.size == plots.SIZE
    colors = {c for _, c in img.getcolors(1 << 16)}
    assert plots.COLORS["allocated"] in colors and plots.COLORS["reserved"] in colors
    cpu = plots.memory_timeline_image([], [], "cpu")
    assert cpu.size == plots.SIZE
    table = plots.timings_markdown(records, {"transformer": 6.9, "video writing": 0.2, "total": 9.5})
    assert "| transformer | 1 | 6.90 | 1.00 | 0.50 | 15.00 GB | 17.00 GB |" in table
    assert "video writing" in table and "total" in table
    assert plots.timings_markdown([], {}) == "_No stage ran._"


def test_the_pages_expected_time_follows_the_resolution_controls():
    """The live hint's expected time is at the size the page's Resolution / custom size say (issue 33: a speed
    learned on a 128 px job was shown for a 64 px one unchanged)."""
    from types import SimpleNamespace

    from jobs.line import Speed
    from pipeline.request import Request
    from ui.panel_controls import expected_time

    speed = Speed(default_resolution=64)
    speed.learn(Request(image=None, seconds=2.4, steps=4, resolution=128),
                {"transformer": 8.0, "VAE decode": 2.0, "total": 12.0})
    ctx = SimpleNamespace(sessions=SimpleNamespace(expected_seconds=speed.expected_seconds))
    at = {r: expected_time(ctx, 2.4, 9, "original", 4, r) for r in (128, 64)}
    assert at[128] == "expected time about 12 s (at the speed of this app's last job)"
    assert "about 4 s" in at[64]            # the fixed 2 s + a quarter of the pixels and about of the tokens …
    assert expected_time(ctx, 2.4, 9, "original", 4, 128, 64, 64) == at[64]    # … as does a 64×64 custom size
    assert expected_time(ctx, 2.4, 9, "original", 4, "x", -5, 10**9) == expected_time(ctx, 2.4, 9, "original", 4)

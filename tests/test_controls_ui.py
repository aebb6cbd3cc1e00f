"""The table of controls (configs/controls.py) drives the page's controls and the /video API."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest

from configs import get_preset
from configs.controls import CONTROLS, Control
from tests.conftest import make_image, uploaded
from ui import settings as st
from ui.api import JobApi, video_endpoint, video_signature
from ui.layout import build_layout
from ui.messages import input_error

ROOT = Path(__file__).resolve().parents[1]
FAKE = Control("fake_knob", "int", 7, (2, 40), label="Fake knob", widget="slider", step=1, advanced=True,
               help="a knob only this test has", cli_aliases=("--knob",))
FAKE_TABLE = CONTROLS + (FAKE,)


def _page(table=CONTROLS):
    with gr.Blocks() as demo:
        layout = build_layout(get_preset("tiny"), "CPU", "", table=table)
        JobApi(None, get_preset("tiny").default_resolution).register(layout.controls(), table=table)
    return demo, layout


def _inside(component, label: str) -> bool:
    parent = getattr(component, "parent", None)
    while parent is not None:
        if isinstance(parent, gr.Accordion) and parent.label == label:
            return True
        parent = getattr(parent, "parent", None)
    return False


def test_every_control_on_the_page_is_made_from_its_row():
    _, layout = _page()
    assert list(layout.widgets) == list(st.CONTROLS) == [c.name for c in CONTROLS if c.widget]
    tiny = get_preset("tiny").default_resolution
    for c in CONTROLS:
        if not c.widget:
            assert c.name not in layout.widgets
            continue
        w = layout.widgets[c.name]
        assert getattr(layout, c.name) is w
        assert w.label == (c.widget_label or c.label) and w.elem_id == c.element_id, c.name
        assert _inside(w, "Advanced") == c.advanced, c.name
        if c.kind != "image":
            assert w.value == (tiny if c.preset_default else c.default), c.name
        if c.widget == "slider":
            assert (w.minimum, w.maximum) == c.widget_range(), c.name
        if c.info:
            assert w.info == c.info, c.name
        if c.kind == "choice":
            assert [value for _, value in w.choices] == list(c.choices), c.name


def test_a_new_control_appears_on_the_page_and_in_the_api():
    demo, layout = _page(FAKE_TABLE)
    knob = layout.widgets["fake_knob"]
    assert isinstance(knob, gr.Slider) and (knob.minimum, knob.maximum, knob.value) == (2, 40, 7)
    assert knob.label == "Fake knob" and knob.elem_id == "fake-knob" and _inside(knob, "Advanced")
    assert layout.controls()[-1] is knob
    params = [p["parameter_name"] for p in demo.get_api_info()["named_endpoints"]["/video"]["parameters"]]
    assert params == [c.name for c in FAKE_TABLE if c.widget]
    assert "fake_knob" in inspect.signature(video_endpoint(None, FAKE_TABLE)).parameters
    assert "fake_knob: a knob only this test has" in video_endpoint(None, FAKE_TABLE).__doc__
    assert "fake_knob" not in video_signature().parameters


def test_api_values_reach_validation_by_name(tmp_path):
    """/video hands every control's value to the request checks under its name (a fake control included)."""
    from configs.runtime import Config
    from jobs.preflight import Preflight

    class Checks:                       # the runner's first step: the one pre-flight (the job is refused there)
        preflight = Preflight(Config(preset="tiny", outputs=tmp_path / "out"))
        outputs = tmp_path / "out"

        def submit(self, job, **_):
            self.preflight.prepare(job)
            raise AssertionError("the job passed the checks")

    checks = Checks()
    api = JobApi(SimpleNamespace(runner=checks, submit=checks.submit))
    api.table = FAKE_TABLE
    endpoint = video_endpoint(api.video, FAKE_TABLE)
    page = st.default_values(64, FAKE_TABLE)            # Gradio sends every control's value (the page's default)
    make_image(64, 64).save(tmp_path / "start.png")
    start = uploaded(tmp_path / "start.png")
    with pytest.raises(gr.Error, match="fake knob: 41 is out of range; use a value between 2 and 40"):
        endpoint(start, **{**page, "fake_knob": 41})
    with pytest.raises(gr.Error, match="seconds: 121 is out of range; use a value between 1 and 120"):
        endpoint(start, **{**page, "seconds": 121})
    seen = {}
    video_endpoint(lambda values, request, progress: seen.update(values), FAKE_TABLE)("a.png", None, "p", fake_knob=3)
    assert seen["fake_knob"] == 3 and seen["prompt"] == "p" and seen["image"] == "a.png" and seen["seed"] is None


def test_the_real_api_signature():
    demo, _ = _page()
    params = demo.get_api_info()["named_endpoints"]["/video"]["parameters"]
    assert [p["parameter_name"] for p in params] == list(st.CONTROLS)
    # none is required: the start image or a video to extend (pipeline/extend.py); prepare() says which is missing
    assert [p["parameter_name"] for p in params if not p["parameter_has_default"]] == []


def test_page_messages_use_the_tables_labels():
    from common.errors import InputError

    for c in CONTROLS:
        if c.widget:
            assert input_error(InputError(c.field_name, "bad")) == f"{c.label}: bad"


def test_request_from_values_follows_the_table(tmp_path):
    make_image(64, 64).save(tmp_path / "a.png")
    a = uploaded(tmp_path / "a.png")
    r = st.request_from_values({"image": {"path": a}, "steps": 5.0, "prompt": None, "fake_knob": 9.0}, FAKE_TABLE)
    assert r.image == a and r.steps == 5 and isinstance(r.steps, int) and r.prompt == ""
    assert r.fake_knob == 9 and isinstance(r.fake_knob, int)


def test_readme_api_section_is_the_api_docstring():
    """The README's Python API section is ui/api.py's docstring (it had drifted once)."""
    import ui.api

    doc = ast.get_docstring(ast.parse(Path(ui.api.__file__).read_text("utf-8")))
    section = doc[doc.index("## Python API"):]
    readme = (ROOT / "README.md").read_text("utf-8")
    start = readme.index("## Python API")
    in_readme = readme[start:readme.index("\n## ", start + 1)]
    assert " ".join(section.split()) == " ".join(in_readme.split())


@pytest.mark.parametrize("cap", [4.0, 0.5])
def test_a_cap_under_the_sliders_usual_bottom_still_builds_the_page(cap):
    """--vram-cap-gb below the preserved-memory slider's usual minimum (6 GB): the slider spans 0 … the cap."""
    with gr.Blocks():
        layout = build_layout(get_preset("tiny"), "CPU", "", preserved_max_gb=cap)
    slider = layout.controls()[st.CONTROLS.index("preserved_gb")]
    assert (slider.minimum, slider.maximum) == (0.0, cap) and slider.value <= cap

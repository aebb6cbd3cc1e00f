"""The table of controls (configs/controls.py) drives validation, Request, the command line and the README."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cli import commands as cli
from common.errors import InputError
from configs import DEFAULTS, LIMITS
from configs.controls import CONTROLS, Control, control
from configs.readme import README_BEGIN, README_END, markdown_table, readme_with_table
from pipeline.request import Request, check_settings, check_value, request_class, setting_problems

ROOT = Path(__file__).resolve().parents[1]
FAKE = Control("fake_knob", "int", 7, (2, 40), label="Fake knob", widget="slider", step=1, advanced=True,
               help="a knob only this test has", cli_aliases=("--knob",))
FAKE_TABLE = CONTROLS + (FAKE,)


# ---- the table itself ----------------------------------------------------------------------------------------------
def test_names_are_unique_and_rows_complete():
    names = [c.name for c in CONTROLS]
    assert len(names) == len(set(names))
    options = [o for c in CONTROLS for o in (c.option, *c.cli_aliases) if o]
    assert len(options) == len(set(options))
    for c in CONTROLS:
        assert c.label and c.help, c.name
        if c.is_number:
            assert c.limits and c.limits[0] <= c.limits[1], c.name
            if c.default is not None:
                assert c.limits[0] <= c.default <= c.limits[1], c.name
        if c.kind == "choice":
            assert c.default in c.choices, c.name


def test_every_door_starts_a_job_from_the_same_defaults():
    """A job given only its image gets the same settings from the command line, a batch line or job.json
    (Request.from_mapping), the request itself and the configured defaults: the table's."""
    from_cli = cli.request_from_args(cli.build_parser().parse_args(["generate", "--image", "a.png"])).settings()
    assert from_cli == Request.from_mapping({"image": "a.png"}).settings() == Request(image="a.png").settings()
    assert from_cli == {c.name: c.default for c in CONTROLS if not c.is_file}
    assert {k: getattr(DEFAULTS, k) for k in from_cli if hasattr(DEFAULTS, k)} == \
        {k: v for k, v in from_cli.items() if hasattr(DEFAULTS, k)}
    assert {c.name: c.limits for c in CONTROLS if c.limits} == \
        {k: getattr(LIMITS, k) for k in (c.name for c in CONTROLS if c.limits)}


def test_request_has_one_field_per_control():
    assert [f.name for f in dataclasses.fields(Request)] == [c.name for c in CONTROLS]
    r = Request(image="a.png")
    assert r.seconds == 5.0 and r.resolution is None and r.end_image is None
    assert set(r.settings()) == {c.name for c in CONTROLS} - {"image", "end_image", "input_video"}


# ---- validation ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("c", [c for c in CONTROLS if c.is_number], ids=lambda c: c.name)
def test_every_number_is_checked_inclusively_against_its_limits(c):
    lo, hi = c.limits
    step = 1 if c.kind == "int" else 0.01
    for ok in (lo, hi):
        ok = ok - ok % c.multiple_of if c.multiple_of else ok
        assert check_value(c, ok)[0] == ok
    for bad in (lo - step, hi + step):
        with pytest.raises(InputError) as e:
            check_value(c, bad)
        assert str(e.value).startswith(f"{c.field_name}: ") and "is out of range; use a value between" in str(e.value)
        assert e.value.field == c.field_name


def test_messages_are_the_old_ones():
    def message(**values):
        with pytest.raises(InputError) as e:
            check_settings(values, {"resolution": 640})
        return str(e.value)

    assert message(seconds=121) == "seconds: 121 is out of range; use a value between 1 and 120"
    assert message(gs=0.5) == "distilled CFG (gs): 0.5 is out of range; use a value between 1 and 32"
    assert message(latent_window=2.5) == "latent window: 2.5 must be a whole number"
    assert message(resolution=650) == "resolution: 650 is not a multiple of 16"
    assert message(mode="x") == "mode: 'x' is not one of original, f1"
    assert message(teacache=float("nan")) == "TeaCache threshold: nan is not a finite number"
    assert message(preserved_gb=200) == ("preserved memory (GB): 200 is out of range; use a value between 0 and "
                                         "128")
    assert message(steps=True) == "steps: a number is required, got True"


def test_checked_values_take_the_pipeline_types_and_the_preset_resolution():
    values, warnings = check_settings({"steps": 3.0, "seconds": 2, "prompt": "a\x00b"}, {"resolution": 64})
    assert values["steps"] == 3 and isinstance(values["steps"], int)
    assert values["seconds"] == 2.0 and isinstance(values["seconds"], float)
    assert values["resolution"] == 64 and values["prompt"] == "ab" and warnings == []
    assert setting_problems({"seconds": 0, "steps": 3, "unknown": 1}) == {
        "seconds": "seconds: 0 is out of range; use a value between 1 and 120"}


# ---- Request.from_mapping (job.json, resume, batch lines, the CLI) ------------------------------------------------
def test_from_mapping(tmp_path):
    r = Request.from_mapping({"image": "a.png", "window": 5, "seconds": 3}, base=tmp_path)
    assert r.latent_window == 5 and r.seconds == 3 and r.image == tmp_path / "a.png"
    assert Request.from_mapping({"image": "/abs/a.png"}, base=tmp_path).image == Path("/abs/a.png")
    with pytest.raises(InputError, match="^colour: unknown setting; known: image, end_image, prompt"):
        Request.from_mapping({"image": "a.png", "colour": 1})
    with pytest.raises(InputError, match=r"^image: missing; give the start image's path \(or the video to extend's\); "
                       "for text-to-video without one choose start from noise, black, white or green "
                       r"\(--start-from noise\)$"):
        Request.from_mapping({"seconds": 3})
    r = Request.from_mapping({"colour": 1, "steps": 4}, unknown="ignore", image=tmp_path / "input.png")
    assert r.steps == 4 and r.image == tmp_path / "input.png"
    saved = Request(image="x.png", seconds=7.5, mode="f1").settings()
    assert Request.from_mapping(saved, image="x.png") == Request(image="x.png", seconds=7.5, mode="f1")


# ---- the command line ----------------------------------------------------------------------------------------------
def _generate_args(*argv, controls=CONTROLS):
    return cli.build_parser(controls).parse_args(["generate", "--image", "a.png", *map(str, argv)])


def test_cli_defaults_are_the_tables():
    args = _generate_args()
    request = cli.request_from_args(args)
    assert request == Request(image="a.png")


@pytest.mark.parametrize("c", [c for c in CONTROLS if c.is_number and c.option], ids=lambda c: c.name)
def test_cli_names_its_option_in_messages(c):
    """A value out of range given on the command line is refused naming the option the user typed."""
    args = _generate_args(c.option, c.limits[1] * 2 + 1)
    with pytest.raises(InputError) as e:
        check_settings(cli.request_from_args(args).settings(), {"resolution": 640})
    assert cli.cli_message(e.value, cli.OPTION_OF_FIELD).startswith(f"{c.option}: ")
    assert cli.cli_message(e.value, cli.KEY_OF_FIELD).startswith(f"{c.name}: ")


def test_old_option_spellings_still_work():
    assert _generate_args("--window", 5).latent_window == 5
    assert _generate_args("--out", "/tmp/x").outputs == Path("/tmp/x")
    assert _generate_args("--outputs", "/tmp/y").outputs == Path("/tmp/y")


def test_cli_and_app_take_the_same_process_options():
    """The options both programs take (the models, outputs, memory limits, the farm) are declared once: the same
    spellings and the same help in `python app.py -h` and `python -m cli generate -h`; every control's option is
    its API name with dashes (an older spelling may stay as an alias)."""
    from ui.launch import build_parser as app_parser

    def options(parser):
        return {a.dest: (a.option_strings, a.help, a.default) for a in parser._actions
                if a.option_strings and a.dest != "help"}

    generate = cli.build_parser()._subparsers._group_actions[0].choices["generate"]
    app, command_line = options(app_parser()), options(generate)
    shared = set(app) & set(command_line)
    assert {"preset", "model_dir", "outputs", "vram_cap_gb", "host_ram_gb", "lora_dir", "fp8", "device", "ray",
            "gpus", "cpu_workers"} <= shared
    for dest in shared:
        assert app[dest] == command_line[dest], dest
    for c in CONTROLS:
        if c.option:
            assert c.option == "--" + c.name.replace("_", "-"), c.name


# ---- a new control appears everywhere ----------------------------------------------------------------------------
def test_a_new_control_appears_in_request_validation_and_cli():
    FakeRequest = request_class(FAKE_TABLE)
    r = FakeRequest.from_mapping({"image": "a.png", "knob": 12})
    assert r.fake_knob == 12 and r.settings()["fake_knob"] == 12
    assert FakeRequest(image="a.png").fake_knob == 7
    with pytest.raises(InputError, match=r"^fake knob: 41 is out of range; use a value between 2 and 40$"):
        check_settings({"fake_knob": 41}, {"resolution": 640}, FAKE_TABLE)
    assert check_settings({"fake_knob": 40.0}, {"resolution": 640}, FAKE_TABLE)[0]["fake_knob"] == 40

    args = _generate_args("--fake-knob", 9, controls=FAKE_TABLE)
    assert args.fake_knob == 9
    assert _generate_args("--knob", 3, controls=FAKE_TABLE).fake_knob == 3
    assert _generate_args(controls=FAKE_TABLE).fake_knob == 7
    help_text = cli.build_parser(FAKE_TABLE)._subparsers._group_actions[0].choices["generate"].format_help()
    assert "--fake-knob" in help_text and "a knob only this test has (default 7; range 2–40)" in help_text
    assert "fake_knob" not in cli.build_parser().parse_args(["generate", "--image", "a.png"])

    table = markdown_table(FAKE_TABLE)
    assert "| Fake knob (*Advanced*) | `fake_knob` | `--fake-knob` (alias `--knob`) | `7` | 2–40 |" in table


# ---- the README ----------------------------------------------------------------------------------------------------
def test_readme_table_is_up_to_date():
    readme = (ROOT / "README.md").read_text("utf-8")
    assert README_BEGIN in readme and README_END in readme
    assert readme_with_table(readme) == readme, "README's table of controls is out of date: run " \
                                                "python -m configs.readme --write README.md"
    assert readme_with_table(readme, FAKE_TABLE) != readme


def test_readme_table_lists_every_control():
    table = markdown_table()
    for c in CONTROLS:
        assert f"`{c.name}`" in table
        if c.option:
            assert f"`{c.option}`" in table
    assert control("seconds").limits == (1.0, 120.0) and "| 1–120 |" in table


def test_the_readme_command_prints_and_writes_the_table(tmp_path, capsys):
    from configs import readme as readme_cli

    assert readme_cli.main([]) == 0
    assert capsys.readouterr().out.strip() == markdown_table().strip()
    old = tmp_path / "README.md"
    old.write_text(f"# Title\n{README_BEGIN}\n| an old table |\n{README_END}\nthe rest\n", "utf-8")
    assert readme_cli.main(["--write", str(old)]) == 0
    assert capsys.readouterr().out.strip() == f"{old}: updated"
    text = old.read_text("utf-8")
    assert markdown_table() in text and "an old table" not in text and text.endswith("the rest\n")
    assert readme_cli.main(["--write", str(old)]) == 0
    assert capsys.readouterr().out.strip() == f"{old}: up to date" and old.read_text("utf-8") == text
    with pytest.raises(ValueError, match="the README has no .* block"):
        readme_with_table("# a README without the markers")

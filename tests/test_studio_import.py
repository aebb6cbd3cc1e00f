"""Importing a FramePack-Studio job's settings (jobs/studio.py): its metadata JSON and the text chunks of the PNG
it saves, mapped onto SteadyFrame's controls with what could not be mapped reported; the command line's batch line
(cli/studio.py); and the page's "Import Studio settings" handler (no browser, no server). Fast: no models."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from cli import studio as studio_cli
from common.errors import InputError
from jobs import studio
from pipeline.request import Request
from tests.conftest import ROOT, uploaded
from ui import settings as st
from ui.panel_jobs import STUDIO_KEEPS, JobsPanel

# What Studio's create_metadata (modules/pipelines/metadata_utils.py) writes for an F1 job with MagCache and LoRAs.
STUDIO = {
    "app_version": "0.5",
    "prompt": "[0s: Person looks surprised] [1.1s: Person raises arms above head] [2.2s-3.3s: Person puts hands on "
              "hips]",
    "negative_prompt": "blurry",
    "seed": 4242, "steps": 30, "cfg": 1.0, "gs": 12.5, "rs": 0.0,
    "latent_type": "Black", "timestamp": 1718000000.5,
    "resolutionW": 600, "resolutionH": 640,
    "model_type": "F1", "generation_type": "F1",
    "has_input_image": True, "input_image_path": "/home/me/studio/inputs/x.png",
    "total_second_length": 6, "blend_sections": 4, "latent_window_size": 9, "num_cleaned_frames": 5,
    "end_frame_strength": None, "end_frame_image_path": None, "end_frame_used": "False",
    "input_video": None, "video_path": None,
    "x_param": None, "y_param": None, "x_values": None, "y_values": None,
    "combine_with_source": False,
    "use_teacache": False, "teacache_num_steps": 25, "teacache_rel_l1_thresh": 0.15,
    "use_magcache": True, "magcache_threshold": 0.12, "magcache_max_consecutive_skips": 2,
    "magcache_retention_ratio": 0.25,
    "loras": {"styles/anime": 0.8, "motion": 1.2, " ": 1.0},
}
EXPECTED = {
    "prompt": STUDIO["prompt"], "negative_prompt": "blurry", "seed": 4242, "steps": 30, "cfg": 1.0, "gs": 12.5,
    "rescale": 0.0, "seconds": 6.0, "latent_window": 9, "prompt_blend": 4, "mode": "f1", "resolution": 640,
    "magcache": 0.1, "teacache": 0.0, "loras": "anime.safetensors:0.8, motion.safetensors:1.2",
}


def _json(tmp_path, meta=STUDIO, name="20250101_120000_123.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(meta, indent=2))             # as Studio writes it
    return path


def _png(tmp_path, meta=STUDIO, name="20250101_120000_123.png") -> Path:
    """A start image with Studio's text chunks: prompt, seed, model_type, then every scalar value as str()
    (save_job_start_image)."""
    info = PngInfo()
    info.add_text("prompt", meta["prompt"])
    info.add_text("seed", str(meta["seed"]))
    info.add_text("model_type", meta["model_type"])
    for key, value in meta.items():
        if isinstance(value, (str, int, float, bool)) or value is None:
            info.add_text(key, str(value))
    path = tmp_path / name
    Image.new("RGB", (48, 32), (10, 120, 200)).save(path, pnginfo=info)
    return path


def test_a_studio_json_maps_onto_the_controls_and_says_what_it_could_not(tmp_path):
    got = studio.import_file(_json(tmp_path))
    assert got.kind == "json" and got.settings == EXPECTED
    unmapped = dict(got.unmapped)
    assert set(unmapped) == {"resolutionH", "magcache_max_consecutive_skips", "magcache_retention_ratio"}
    assert "resolutionW" in unmapped["resolutionH"] and "fixed values" in unmapped["magcache_retention_ratio"]
    report = "\n".join(got.report())
    assert "resolutionW 600 → resolution 640" in report
    assert "magcache_threshold 0.12 → MagCache threshold 0.1" in report
    assert "'styles/anime' is in a subfolder" in report
    for quiet in ("app_version", "timestamp", "input_image_path", "latent_type", "teacache_num_steps", "x_param"):
        assert quiet not in report                        # bookkeeping, unused or empty: not reported
    Request.from_mapping({**got.settings, "image": "x.png"})           # every key is a SteadyFrame control


def test_teacache_video_models_refused_values_and_unknown_keys(tmp_path):
    meta = {**STUDIO, "use_magcache": False, "use_teacache": True, "teacache_rel_l1_thresh": 0.1,
            "teacache_num_steps": 20, "steps": 150, "model_type": "Video", "combine_with_source": True,
            "loras": {"big": 3.5}, "my_own_key": 1, "seed": "7.5"}
    got = studio.from_metadata(meta)
    assert got.settings["teacache"] == 0.1 and got.settings["magcache"] == 0.0
    assert "steps" not in got.settings and "loras" not in got.settings
    # Studio's "Video" (the original model's extension backwards): the original mode, its context frames kept
    assert got.settings["mode"] == "original" and got.settings["context_frames"] == 5
    assert any("the new part goes before it" in n for n in got.notes)
    unmapped = dict(got.unmapped)
    assert unmapped["steps"].startswith("SteadyFrame refuses '150'")
    assert "model_type" not in unmapped and "num_cleaned_frames" not in unmapped
    assert "SteadyFrame's TeaCache counts the job's own steps" in unmapped["teacache_num_steps"]
    assert "is not a strength from -2 to 2" in unmapped["loras.big"]
    assert unmapped["my_own_key"] == "not a FramePack-Studio setting SteadyFrame knows"
    assert "is not a whole number" in unmapped["seed"]
    assert "combine_with_source" in unmapped                                          # a video model's setting
    ends = studio.from_metadata({**meta, "model_type": "Video with Endframe", "num_cleaned_frames": 40})
    assert ends.settings["mode"] == "original" and "context_frames" not in ends.settings
    assert "from 1 to 19" in dict(ends.unmapped)["num_cleaned_frames"]
    # no start image: Studio's starting latent is SteadyFrame's "start from" (text-to-video)
    t2v = studio.from_metadata({**STUDIO, "has_input_image": False, "latent_type": "Green Screen"})
    assert t2v.settings["start_from"] == "green" and "latent_type" not in dict(t2v.unmapped)
    # Studio's newer "cache_type" wins over the flags, as its own loader reads it
    assert studio.from_metadata({**STUDIO, "cache_type": "None"}).settings["magcache"] == 0.0


def test_a_prompt_steadyframe_would_refuse_is_imported_with_a_note():
    # base text the blocks leave no time for: Studio's meaning is unclear, so it is kept and the refusal said
    prompt = "a calm lake [0s: a] [2s: b]"
    got = studio.from_metadata({"prompt": prompt, "total_second_length": 3, "model_type": "Original"})
    assert got.settings["prompt"] == prompt
    assert any(n.startswith("prompt: imported, but SteadyFrame refuses it") and "leave no time for it" in n
               for n in got.notes)
    # a block after the video's end: Studio never uses it, so the import drops it and says so
    got = studio.from_metadata({"prompt": "[0s: a] [9s: b]", "total_second_length": 3, "model_type": "Original"})
    assert got.settings["prompt"] == "[0s: a]"
    assert any("[9s: b] starts at or after the video's end" in n for n in got.notes)


def test_the_png_text_chunks_give_the_same_settings_typed(tmp_path):
    got = studio.import_file(_png(tmp_path))
    assert got.kind == "png"
    assert got.settings == {k: v for k, v in EXPECTED.items() if k != "loras"}       # "loras" is JSON-only
    assert isinstance(got.settings["seed"], int) and isinstance(got.settings["gs"], float)
    assert any("Studio writes the LoRAs into its JSON file only" in line for line in got.report())
    assert "end_frame_strength" not in dict(got.unmapped)      # the chunk's text "None" is no value


@pytest.mark.parametrize("content, words", [
    (b'{"settings": {"seed": 1}, "status": "done"}', "press Reuse settings"),
    (b'{"hello": 1}', "holds no FramePack-Studio settings"),
    (b"[1, 2]", "does not hold a JSON object"),
    (b"\x00\x01garbage", "is neither JSON nor a PNG"),
    (b"[" * 100_000, "is neither JSON nor a PNG"),
])
def test_files_that_are_not_studio_metadata_are_refused(tmp_path, content, words):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as e:
        studio.import_file(path)
    assert e.value.field == studio.FIELD and words in e.value.message


def test_a_png_without_studio_chunks_and_a_huge_json_are_refused(tmp_path):
    plain = tmp_path / "plain.png"
    Image.new("RGB", (8, 8)).save(plain)
    with pytest.raises(InputError, match="holds no FramePack-Studio settings in its text chunks"):
        studio.import_file(plain)
    huge = tmp_path / "huge.json"
    huge.write_text('{"prompt": "' + "x" * studio.STUDIO_JSON_MAX_BYTES + '"}')
    with pytest.raises(InputError, match="larger than"):
        studio.import_file(huge)


def test_the_command_line_prints_one_batch_line(tmp_path, capsys):
    assert studio_cli.main([str(_json(tmp_path)), "--image", str(tmp_path / "start.png")]) == 0
    out, err = capsys.readouterr()
    line = json.loads(out)
    assert line == {**EXPECTED, "image": str((tmp_path / "start.png").resolve())}
    assert Request.from_mapping(line).seed == 4242                     # names a batch line may use
    assert "not mapped or changed: resolutionH:" in err
    png = _png(tmp_path)
    assert studio_cli.main([str(png)]) == 0                                  # the PNG is Studio's start image
    assert json.loads(capsys.readouterr().out)["image"] == str(png.resolve())
    assert studio_cli.main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    door = subprocess.run([sys.executable, "-m", "cli", "studio", str(png)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)                     # the command's door: `python -m cli studio`
    assert door.returncode == 0 and json.loads(door.stdout)["image"] == str(png.resolve())


# ---- the page's handler -----------------------------------------------------------------------------------------

def _panel() -> JobsPanel:
    return JobsPanel(SimpleNamespace(ui=None, default_resolution=640))


def test_the_page_import_fills_the_controls_as_reuse_does(tmp_path):
    png = uploaded(_png(tmp_path))
    out = _panel().import_studio(png)
    assert len(out) == len(st.CONTROLS) + 1
    values, report = dict(zip(st.CONTROLS, out)), out[-1]
    for name, value in EXPECTED.items():
        if name != "loras":
            assert values[name] == value, name
    assert values["image"] == png                               # Studio's PNG is its job's start image
    assert values["loras"] == "" and values["sampler"] == "unipc"    # the rest of the job's settings: the defaults
    assert values["input_video"] is None and values["source_job"] == ""
    for name in STUDIO_KEEPS + ("end_image",):
        assert values[name] == gr.update(), name                # this machine's settings stay as they are
    assert "Not mapped or changed" in report and "- resolutionH: Studio buckets" in report

    out = _panel().import_studio(uploaded(_json(tmp_path, {**STUDIO, "![t](http://example.com/x.png)": 1})))
    values = dict(zip(st.CONTROLS, out))
    assert values["image"] == gr.update() and values["loras"] == EXPECTED["loras"]
    assert "- \\!\\[t\\]\\(http://example.com/x.png\\): not a FramePack-Studio setting" in out[-1]   # shown as text


def test_the_page_import_refuses_a_path_on_the_server_and_a_foreign_file(tmp_path):
    with pytest.raises(gr.Error, match="only a file uploaded to this app"):
        _panel().import_studio(str(_json(tmp_path)))                # not an upload: never read
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"a": 1}')
    with pytest.raises(gr.Error, match="Studio settings: notes.json holds no FramePack-Studio settings"):
        _panel().import_studio(uploaded(foreign))


# ---- the four stumbles of issue 43 --------------------------------------------------------------------------------
# Studio's text-to-video job: no start image, a 512×384 size, a noise latent (its PNG is a placeholder).
T2V = {**STUDIO, "model_type": "Original", "has_input_image": False, "latent_type": "Noise", "resolutionW": 512,
       "resolutionH": 384, "input_image_path": None, "loras": {}, "prompt": "a paper boat on a pond",
       "use_magcache": False}


def test_a_text_to_video_import_has_no_image_and_keeps_studios_aspect(tmp_path, capsys):
    from pipeline.request import prepare

    got = studio.import_file(_json(tmp_path, T2V))
    assert got.text_to_video and got.settings["start_from"] == "noise"
    # Studio: find_nearest_bucket(384, 512, (512 + 384) / 2) → its 384 table, the bucket nearest 4:3
    assert (got.settings["width"], got.settings["height"]) == (416, 320)
    assert "resolutionH" not in dict(got.unmapped)
    png = _png(tmp_path, T2V, name="t2v.png")
    assert studio_cli.main([str(png)]) == 0                  # the placeholder PNG is not taken as the start image
    line = json.loads(capsys.readouterr().out)
    assert "image" not in line and line["start_from"] == "noise"
    prepared = prepare(Request.from_mapping(line), 640)  # the batch's own check: a job it runs
    assert (prepared.width, prepared.height) == (416, 320)
    out = _panel().import_studio(uploaded(png))          # the page: no start image either
    assert dict(zip(st.CONTROLS, out))["image"] is None


@pytest.mark.parametrize("prompt, expected, said", [
    ("[2s: b] [0s: a]", "[0s: a] [2s: b]", "sorted by their times"),
    ("[1s: b] [3s: c]", "[0s: b] [3s: c]", "the first block starts at 1s"),
    ("[0s: a] [1s: b] [1.3s: c] [3s: d]", "[0s: a] [1.3s: c] [3s: d]", "[1s: b] holds no section's middle"),
    ("[0s: a] [2s: ] [3s: c]", "[0s: a] [3s: c]", "[2s: ] has no text: dropped"),
])
def test_prompts_studio_accepts_are_imported_as_studio_reads_them(prompt, expected, said):
    from pipeline import timeline

    got = studio.from_metadata({"prompt": prompt, "total_second_length": 5, "model_type": "Original"})
    assert got.settings["prompt"] == expected and any(said in n for n in got.notes), got.notes
    timeline.check_request({"prompt": got.settings["prompt"], "mode": "original", "seconds": 5.0,
                            "latent_window": 9, "fps": 30})                  # SteadyFrame runs it as it stands
    with pytest.raises(InputError):
        timeline.check_request({"prompt": prompt, "mode": "original", "seconds": 5.0, "latent_window": 9,
                                "fps": 30})                                  # the page's own rules stay strict
    kept = studio.from_metadata({"prompt": expected, "total_second_length": 5, "model_type": "Original"})
    assert kept.settings["prompt"] == expected and not any(n.startswith("prompt") for n in kept.notes)


def _queue_export(folder: Path) -> dict:
    """What Studio's save_queue_to_json writes: {job id: metadata + the queue's fields}, and its queue_images/."""
    (folder / "queue_images").mkdir(parents=True)
    make = dict(STUDIO, loras={})
    queue = {
        "j1": {**make, "id": "j1", "status": "pending", "created_at": 1.0, "started_at": None, "completed_at": None,
               "error": None, "result": None, "queue_position": 0, "seed": 1,
               "saved_input_image_path": "queue_images/j1_input.png"},
        "j2": {**make, "id": "j2", "status": "completed", "seed": 2, "result": "outputs/j2.mp4"},
        "j3": {**T2V, "id": "j3", "status": "pending", "seed": 3},
        "j4": {**make, "id": "j4", "status": "pending", "seed": 4},                # its image is not in the export
    }
    Image.new("RGB", (80, 64), (200, 40, 40)).save(folder / "queue_images" / "j1_input.png")
    (folder / "queue.json").write_text(json.dumps(queue, indent=2))
    return queue


@pytest.mark.parametrize("form", ["zip", "json"])
def test_a_studio_queue_export_imports_as_queue_entries(tmp_path, capsys, form):
    import zipfile

    from cli import queue as cli_queue
    from jobs.store import QueueStore

    export = tmp_path / "studio"
    _queue_export(export)
    path = export / "queue.json"
    if form == "zip":
        path = tmp_path / "queue_export.zip"
        with zipfile.ZipFile(path, "w") as z:
            z.write(export / "queue.json", "queue.json")
            z.write(export / "queue_images" / "j1_input.png", "queue_images/j1_input.png")
        (export / "queue_images" / "j1_input.png").unlink()           # only the zip holds it
    assert studio.is_queue_export(path) and not studio.is_queue_export(_json(tmp_path))
    outputs = tmp_path / "outputs"
    assert cli_queue.main(["add", str(path), "--outputs", str(outputs), "--preset", "tiny"]) == 0
    out, err = capsys.readouterr()
    assert out.count("added ") == 2
    assert "studio: j2: left out: completed in Studio" in err
    assert "studio: j4: left out: its start image (queue_images/j4_input.png) is not in the export" in err
    assert "studio: j1: resolutionH:" in err                             # each job's mapping report
    store, _ = QueueStore.open(outputs)
    try:
        entries = store.entries()
        assert [e.settings["seed"] for e in entries] == [1, 3]
        assert entries[0].images.get("image") and Path(entries[0].images["image"]).is_file()   # the queue's copy
        assert entries[1].settings["start_from"] == "noise" and not entries[1].images.get("image")
    finally:
        store.close()


def test_a_strength_slider_for_every_lora_in_the_box():
    from configs.lora import LORA
    from ui import panel_lora

    box = ", ".join(f"l{i}.safetensors:0.{i}" for i in range(LORA.max_count))
    shown = [u for u in panel_lora.slots(box) if u.get("visible")]
    assert len(shown) == LORA.max_count and shown[-1]["label"] == f"l{LORA.max_count - 1}.safetensors strength"
    assert panel_lora.moved(LORA.max_count - 1, 1.5, box).endswith(f"l{LORA.max_count - 1}.safetensors:1.5")


# ---- values Studio (or a hand-edited file) holds that SteadyFrame cannot take: reported, never guessed -------------

def test_values_that_are_not_what_the_key_holds_are_reported_and_left_out():
    lora_max = studio.LORA.max_count
    meta = {"prompt": 5, "seed": True, "steps": "thirty", "cfg": "inf", "gs": "12", "model_type": "Hunyuan",
            "resolutionW": "wide", "cache_type": "FooCache", "has_input_image": "False", "latent_type": "Purple",
            "loras": {"a,b": 1.0, **{f"l{i}": 0.5 for i in range(lora_max + 1)}}}
    got = studio.from_metadata(meta)
    unmapped = dict(got.unmapped)
    assert unmapped["prompt"] == "not text (int)" and "prompt" not in got.settings
    assert unmapped["seed"] == "'True' is not a whole number"          # a bool is no seed
    assert unmapped["steps"] == "'thirty' is not a whole number" and unmapped["cfg"] == "'inf' is not a number"
    assert got.settings["gs"] == 12.0                                  # a number written as text is a number
    assert unmapped["model_type"] == "'Hunyuan' is not a model type SteadyFrame knows (Original, F1 …)"
    assert "mode" not in got.settings
    assert unmapped["resolutionW"] == "'wide' is not a number" and "resolution" not in got.settings
    assert unmapped["cache_type"] == "'FooCache' is not MagCache, TeaCache or None"
    assert "teacache" not in got.settings and "magcache" not in got.settings
    # no start image and a latent Studio does not have: no "start from" is guessed, the key is said
    assert "start_from" not in got.settings and unmapped["latent_type"].startswith("not one of Studio's starting")
    assert unmapped["loras.a,b"] == "a name with ',' cannot be written in the LoRAs field"
    assert unmapped[f"loras.l{lora_max}"] == f"more than {lora_max} LoRAs; SteadyFrame takes at most {lora_max}"
    assert got.settings["loras"].count(".safetensors:0.5") == lora_max
    xy = studio.from_metadata({"prompt": "p", "seed": 1, "model_type": "XY Plot", "loras": ["a"]})
    assert dict(xy.unmapped)["model_type"].startswith("an XY plot (a grid of jobs)")
    assert dict(xy.unmapped)["loras"] == "not a mapping of LoRA names to weights"
    untyped = studio.from_metadata({"prompt": "p", "seed": 1, "model_type": "None"}, kind="png")    # a PNG's "None"
    assert "mode" not in untyped.settings and "model_type" not in dict(untyped.unmapped)


def test_cache_thresholds_studio_s_default_and_a_size_already_on_the_table():
    tea = studio.from_metadata({"prompt": "p", "seed": 1, "model_type": "F1", "use_teacache": "True",
                                "teacache_num_steps": "None", "resolutionW": 512})
    assert tea.settings["teacache"] == 0.15 and tea.settings["magcache"] == 0.0      # Studio's default threshold
    assert not tea.notes and not tea.unmapped          # 512 is on Studio's table: no rounding said, nothing lost
    assert tea.settings["resolution"] == 512
    mag = studio.from_metadata({"prompt": "p", "seed": 1, "model_type": "F1", "cache_type": "MagCache",
                                "magcache_max_consecutive_skips": "None"})
    assert mag.settings["magcache"] == 0.1 and not mag.unmapped       # an empty PNG chunk "None" is no value


def test_a_png_that_is_broken_after_its_signature_is_refused(tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(studio.PNG_SIGNATURE + b"\x00" * 40)
    with pytest.raises(InputError) as e:
        studio.import_file(broken)
    assert e.value.field == studio.FIELD and "is not a readable PNG" in e.value.message


def test_the_command_line_notes_a_missing_start_image_and_an_image_given_to_a_text_job(tmp_path, capsys):
    assert studio_cli.main([str(_json(tmp_path))]) == 0
    out, err = capsys.readouterr()
    assert "note: no start image; add --image start.png" in err and "image" not in json.loads(out)
    start = tmp_path / "start.png"
    assert studio_cli.main([str(_json(tmp_path, T2V, name="t2v.json")), "--image", str(start)]) == 0
    out, err = capsys.readouterr()
    assert "note: Studio's job had no start image; with --image it starts from that image instead" in err
    line = json.loads(out)
    assert line["image"] == str(start.resolve())                    # an image job now: no latent, no no-image size
    assert not {"start_from", "width", "height"} & set(line)


# ---- Studio queue exports that cannot be imported, and the files a job needs ----------------------------------------

def _zip(path: Path, members: dict[str, bytes]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


@pytest.mark.parametrize("members, words", [
    ({"notes.txt": b"hi"}, "holds no queue.json: not a FramePack-Studio queue export"),
    ({"queue.json": b"{not json"}, "its queue.json is not JSON"),
    ({"queue.json": b'{"j1": {"hello": 1}}'}, "is not a FramePack-Studio queue (a JSON object of jobs by id"),
])
def test_a_zip_that_is_not_a_studio_queue_export_is_refused(tmp_path, members, words):
    path = _zip(tmp_path / "export.zip", members)
    assert studio.is_queue_export(path)                          # a zip: the reader decides, and says why
    with pytest.raises(InputError) as e:
        studio.read_queue(path, tmp_path / "copies")
    assert e.value.field == studio.FIELD and words in e.value.message


def test_a_damaged_zip_an_oversized_queue_and_a_missing_file_are_refused(tmp_path, monkeypatch):
    path = _zip(tmp_path / "export.zip", {"queue.json": json.dumps({"j1": STUDIO}).encode()})
    data = bytearray(path.read_bytes())
    central = data.rindex(b"PK\x01\x02")
    data[central:central + 4] = b"XXXX"                         # the central directory's magic broken
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="is not a readable zip"):
        studio.read_queue(path, tmp_path)
    monkeypatch.setattr(studio, "QUEUE_JSON_MAX_BYTES", 100)
    big = tmp_path / "queue.json"
    big.write_text(json.dumps({"j1": STUDIO}))
    assert not studio.is_queue_export(big)                      # too large to be looked at
    assert not studio.is_queue_export(tmp_path / "missing.json")
    with pytest.raises(InputError, match="is larger than 0 MB: not a Studio queue"):
        studio.read_queue(big, tmp_path)
    zipped = _zip(tmp_path / "big.zip", {"queue.json": json.dumps({"j1": STUDIO}).encode()})
    with pytest.raises(InputError, match="queue.json is larger than 0 MB"):
        studio.read_queue(zipped, tmp_path)


def test_end_images_videos_and_the_jobs_bound_of_a_queue_export(tmp_path, monkeypatch):
    copies = tmp_path / "copies"
    copies.mkdir()
    image = tmp_path / "x.png"
    Image.new("RGB", (16, 16)).save(image)
    base = dict(STUDIO, loras={})
    queue = {
        "e1": {**base, "model_type": "Original with Endframe"},      # its end image not in the export: a note
        "v1": {**base, "model_type": "Video", "input_video": "C:\\clips\\walk.mp4"},
        "v2": {**base, "model_type": "Video F1", "input_video": "gone.mp4"},     # its video not in the export
        "b1": {**base, "model_type": "F1"},                                      # its image too large: left out
    }
    members = {"queue.json": json.dumps(queue).encode(), "input_files/walk.mp4": b"\x00video",
               "queue_images/b1_input.png": b"\x00" * 2048, "queue_images/v2_input.png/": b""}
    for job_id in ("e1", "v1", "v2"):
        members[f"queue_images/{job_id}_input.png"] = image.read_bytes()
    monkeypatch.setattr(studio, "IMAGE_MAX_BYTES", 1024)
    got = studio.read_queue(_zip(tmp_path / "export.zip", members), copies)
    jobs = {job.id: job for job in got.jobs}
    assert set(jobs) == {"e1", "v1"}
    assert set(jobs["e1"].files) == {"image"} and jobs["e1"].files["image"].read_bytes() == image.read_bytes()
    assert "queue_images/e1_end_frame.png: not in the export; the job runs without an end image" in \
        jobs["e1"].imported.notes
    assert jobs["v1"].files["input_video"].read_bytes() == b"\x00video"          # the copy, under a name of ours
    assert jobs["v1"].values()["input_video"] == str(jobs["v1"].files["input_video"])
    skipped = dict(got.skipped)
    assert skipped["v2"] == "its video (input_files/gone.mp4) is not in the export; add the job by hand"
    assert skipped["b1"] == "its start image (queue_images/b1_input.png) is not in the export; add the job by hand"
    monkeypatch.setattr(studio, "QUEUE_MAX_JOBS", 1)
    bounded = studio.read_queue(_zip(tmp_path / "export2.zip", members), tmp_path / "copies")
    assert [job.id for job in bounded.jobs] == ["e1"] and ("…", "3 more jobs than 1: left out") in bounded.skipped


def test_a_studio_queue_with_no_job_steadyframe_can_run_adds_nothing_and_exits_2(tmp_path, capsys):
    from cli import queue as cli_queue
    from jobs.store import QueueStore

    export = tmp_path / "studio"
    (export / "queue_images").mkdir(parents=True)
    Image.new("RGB", (80, 64)).save(export / "queue_images" / "j1_input.png")
    refused_prompt = "a calm lake [0s: a] [2s: b]"              # imported (with a note), refused by the pre-flight
    queue = {"j1": {**STUDIO, "loras": {}, "prompt": refused_prompt, "total_second_length": 3, "status": "pending",
                    "saved_input_image_path": "queue_images/j1_input.png"},
             "j2": {**STUDIO, "loras": {}, "status": "failed"}}
    (export / "queue.json").write_text(json.dumps(queue))
    outputs = tmp_path / "outputs"
    assert cli_queue.main(["add", str(export / "queue.json"), "--outputs", str(outputs), "--preset", "tiny"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "studio: j1: left out: prompt: " in err and "studio: j2: left out: failed in Studio" in err
    assert "error: Studio settings: no job of queue.json can be added (see above)" in err
    store, _ = QueueStore.open(outputs)
    try:
        assert store.entries() == []
    finally:
        store.close()

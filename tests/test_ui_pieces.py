"""The page's small pieces (issue 18): messages by label without class names, uploads checked on arrival, the token
count agreeing with what the text encoder cuts, example images the pipeline accepts, the preserved-memory text
for values that cannot work, the ETA's clock moving between events."""
from __future__ import annotations

import pytest

from common.errors import InputError
from configs import get_preset
from tests.conftest import make_image, uploaded


def test_messages_name_fields_by_label_and_drop_class_names():
    from ui.messages import input_error, plain

    e = InputError("image", "the file {file} is not a readable image (UnidentifiedImageError)", path="/x/a.png",
                   advice="Upload a PNG, JPEG or WebP image.")
    assert input_error(e) == "Start image: the file a.png is not a readable image. Upload a PNG, JPEG or WebP image."
    assert input_error(InputError("distilled CFG (gs)", "nan is not a finite number")).startswith(
        "Distilled CFG scale: ")
    assert plain("RuntimeError: disk on fire") == "disk on fire"
    assert plain("torch.OutOfMemoryError: CUDA out of memory") == "CUDA out of memory"
    assert plain("Out of GPU memory in transformer (cap 20 GB)") == "Out of GPU memory in transformer (cap 20 GB)"


def test_uploads_are_checked_on_arrival(tmp_path):
    from ui.uploads import check_upload

    good, bad, small = tmp_path / "good.png", tmp_path / "bad.png", tmp_path / "small.png"
    make_image(96, 80).save(good)
    bad.write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    make_image(40, 30).save(small)
    value = {"path": uploaded(good), "orig_name": "good.png"}
    assert check_upload(value, "image") == (value, None)
    assert check_upload(None, "end_image") == (None, None)
    kept, message = check_upload({"path": uploaded(bad)}, "end_image")
    assert kept is None and message.startswith("End image: ") and "bad.png" in message and "Error" not in message
    kept, message = check_upload({"path": str(good)}, "image")        # the server's file, not an upload
    assert kept is None and message.startswith("Start image: only a file uploaded to this app")
    kept, message = check_upload({"path": uploaded(small)}, "image")
    assert kept is None and "at least 64 pixels" in message


def test_token_count_agrees_with_what_the_text_encoder_cuts(tiny_original):
    """A prompt of exactly the shown limit is read whole; one token more is cut (pipeline.text.encode_llama)."""
    from pipeline.text import encode_llama
    from ui.prompt_tokens import TokenCounter

    counter = TokenCounter(get_preset("tiny"))
    limit = int(counter.markdown("a").split("/ ")[1].split(" ")[0])
    c = tiny_original
    for n, cut in ((limit, False), (limit + 1, True)):
        prompt = "x" * n                                      # the tiny tokenizer: one token per byte
        assert counter.count(prompt) == (n, True)
        _, _, truncated = encode_llama(c.tokenizer, c.text_encoder, prompt, c.crop_start, "cpu")
        assert truncated is cut, n
        assert ("too long" in counter.markdown(prompt)) is cut
    real = TokenCounter(get_preset("hunyuan"), model_dir=None)
    real._tried = True                                        # as without the weights: an estimate, said so
    assert "about" in real.markdown("a cat walks") and "estimated" in real.markdown("a cat walks")


def test_example_images_are_accepted_by_the_pipeline(tmp_path):
    from pipeline.request import Request, prepare
    from ui.examples import write_examples

    rows = write_examples(tmp_path / "examples")
    assert len(rows) >= 3 and len({open(p, "rb").read() for p, _ in rows}) == len(rows)
    for path, prompt in rows:
        prepared = prepare(Request(image=path, prompt=prompt), 640)
        assert prepared.width >= 64 and prompt
    again = write_examples(tmp_path / "examples")
    assert again == rows


def test_preserved_memory_text_says_when_a_value_cannot_work():
    from ui.hints import preserved_hint

    real = get_preset("hunyuan")
    fine = preserved_hint(real, 20, 6, "cuda", 64, max_gb=20)
    assert "cannot work" not in fine and "44/60 blocks" in fine
    too_big = preserved_hint(real, 20, 25, "cuda", 64, max_gb=20)
    assert too_big.startswith("⚠ **25 GB cannot work:**") and "up to 20 GB" in too_big
    nothing_resident = preserved_hint(real, 20, 19.5, "cuda", 64, max_gb=20)
    assert "cannot work as intended" in nothing_resident and "cannot be kept free" in nothing_resident
    too_small = preserved_hint(real, 20, 1, "cuda", 64, max_gb=20)
    assert "cannot work as intended" in too_small and "out-of-memory" in too_small


def test_the_progress_clock_moves_between_events():
    from pipeline.events import Progress
    from ui.view import ORIGINAL_NOTE, JobView

    view = JobView(mode="original")
    view.apply(Progress("VAE decode", 1, 3, 4, 4, 10.0, 20.0, "decoding"))
    first = view.take_changes()["progress"]
    assert "elapsed 10 s" in first and "ETA 20 s" in first and ORIGINAL_NOTE.split(":")[0] in first
    view.tick(now=view.progress_at + 5)
    later = view.take_changes()["progress"]
    assert "elapsed 15 s" in later and "ETA 15 s" in later
    view.tick(now=view.progress_at + 30)
    assert "ETA: any moment now" in view.take_changes()["progress"]
    f1 = JobView(mode="f1")
    f1.apply(Progress("sampling", 1, 3, 1, 4, 1.0, 9.0))
    assert "end of the video first" not in f1.take_changes()["progress"]


@pytest.mark.parametrize("ahead,wait,text", [
    (1, 40.0, "you are 2nd in line (1 job ahead of yours). It should start in about 40 s."),
    (2, None, "you are 3rd in line (2 jobs ahead of yours). No wait estimate yet"),
    (10, 75.0, "you are 11th in line (10 jobs ahead of yours). It should start in about 1 min 15 s."),
])
def test_waiting_text(ahead, wait, text):
    from jobs.line import Waiting
    from jobs.text import waiting_text

    assert text in waiting_text(Waiting(ahead, wait))

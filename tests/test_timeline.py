"""Timestamped prompts: parsing, the errors, which section gets which prompt in both modes, the blend, each prompt
encoded once, and tiny jobs (a one-prompt timeline equals the plain prompt; resume keeps the sections' prompts)."""
from __future__ import annotations

import json

import pytest
import torch

from common.errors import InputError
from jobfolder.checkpoint import load_checkpoint
from pipeline import timeline as tl
from pipeline.cancel import CancelToken
from pipeline.denoiser import FramepackDenoiser
from pipeline.events import Done, Progress
from pipeline.orchestrator import generate
from pipeline.request import Request, prepare
from pipeline.sections import make_plan
from pipeline.text import TextEmbeddings, encode_prompt
from pipeline.timeline_text import SectionTexts, encode_texts, mix
from tests.conftest import make_image, run_job

CAT = "[0s: a cat sits] [2s: the cat jumps] [4s: the cat lands]"
FAST = dict(steps=2, teacache=0.0, resolution=64, seed=5)


# ---- parsing ------------------------------------------------------------------------------------------------------

def test_plain_prompts_stay_as_typed():
    for plain in ("a cat sits", "", "a cat [fluffy] sits", "[style: anime] a cat", "  spaced  ", "ratio 2:1 [x]"):
        t = tl.parse(plain)
        assert not t.timed and t.texts == (plain,) and t.segments[0].start == 0


def test_timeline_is_parsed():
    t = tl.parse("  [0s: a cat sits]\n[2s:the cat jumps ]  [4.5 s: the cat lands] [6S: a cat sits]")
    assert t.timed
    assert [(s.start, s.text) for s in t.segments] == [(0, "a cat sits"), (2, "the cat jumps"),
                                                       (4.5, "the cat lands"), (6, "a cat sits")]
    assert t.texts == ("a cat sits", "the cat jumps", "the cat lands")        # a repeated text: encoded once


@pytest.mark.parametrize("prompt, words", [
    ("[0s: a] [2s: b] [1s: c]", "must increase"),
    ("[0s: a] [2s: b] [2s: c]", "two prompts start at 2s"),
    ("[0s: a] [2s:   ] [3s: c]", "has no text"),
    ("[0s: a] then [2s: b]", "outside the [time: text] blocks"),
    ("before [0s: a] [2s: b]", "outside"),
    ("[0s: a] [2s: b] after", "outside"),
    ("[0s: a] [2xs: b]", "'2xs' is not a time"),
    ("[0s: a] [1e9s: b]", "is not a time"),
    ("[0s: a] [-1s: b]", "is not a time"),
    ("[0s: a] [2 seconds: b]", "is not a time"),
    ("[0s: a] [4s-2s: b]", "before its start"),        # ranges are accepted (tests/test_timeline_studio.py)
    ("[1s: a] [2s: b]", "must start at 0s"),
    ("[0s: a [big] cat] [2s: b]", "unmatched"),
    ("[0s: a] [2s: b", "unmatched"),
])
def test_malformed_timelines_name_the_prompt(prompt, words):
    with pytest.raises(InputError) as e:
        tl.parse(prompt)
    assert e.value.field == "prompt" and words in e.value.message


# ---- sections -----------------------------------------------------------------------------------------------------

def test_section_spans_match_the_section_plan():
    for mode in ("original", "f1"):
        for seconds, window in ((1.2, 9), (4.8, 9), (10, 5), (3, 1)):
            plan = make_plan(mode, seconds, window)
            assert tl.section_frames(window, plan.count - 1)[1] == plan.total_frames - 1
            assert tl.video_seconds(window, plan.count, 30) * 30 == plan.total_frames
            if mode == "f1":       # the video grows forwards: section k ends where the video after it ends
                assert [tl.section_frames(window, k)[1] + 1 for k in range(plan.count)] == plan.frame_counts()


def _pure(schedule):
    return [schedule.texts[w.index(1.0)] for w in schedule.weights]


def test_assignment_by_place_in_the_final_video_both_modes():
    # 5 s at window 9: 4 sections of 36 frames (1.2 s); their middles at 0.62, 1.82, 3.02, 4.22 s.
    plan = make_plan("f1", 5.0, 9)
    assert plan.count == 4
    f1 = tl.schedule(CAT, "f1", 9, plan.count, 30)
    assert _pure(f1) == ["a cat sits", "a cat sits", "the cat jumps", "the cat lands"]
    original = tl.schedule(CAT, "original", 9, plan.count, 30)
    # generated from the end backwards: the first section generated is the video's last
    assert _pure(original) == ["the cat lands", "the cat jumps", "a cat sits", "a cat sits"]


def test_a_section_takes_the_prompt_at_its_middle():
    # section 2 (1.2-2.4 s) has its middle at 1.82 s: a change at 1.8 s is in effect there, one at 1.85 s is not
    assert _pure(tl.schedule("[0s: a] [1.8s: b]", "f1", 9, 3, 30)) == ["a", "b", "b"]
    assert _pure(tl.schedule("[0s: a] [1.85s: b]", "f1", 9, 3, 30)) == ["a", "a", "b"]


@pytest.mark.parametrize("prompt, words", [
    ("[0s: a] [4.9s: b]", "at or after the video's end (4.83 s"),
    ("[0s: a] [60s: b]", "after the video's end"),
    ("[0s: a] [1s: b] [1.5s: c]", "[1s: b] (from 1s until 1.5s) holds no section's middle"),
    ("[0s: a] [4.5s: b]", "holds no section's middle"),
])
def test_times_the_video_cannot_use(prompt, words):
    with pytest.raises(InputError) as e:
        tl.schedule(prompt, "original", 9, 4, 30)
    assert e.value.field == "prompt" and words in e.value.message


def test_errors_come_from_the_request_checks_before_any_model():
    image = make_image(96, 80)
    with pytest.raises(InputError) as e:
        prepare(Request(image=image, prompt="[0s: a] [3s: b]", seconds=2.4))
    assert "at or after the video's end (2.43 s: 2 sections" in str(e.value)
    ok = prepare(Request(image=image, prompt="[0s: a] [3s: b]", seconds=4.8))     # the same prompt, longer video
    assert ok.request.prompt == "[0s: a] [3s: b]"
    from ui import messages
    with pytest.raises(InputError) as e:
        prepare(Request(image=image, prompt="[0s: a] [0s: b]"))
    assert messages.input_error(e.value).startswith("Prompt: two prompts start at 0s")
    with pytest.raises(InputError, match="prompt blend"):
        prepare(Request(image=image, prompt=CAT, prompt_blend=-1))


def test_blend_weights():
    # f1, 6 sections of 1.2 s; b from 2 s (section 3 at video position 2), c from 5 s (position 4)
    s = tl.schedule("[0s: a] [2s: b] [5s: c]", "f1", 9, 6, 30, blend=2)
    third = 1 / 3
    expected = [(1, 0, 0), (1, 0, 0), (1 - third, third, 0), (third, 1 - third, 0),      # a -> b over 2 sections
                ((1 - third) * third, (1 - third) ** 2, third),                         # c starts from the mix
                (third * third, third * (1 - third), 1 - third)]
    assert len(s.weights) == 6
    for got, want in zip(s.weights, expected):
        assert got == pytest.approx(want) and sum(got) == pytest.approx(1)
    back = tl.schedule("[0s: a] [2s: b] [5s: c]", "original", 9, 6, 30, blend=2)
    assert list(back.weights) == list(reversed(s.weights))
    assert tl.schedule("[0s: a] [2s: b] [5s: c]", "f1", 9, 6, 30, blend=0).weights[2] == (0, 1, 0)


# ---- embeddings ---------------------------------------------------------------------------------------------------

def _emb(length: int, value: float, total: int = 6, dim: int = 3) -> TextEmbeddings:
    mask = torch.zeros(1, total)
    mask[:, :length] = 1
    llama = torch.full((1, total, dim), value)
    llama[:, length:] = 100.0                      # what Llama gives pad tokens: must never leak into a mix
    return TextEmbeddings(llama, mask, torch.full((1, 2), value))


def test_mix_of_masked_embeddings():
    a, b = _emb(2, 1.0), _emb(4, 3.0)
    assert mix([a, b], (1.0, 0.0)) is a and mix([a, b], (0.0, 1.0)) is b        # one prompt: its own tensors
    m = mix([a, b], (0.75, 0.25))
    assert m.mask.tolist() == [[1, 1, 1, 1, 0, 0]]                           # the union: still a prefix
    assert m.llama[0, :, 0].tolist() == pytest.approx([1.5, 1.5, 0.75, 0.75, 0, 0])
    assert m.pooled.tolist() == [[1.5, 1.5]]
    assert mix([a, b, _emb(1, 5.0)], (0.5, 0.5, 0.0)).llama[0, 0, 0] == 2.0


def test_each_distinct_prompt_is_encoded_once():
    calls = []

    def encode_all(prompts):
        calls.append(list(prompts))
        return [{"cond": _emb(len(p), float(len(p))), "uncond": _emb(len(p), 0.0)} for p in prompts]

    class Cache(dict):
        def get(self, key):
            return super().get(key)

        def put(self, key, value):
            self[key] = value

    cache = Cache()
    texts = tl.parse("[0s: aa] [2s: bbb] [4s: aa] [6s: c]").texts
    encoded, hits = encode_texts(texts, str.upper, cache, encode_all)
    assert calls == [["aa", "bbb", "c"]] and hits == 0 and sorted(cache) == ["AA", "BBB", "C"]
    again, hits = encode_texts(texts + ("dddd",), str.upper, cache, encode_all)
    assert calls[-1] == ["dddd"] and hits == 3 and again[0]["cond"].llama.equal(encoded[0]["cond"].llama)

    sched = tl.schedule("[0s: aa] [2s: bbb]", "f1", 9, 4, 30, blend=1)
    per = SectionTexts(sched, encoded[:2], negative_used=False)
    assert per.for_section(0)["cond"] is encoded[0]["cond"] and per.for_section(0) is per.for_section(1)
    assert per.for_section(0)["uncond"] is encoded[0]["uncond"]
    half = per.for_section(2)                                   # the blended section: CFG-off zeros, its mask
    assert half["cond"].mask.sum() == 3 and half["uncond"].mask.equal(half["cond"].mask)
    assert not half["uncond"].llama.any()


# ---- the page's explanations ------------------------------------------------------------------------------------

def test_the_page_explains_a_timeline_or_what_is_wrong():
    from configs import get_preset
    from ui.hints import timeline_hint
    from ui.prompt_tokens import TokenCounter

    text = timeline_hint(CAT, 5, 9, "original", 1)
    assert "Timed prompt, by section" in text and "3.63–4.83 s: 0.25·'a cat sits'" in text
    assert timeline_hint(CAT, 2.4, 9, "f1", 0).startswith("⚠ Prompt: [4s: the cat lands] starts at or after")
    assert timeline_hint("a cat [fluffy]", 5, 9, "f1", 0) == ""
    counter = TokenCounter(get_preset("tiny"))                  # the tiny tokenizer: one token per byte
    assert "timed prompt: 3 parts; the longest 13 / 255 tokens" in counter.markdown(CAT)
    assert "too long" in counter.markdown("[0s: a] [2s: " + "x" * 300 + "]")
    assert "⚠ Prompt: two prompts start at 0s" in counter.markdown("[0s: a] [0s: b]")


# ---- tiny jobs ----------------------------------------------------------------------------------------------------

def _record_section_texts(monkeypatch):
    seen = []
    original = FramepackDenoiser.begin_section

    def begin_section(self, ctx, indices, shape, image_embeds, texts, guidance):
        seen.append(texts)
        return original(self, ctx, indices, shape, image_embeds, texts, guidance)

    monkeypatch.setattr(FramepackDenoiser, "begin_section", begin_section)
    return seen


@pytest.mark.slow
def test_one_prompt_timeline_equals_the_plain_prompt(tiny_original, tmp_path):
    results = []
    for prompt in ("a boat drifts", "[0s: a boat drifts]"):
        _, last = run_job(Request(image=make_image(), prompt=prompt, seconds=2.4, **FAST), tiny_original,
                          tmp_path / str(len(results)))
        assert isinstance(last, Done)
        info = json.loads((last.job_dir / "job.json").read_text())
        results.append((load_checkpoint(last.job_dir)[0]["real"], [s["frames_sha256"] for s in info["sections"]]))
    assert torch.equal(results[0][0], results[1][0]) and results[0][1] == results[1][1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["original", "f1"])
def test_a_timeline_job_conditions_each_section_and_loads_the_encoders_once(mode, tiny_original, tiny_f1, tmp_path,
                                                                             monkeypatch):
    c = tiny_original if mode == "original" else tiny_f1
    forwards = []
    hook = c.text_encoder.register_forward_hook(lambda *a: forwards.append(1))
    seen = _record_section_texts(monkeypatch)
    try:
        _, last = run_job(Request(image=make_image(), prompt="[0s: a red boat] [1.5s: a blue boat] [2.5s: a storm]",
                                  seconds=3.6, mode=mode, **FAST), c, tmp_path)
    finally:
        hook.remove()
    assert isinstance(last, Done) and not last.stopped
    info = json.loads((last.job_dir / "job.json").read_text())
    assert [s["name"] for s in info["memory"]["stages"]].count("text encoders") == 1
    assert len(forwards) == 3                                     # three distinct prompts, one Llama pass each
    expected = {p: encode_prompt(c.tokenizer, c.text_encoder, c.tokenizer_2, c.text_encoder_2, p, c.crop_start,
                                 "cpu").llama.float() for p in ("a red boat", "a blue boat", "a storm")}
    by_video_order = ["a red boat", "a blue boat", "a storm"]      # middles at 0.62, 1.82, 3.02 s
    generated = by_video_order if mode == "f1" else by_video_order[::-1]
    assert len(seen) == 3
    for texts, prompt in zip(seen, generated):
        torch.testing.assert_close(texts["cond"].llama, expected[prompt], atol=0, rtol=0)


@pytest.mark.slow
def test_resume_keeps_each_sections_prompt(tiny_original, tmp_path, monkeypatch):
    from pipeline.resume import prepare_resume, resume

    request = Request(image=make_image(), prompt="[0s: a red boat] [1.5s: a storm]", seconds=3.6, prompt_blend=1,
                      **FAST)
    full_seen = _record_section_texts(monkeypatch)
    _, full = run_job(request, tiny_original, tmp_path / "full")
    monkeypatch.undo()

    cancel = CancelToken()
    events = []
    for ev in generate(prepare(request, 64), tiny_original, cancel=cancel, outputs=tmp_path / "cut"):
        events.append(ev)
        if isinstance(ev, Progress) and ev.section == 2 and ev.step == 1:
            cancel.cancel()
    assert isinstance(events[-1], Done) and events[-1].stopped
    seen = _record_section_texts(monkeypatch)
    ends = list(resume(prepare_resume(events[-1].job_dir), tiny_original))
    assert isinstance(ends[-1], Done) and not ends[-1].stopped
    assert len(seen) == 2                                         # sections 2 and 3, with their own prompts
    for texts, want in zip(seen, full_seen[1:]):
        torch.testing.assert_close(texts["cond"].llama, want["cond"].llama, atol=0, rtol=0)
    assert not torch.equal(seen[0]["cond"].llama, seen[1]["cond"].llama)         # a blend, then the red boat alone
    torch.testing.assert_close(load_checkpoint(ends[-1].job_dir)[0]["real"],
                               load_checkpoint(full.job_dir)[0]["real"], atol=0, rtol=0)


@pytest.mark.slow
def test_the_cli_refuses_a_malformed_timeline_before_loading(tmp_path):
    from tests.cli_helpers import cli

    make_image().save(tmp_path / "in.png")
    r = cli("generate", "--preset", "tiny", "--image", tmp_path / "in.png", "--seconds", 2.4, "--out",
            tmp_path / "out", "--prompt", "[0s: a] [2s: b] [1s: c]")
    assert r.returncode == 2
    assert "--prompt: the times must increase from left to right: [1s: c] comes after [2s: b]" in r.stderr
    assert not (tmp_path / "out").exists()

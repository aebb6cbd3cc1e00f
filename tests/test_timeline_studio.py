"""FramePack-Studio's prompt forms (pipeline/timeline.py): time ranges `[2.2s-3.3s: …]` and text outside the blocks
(the base prompt), alone and mixed, with Studio's meaning; what is really malformed is still refused, clearly.
Pure bookkeeping, no models: fast."""
from __future__ import annotations

import pytest

from common.errors import InputError
from pipeline import timeline as tl

# 5 s at window 9, 30 fps: 4 sections of 1.2 s; their middles (in the video) at 0.62, 1.82, 3.02, 4.22 s.
COUNT = 4


def _video_order(prompt: str, mode: str = "f1", blend: int = 0) -> list[str]:
    """The prompt of each section in the order of the final video (sections with one prompt only)."""
    s = tl.schedule(prompt, mode, 9, COUNT, 30, blend)
    by_generation = [s.texts[w.index(1.0)] for w in s.weights]
    return by_generation if mode == "f1" else by_generation[::-1]


def test_studio_example_with_a_range():
    # FramePack-Studio's own example (modules/prompt_handler.py, get_quick_prompts): after the range ends, its lookup
    # falls back to the first prompt.
    prompt = "[0s: Person looks surprised] [1.1s: Person raises arms above head] [2.2s-3.3s: Person puts hands on hips]"
    t = tl.parse(prompt)
    assert [(s.start, s.text, s.filler) for s in t.segments] == [
        (0, "Person looks surprised", False), (1.1, "Person raises arms above head", False),
        (2.2, "Person puts hands on hips", False), (3.3, "Person looks surprised", True)]
    expected = ["Person looks surprised", "Person raises arms above head", "Person puts hands on hips",
                "Person looks surprised"]
    assert _video_order(prompt, "f1") == expected
    assert _video_order(prompt, "original") == expected          # places in the final video, whatever the order


def test_a_range_that_reaches_the_end_leaves_its_default_unused_and_unencoded():
    s = tl.schedule("[0s: a] [2s-4.5s: b]", "f1", 9, COUNT, 30)  # b from 2 to 4.5 s; the video ends at 4.83 s
    assert [s.texts[w.index(1.0)] for w in s.weights] == ["a", "a", "b", "b"]
    assert s.texts == ("a", "b") and len(s.timeline.segments) == 2
    assert _video_order("[0s: a] [2s-60s: b]") == ["a", "a", "b", "b"]    # an end past the video is fine


def test_base_text_is_the_prompt_until_the_first_block():
    prompt = "a cat sits on a sofa [2s: the cat jumps] [4s: the cat lands]"
    t = tl.parse(prompt)
    assert t.timed and t.texts == ("a cat sits on a sofa", "the cat jumps", "the cat lands")
    assert _video_order(prompt) == ["a cat sits on a sofa", "a cat sits on a sofa", "the cat jumps", "the cat lands"]
    # parts anywhere outside the blocks are joined into one base prompt (Studio removes the blocks from the text)
    assert tl.parse("a cat [2s: the cat jumps]\n on a sofa ").segments[0].text == "a cat on a sofa"


def test_mixed_base_text_ranges_and_points():
    prompt = "a calm lake [1.5s-3s: a boat passes] [4s: rain falls]"
    t = tl.parse(prompt)
    assert [(s.start, s.text) for s in t.segments] == [(0, "a calm lake"), (1.5, "a boat passes"),
                                                       (3, "a calm lake"), (4, "rain falls")]
    assert t.texts == ("a calm lake", "a boat passes", "rain falls")          # the base text is encoded once
    assert _video_order(prompt) == ["a calm lake", "a boat passes", "a calm lake", "rain falls"]
    assert _video_order(prompt, "original") == ["a calm lake", "a boat passes", "a calm lake", "rain falls"]
    # with a block at 0 s, the base text fills the gap a range leaves
    assert _video_order("a calm lake [0s: fog] [1.5s-3s: a boat passes]") == ["fog", "a boat passes",
                                                                              "a calm lake", "a calm lake"]
    # the blend runs over the changes as for any timeline: weights over the three texts, each summing to 1
    s = tl.schedule(prompt, "f1", 9, COUNT, 30, blend=1)
    assert s.weights[0] == (1, 0, 0) and s.weights[1] == pytest.approx((0.5, 0.5, 0))
    assert s.weights[2] == pytest.approx((0.75, 0.25, 0)) and all(sum(w) == pytest.approx(1) for w in s.weights)


def test_plain_prompts_with_brackets_stay_plain():
    for plain in ("a cat [fluffy] sits", "[style: anime] a cat", "a - b: c"):
        t = tl.parse(plain)
        assert not t.timed and t.texts == (plain,)


@pytest.mark.parametrize("prompt, words", [
    ("[0s: a] [3s-2s: b]", "the range ends at 2s, before its start 3s"),
    ("[0s: a] [2s-2s: b]", "the range ends where it starts"),
    ("[0s: a] [1s-3s: b] [2s: c]", "[1s-3s: b] lasts until 3s, past the start of [2s: c]"),
    ("[0s: a] [2s-xs: b]", "is not a time; write a range in seconds, like [2s-4s: …]"),
    ("[0s: a] [2s-: b]", "is not a time; write a range"),
    ("[0s: a] [-1s-2s: b]", "is not a time"),
    ("[0s: a] [3s: b] [2s-4s: c]", "must increase"),
    ("[0s: a] [2s-3s:  ] ", "has no text"),
    ("a cat [0s: a] [2s: b]", "'a cat' stands outside the [time: text] blocks; such text is the base prompt"),
    ("[0s: a] [2s: b] trailing words", "the blocks leave no time for it"),
    ("[1s: a] [2s: b]", "must start at 0s, like [0s: …] (or write the prompt until then outside the blocks"),
    ("a lake [2s: b] [unclosed", "unmatched"),
    ("a lake ] [2s: b]", "unmatched"),
])
def test_what_is_really_malformed_is_refused_clearly(prompt, words):
    with pytest.raises(InputError) as e:
        tl.parse(prompt)
    assert e.value.field == "prompt" and words in e.value.message


@pytest.mark.parametrize("prompt, words", [
    ("[0s: a] [2s-2.5s: b]", "[2s-2.5s: b] (from 2s until 2.5s) holds no section's middle"),
    ("x [0.3s: a] [2s: b]", "the base text 'x' (from 0s until 0.3s) holds no section's middle"),
    ("x [5s-6s: a]", "[5s-6s: a] starts at or after the video's end"),
])
def test_ranges_and_base_text_the_video_cannot_use(prompt, words):
    with pytest.raises(InputError) as e:
        tl.schedule(prompt, "f1", 9, COUNT, 30)
    assert words in e.value.message


def test_the_request_checks_accept_studio_prompts():
    # pipeline.request.prepare calls this hook (tests/test_timeline.py runs prepare itself; here no torch is loaded)
    settings = dict(mode="f1", seconds=4.8, latent_window=9, fps=30, prompt_blend=0)
    tl.check_request({**settings, "prompt": "a calm lake [1.5s-3s: a boat passes]"})
    with pytest.raises(InputError, match="before its start"):
        tl.check_request({**settings, "prompt": "[0s: a] [3s-1s: b]"})
    with pytest.raises(InputError, match="holds no section's middle"):
        tl.check_request({**settings, "seconds": 1.2, "prompt": "a calm lake [0.9s-1.2s: a boat passes]"})

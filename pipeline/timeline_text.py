"""The text conditioning of a timed prompt: each distinct prompt encoded once (one load of the text encoders for
all of them, the prompt cache asked first), and each section's embeddings mixed from them (pipeline/timeline.py
says which prompts a section gets, and with what weights).

Mixing masked embeddings: the Llama embeddings of every prompt are padded to the same length (LLAMA_MAX_TOKENS)
and masked, with the real tokens first (pipeline/text.py). A mix weights each prompt's real tokens only: the
padded positions are zeroed before the weighted sum (the hidden states Llama gives pad tokens never leak in), and
the mask is the union of the prompts' masks — still a prefix of ones, as the denoiser expects (it cuts the text
tokens at the mask's sum). Where the shorter prompt has no tokens, the longer one's tokens come in at their weight.
The pooled CLIP embeddings are mixed with the same weights. A section with a single prompt (weight 1) gets that
prompt's embeddings unchanged — not recomputed — so a one-prompt timeline conditions exactly like a plain prompt.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from pipeline.text import TextEmbeddings
from pipeline.timeline import Schedule, Weights

log = logging.getLogger(__name__)

Texts = dict[str, TextEmbeddings]            # {"cond": …, "uncond": …}, as the denoiser takes them


def mix(embeddings: list[TextEmbeddings], weights: Weights) -> TextEmbeddings:
    """The weighted mix of `embeddings` (one per prompt; weights sum to 1), as described above."""
    used = [(e, w) for e, w in zip(embeddings, weights) if w > 0]
    if len(used) == 1:
        return used[0][0]
    total = sum(w for _, w in used)
    mask = torch.stack([e.mask for e, _ in used]).amax(dim=0)
    llama = sum((w / total) * e.llama * e.mask.unsqueeze(-1).to(e.llama.dtype) for e, w in used)
    pooled = sum((w / total) * e.pooled for e, w in used)
    return TextEmbeddings(llama, mask, pooled, any(e.truncated for e, _ in used))


def encode_texts(texts: tuple[str, ...], key_of: Callable[[str], str], cache,
                 encode_all: Callable[[list[str]], list[Texts]]) -> tuple[list[Texts], int]:
    """Each text's {"cond", "uncond"} embeddings, in order: from the cache where it has them, the others from ONE
    call of `encode_all` (which loads the text encoders once). Returns (embeddings, cache hits)."""
    found: list[Texts | None] = [cache.get(key_of(t)) if cache is not None else None for t in texts]
    missing = [i for i, f in enumerate(found) if f is None]
    if missing:
        fresh = encode_all([texts[i] for i in missing])
        for i, got in zip(missing, fresh):
            found[i] = got
            if cache is not None:
                cache.put(key_of(texts[i]), {k: TextEmbeddings(v.llama.cpu(), v.mask.cpu(), v.pooled.cpu(),
                                                               v.truncated) for k, v in got.items()})
    done = [f for f in found if f is not None]          # (all of them now)
    return done, len(texts) - len(missing)


class SectionTexts:
    """The embeddings each section samples with: `for_section(i)` for the section of generation index i. Mixes are
    made when first asked for and kept by their weights (sections with the same prompt share one object)."""

    def __init__(self, schedule: Schedule, encoded: list[Texts], negative_used: bool):
        self.schedule, self.encoded, self.negative_used = schedule, encoded, negative_used
        self._made: dict[Weights, Texts] = {}

    def for_section(self, index: int) -> Texts:
        weights = self.schedule.weights[index]
        if weights not in self._made:
            cond = mix([e["cond"] for e in self.encoded], weights)
            if self.negative_used:          # one negative prompt for the whole video (the same in every entry)
                uncond = self.encoded[0]["uncond"]
            elif sum(w > 0 for w in weights) == 1:
                uncond = self.encoded[weights.index(max(weights))]["uncond"]
            else:                           # CFG off: zeros with the section's mask (as TextEmbeddings.zeros_like)
                uncond = cond.zeros_like()
            self._made[weights] = {"cond": cond, "uncond": uncond}
        return self._made[weights]

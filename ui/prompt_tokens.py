"""The live token count under the prompt: the text encoder reads at most LLAMA_MAX_TOKENS tokens of the prompt
(pipeline/text.py); the rest is cut. Counting uses the preset's own tokenizer (built in code for the tiny preset,
read from the weights' folder or the Hugging Face cache for the real one, never downloaded here). Before the real
weights are on this computer there is no tokenizer: the count is then an estimate and says so."""
from __future__ import annotations

import html
import logging
import threading
from pathlib import Path

from common.errors import InputError
from configs import LIMITS
from pipeline.timeline import is_timeline, parse

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4          # the estimate without a tokenizer (English text with Llama-3's tokenizer: ~4-5)


def _load_tokenizer(preset, model_dir: Path | None):
    if preset.tiny:
        from pipeline.tiny import build_llama_tokenizer

        return build_llama_tokenizer()
    from transformers import AutoTokenizer

    src = preset.tokenizer
    if model_dir is not None:
        folder = Path(model_dir) / src.repo / (src.subfolder or "")
        return AutoTokenizer.from_pretrained(folder) if folder.is_dir() else None
    from huggingface_hub import snapshot_download

    from pipeline.components import hf_cache_dir

    pattern = f"{src.subfolder}/*" if src.subfolder else "*"
    root = snapshot_download(src.repo, revision=src.revision, allow_patterns=[pattern], cache_dir=hf_cache_dir(),
                             local_files_only=True)
    folder = Path(root) / (src.subfolder or "")
    return AutoTokenizer.from_pretrained(folder) if folder.is_dir() else None


class TokenCounter:
    def __init__(self, preset, model_dir: Path | None = None):
        self.preset, self.model_dir = preset, model_dir
        self._tokenizer, self._crop, self._tried = None, 0, False
        self._lock = threading.Lock()

    def _get(self):
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    self._tokenizer = _load_tokenizer(self.preset, self.model_dir)
                except Exception as e:  # not downloaded yet, or unreadable: the count becomes an estimate
                    log.info("prompt token count: no tokenizer (%s); estimating from the length", e)
                if self._tokenizer is not None:
                    from pipeline.text import template_crop_start

                    self._crop = template_crop_start(self._tokenizer)
            return self._tokenizer

    def count(self, prompt: str) -> tuple[int, bool]:
        """(tokens of the prompt as the text encoder sees it, exact?); the prompt is first cut to the characters
        the pipeline keeps. Without a tokenizer: an estimate from the length."""
        from pipeline.text import PROMPT_TEMPLATE

        text = prompt[: LIMITS.prompt_chars_max]
        tokenizer = self._get()
        if tokenizer is None:
            return -(-len(text) // CHARS_PER_TOKEN), False
        ids = tokenizer(PROMPT_TEMPLATE.format(text), add_special_tokens=True)["input_ids"]
        return max(len(ids) - self._crop - 1, 0), True      # - the template's part before and the closing token

    def markdown(self, prompt) -> str:
        """The line under the prompt: the count, and a warning when the prompt is longer than the model reads. A
        timed prompt ([0s: …] [2s: …], pipeline/timeline.py): what is wrong with it, or the count of its longest
        part (each part is encoded on its own)."""
        from pipeline.text import LLAMA_MAX_TOKENS

        if not isinstance(prompt, str):
            return ""
        if is_timeline(prompt[: LIMITS.prompt_chars_max]):
            return self._timeline_markdown(prompt[: LIMITS.prompt_chars_max], LLAMA_MAX_TOKENS - 1)
        n, exact = self.count(prompt)
        about = "" if exact else "about "
        limit = LLAMA_MAX_TOKENS - 1       # the text encoder reads 256 tokens after the template: the prompt's and
        #                                    the template's closing token (pipeline.text.encode_llama)
        cut_chars = len(prompt) > LIMITS.prompt_chars_max
        if n <= limit and not cut_chars:
            note = "" if exact else " (estimated: the tokenizer comes with the models)"
            return f'<span class="sf-tokens">{about}{n} / {limit} tokens{note}</span>'
        over = f"{about}{n} / {limit} tokens" if n > limit else f"over {LIMITS.prompt_chars_max} characters"
        return (f'<span class="sf-tokens sf-tokens-over">⚠ Prompt too long: {html.escape(over)}. Only the first '
                f'{limit} tokens are used; the rest is cut. Shorten the prompt.</span>')

    def _timeline_markdown(self, prompt: str, limit: int) -> str:
        try:
            timeline = parse(prompt)
        except InputError as e:
            return f'<span class="sf-tokens sf-tokens-over">⚠ Prompt: {html.escape(e.message)}</span>'
        counts = [(self.count(text), text) for text in timeline.texts]
        ((n, exact), longest) = max(counts, key=lambda c: c[0][0])
        about = "" if exact else "about "
        parts = f"timed prompt: {len(timeline.segments)} part{'s' if len(timeline.segments) != 1 else ''}"
        if n <= limit:
            return f'<span class="sf-tokens">{parts}; the longest {about}{n} / {limit} tokens</span>'
        return (f'<span class="sf-tokens sf-tokens-over">⚠ {parts}; "{html.escape(longest[:40])}" is too long: '
                f'{about}{n} / {limit} tokens. Only the first {limit} tokens of each part are used; shorten '
                f'it.</span>')

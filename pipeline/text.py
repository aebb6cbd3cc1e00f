"""Prompt encoding: Llama (templated, hidden_states[-3], cropped) and CLIP-L (pooled).

The Llama of a job is trimmed (memory/llama_trim.py): without the layers after the hidden state we take, whose
`last_hidden_state` is that hidden state. A `LlamaModel` built directly (not trimmed) works too.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from memory.llama_trim import LLAMA_SKIP_LAYERS, TRIMMED_ATTR

log = logging.getLogger(__name__)

PROMPT_TEMPLATE = (
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following aspects: "
    "1. The main content and theme of the video."
    "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects."
    "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects."
    "4. background environment, light, style and atmosphere."
    "5. camera angles, movements, and transitions used in the video:<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"
)
LLAMA_MAX_TOKENS = 256
CLIP_MAX_TOKENS = 77


def template_crop_start(tokenizer, template: str = PROMPT_TEMPLATE) -> int:
    """Tokens of the template before the prompt (BOS included), for this tokenizer.

    FramePack hard-codes 95, which is right only for the real Llama-3 tokenizer; counting the tokens of the part
    before the placeholder gives 95 there and the right number for any other tokenizer.
    """
    prefix = template.split("{}")[0]
    return len(tokenizer(prefix, add_special_tokens=True)["input_ids"])


@dataclass
class TextEmbeddings:
    llama: torch.Tensor            # (1, L, D), cropped to the prompt
    mask: torch.Tensor             # (1, L)
    pooled: torch.Tensor           # (1, D2)
    truncated: bool = False

    def zeros_like(self) -> "TextEmbeddings":
        """The negative embeddings FramePack uses when real CFG is off."""
        return TextEmbeddings(torch.zeros_like(self.llama), self.mask.clone(), torch.zeros_like(self.pooled))

    def to(self, device, dtype) -> "TextEmbeddings":
        return TextEmbeddings(self.llama.to(device, dtype), self.mask.to(device, dtype),
                              self.pooled.to(device, dtype), self.truncated)


@torch.no_grad()
def encode_llama(tokenizer, text_encoder, prompt: str, crop_start: int, device) -> tuple[torch.Tensor, torch.Tensor,
                                                                                          bool]:
    text = PROMPT_TEMPLATE.format(prompt)
    max_len = LLAMA_MAX_TOKENS + crop_start
    full = tokenizer(text, add_special_tokens=True)["input_ids"]
    truncated = len(full) > max_len
    inputs = tokenizer(text, max_length=max_len, padding="max_length", truncation=True, return_tensors="pt",
                       return_attention_mask=True)
    ids = inputs.input_ids.to(device)
    mask = inputs.attention_mask.to(device)
    if getattr(text_encoder, TRIMMED_ATTR, False):        # the same tensor, without computing what follows it
        hidden = text_encoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    else:
        out = text_encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        hidden = out.hidden_states[-(LLAMA_SKIP_LAYERS + 1)]
    return hidden[:, crop_start:], mask[:, crop_start:], truncated


@torch.no_grad()
def encode_clip(tokenizer, text_encoder, prompt: str, device) -> torch.Tensor:
    inputs = tokenizer(prompt, max_length=CLIP_MAX_TOKENS, padding="max_length", truncation=True,
                       return_tensors="pt")
    return text_encoder(inputs.input_ids.to(device), output_hidden_states=False).pooler_output


def encode_prompt(tokenizer, text_encoder, tokenizer_2, text_encoder_2, prompt: str, crop_start: int,
                  device) -> TextEmbeddings:
    llama, mask, truncated = encode_llama(tokenizer, text_encoder, prompt, crop_start, device)
    pooled = encode_clip(tokenizer_2, text_encoder_2, prompt, device)
    if truncated:
        log.warning("prompt: longer than %d tokens; the rest was cut off", LLAMA_MAX_TOKENS)
    return TextEmbeddings(llama, mask, pooled, truncated)

"""The tiny preset: the real model classes with tiny configs and seeded random weights, tokenizers built in code.

Nothing here touches the network. The same seed always gives the same weights, so tests can compare outputs.
"""
from __future__ import annotations

import logging

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from configs.presets import ModelPreset
from memory.llama_trim import trim_llama

log = logging.getLogger(__name__)

LLAMA_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|finetune_right_pad_id|>")


def _byte_alphabet() -> list[str]:
    return sorted(pre_tokenizers.ByteLevel.alphabet())


def build_llama_tokenizer():
    """Byte-level Llama-3-style tokenizer: 256 byte tokens + the special tokens of the prompt template."""
    from transformers import LlamaTokenizerFast

    vocab = {c: i for i, c in enumerate(_byte_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in LLAMA_SPECIALS])
    return LlamaTokenizerFast(
        tokenizer_object=tok, bos_token=LLAMA_SPECIALS[0], eos_token=LLAMA_SPECIALS[1],
        pad_token=LLAMA_SPECIALS[5], add_bos_token=True, add_eos_token=False, padding_side="right",
    )


def build_clip_tokenizer():
    """Byte-level CLIP tokenizer (every byte a token, with and without the end-of-word mark)."""
    from transformers import CLIPTokenizer

    alphabet = _byte_alphabet()
    vocab = {c: i for i, c in enumerate(alphabet)}
    for c in alphabet:
        vocab[c + "</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[])


def build_feature_extractor(image_size: int):
    # The PIL processor (no torchvision): the same code path on every machine. transformers' SiglipImageProcessor
    # falls back to it without torchvision, after a warning that advises installing torchvision (which would
    # replace the installed torch build).
    from transformers import SiglipImageProcessorPil

    return SiglipImageProcessorPil(
        do_resize=True, size={"height": image_size, "width": image_size}, resample=3,
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )


def _seeded(seed: int, build):
    """Build a module with weights drawn from a fixed seed, without disturbing the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = build()
    return module.eval().requires_grad_(False)


def build_tiny_llama(preset: ModelPreset):
    """The tiny preset's whole Llama, as a real repo holds it (what tests save in the repos' layout); the job's
    text encoder is this one trimmed (memory/llama_trim.py)."""
    from transformers import LlamaConfig, LlamaModel

    return _seeded(preset.tiny_seed, lambda: LlamaModel(LlamaConfig(**preset.tiny_configs["llama"])))


def build_tiny_models(preset: ModelPreset, mode: str) -> dict:
    """All components of the tiny preset, keyed by role (the same roles as real loading). The Llama is trimmed as
    real loading trims it (its embedding stays: there are no files to read rows from)."""
    from diffusers import AutoencoderKLHunyuanVideo, HunyuanVideoFramepackTransformer3DModel
    from transformers import CLIPTextConfig, CLIPTextModel, SiglipVisionConfig, SiglipVisionModel


    cfg = preset.tiny_configs
    seed = preset.tiny_seed
    siglip_cfg = dict(cfg["siglip"])
    # F1 and the original mode use different weights in the real preset; mirror that with another seed.
    transformer_seed = seed + (5 if mode == "f1" else 4)
    return {
        "tokenizer": build_llama_tokenizer(),
        "tokenizer_2": build_clip_tokenizer(),
        "feature_extractor": build_feature_extractor(siglip_cfg["image_size"]),
        "text_encoder": trim_llama(build_tiny_llama(preset)),
        "text_encoder_2": _seeded(seed + 1, lambda: CLIPTextModel(CLIPTextConfig(**cfg["clip"]))),
        "image_encoder": _seeded(seed + 2, lambda: SiglipVisionModel(SiglipVisionConfig(**siglip_cfg))),
        "vae": _seeded(seed + 3, lambda: AutoencoderKLHunyuanVideo(**cfg["vae"])),
        "transformer": _seeded(transformer_seed,
                               lambda: HunyuanVideoFramepackTransformer3DModel(**cfg["transformer"])),
    }

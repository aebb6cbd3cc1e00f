"""The Llama without what the text stage never uses (memory/llama_trim.py): the same embeddings, bit for bit, with
fewer bytes packed and read. Real models throughout (the tiny preset's, and saved as safetensors like the real repo)."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaModel

from common.units import GIB
from configs.presets import HUNYUAN, TINY
from memory.chunk import _align
from memory.estimate import REAL_LLAMA_CONFIG, _chunk_sizes, _items, nominal_models, nominal_plan
from memory.hostpack import HostPack
from memory.hostplan import PER_JOB, StageUse
from memory.llama_trim import EMBED_NAME, LLAMA_SKIP_LAYERS, TRIMMED_ATTR, FileEmbedding, trim_llama
from memory.loader import load_from_files
from memory.manager import MemoryManager
from pipeline.components import _load_role, load_components
from pipeline.text import LLAMA_MAX_TOKENS, PROMPT_TEMPLATE, encode_llama, encode_prompt, template_crop_start
from pipeline.tiny import build_llama_tokenizer, build_tiny_llama
from tests.model_helpers import HUNYUAN_FP32, save_like_repos

PROMPTS = ("a cat", "a red fox runs through fresh snow, the camera follows it low", "ü" * 400)   # the last is cut


def _deep_llama(layers: int) -> LlamaModel:
    """The tiny preset's Llama config with more layers (a trimmed one then still has blocks to stream)."""
    torch.manual_seed(7)
    cfg = LlamaConfig(**dict(TINY.tiny_configs["llama"], num_hidden_layers=layers))
    return LlamaModel(cfg).eval().requires_grad_(False)


def _ids(tokenizer, prompt: str, crop_start: int):
    inputs = tokenizer(PROMPT_TEMPLATE.format(prompt), max_length=LLAMA_MAX_TOKENS + crop_start,
                       padding="max_length", truncation=True, return_tensors="pt", return_attention_mask=True)
    return inputs.input_ids, inputs.attention_mask


def _dropped(n: int) -> set[str]:
    """State-dict names the trimmed model no longer has (with its embedding read from the files)."""
    full = _deep_llama(n).state_dict()
    return {k for k in full if k in (EMBED_NAME, "norm.weight")
            or any(k.startswith(f"layers.{i}.") for i in range(n - LLAMA_SKIP_LAYERS, n))}


@pytest.mark.parametrize("layers", [3, 6])
def test_the_trimmed_models_last_hidden_state_is_hidden_states_minus_3(tiny_original, layers):
    full = build_tiny_llama(TINY) if layers == 3 else _deep_llama(layers)
    trimmed = trim_llama(build_tiny_llama(TINY) if layers == 3 else _deep_llama(layers))
    assert len(trimmed.layers) == trimmed.config.num_hidden_layers == layers - LLAMA_SKIP_LAYERS
    assert isinstance(trimmed.norm, torch.nn.Identity) and isinstance(trimmed.embed_tokens, torch.nn.Embedding)
    for prompt in PROMPTS:
        ids, mask = _ids(tiny_original.tokenizer, prompt, tiny_original.crop_start)
        with torch.no_grad():            # the call the text stage made before: every hidden state, the cache on
            states = full(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
            out = trimmed(input_ids=ids, attention_mask=mask, use_cache=False)
        assert len(states) == layers + 1
        assert not torch.equal(states[-3], states[-2]) and not torch.equal(states[-3], states[-1])
        assert torch.equal(out.last_hidden_state, states[-3]), prompt


def test_encode_prompt_gives_the_same_embeddings_trimmed_or_not(tiny_original):
    c = tiny_original
    assert getattr(c.text_encoder, TRIMMED_ATTR) and len(c.text_encoder.layers) == 1
    full = build_tiny_llama(c.preset)
    for prompt in PROMPTS:
        ours = encode_prompt(c.tokenizer, c.text_encoder, c.tokenizer_2, c.text_encoder_2, prompt, c.crop_start,
                             "cpu")
        ref = encode_prompt(c.tokenizer, full, c.tokenizer_2, c.text_encoder_2, prompt, c.crop_start, "cpu")
        assert torch.equal(ours.llama, ref.llama) and torch.equal(ours.mask, ref.mask)
        assert torch.equal(ours.pooled, ref.pooled) and ours.truncated == ref.truncated
    assert ours.truncated and ours.llama.shape[1] == LLAMA_MAX_TOKENS


def test_fp8_storage_covers_the_tiny_presets_trimmed_llama_as_the_whole_one(tiny_original):
    """Its one kept layer is still a block (memory/hostpack.py block_list), so fp8 storage rounds its Linear weights
    as before: the same embeddings as the whole Llama stored in fp8."""
    c = tiny_original
    assert len(HostPack.of(c.text_encoder).blocks) == 1
    text_stage = [StageUse("text encoders", ("text_encoder",), PER_JOB)]
    out = {}
    for name, storage, llama in (("trimmed", "fp8", trim_llama(build_tiny_llama(TINY))),
                                 ("whole", "fp8", build_tiny_llama(TINY)),
                                 ("native", "native", build_tiny_llama(TINY))):
        mm = MemoryManager(device="cpu", weight_storage=storage)
        mm.arrange_host({"text_encoder": llama}, text_stage)
        assert HostPack.of(llama).fp8 == (storage == "fp8")
        with mm.stage("text encoders", text_encoder=llama):
            out[name] = encode_llama(c.tokenizer, llama, PROMPTS[1], c.crop_start, "cpu")[0]
    assert torch.equal(out["trimmed"], out["whole"]) and not torch.equal(out["trimmed"], out["native"])


def test_trimming_twice_changes_nothing_and_a_packed_or_short_model_is_refused():
    model = trim_llama(_deep_llama(5))
    assert trim_llama(model) is model and len(model.layers) == 3
    with pytest.raises(ValueError, match="needs more than 2"):
        trim_llama(_deep_llama(2))
    packed = _deep_llama(4)
    HostPack.of(packed)
    with pytest.raises(RuntimeError, match="before its host pack"):
        trim_llama(packed)


# ---- real weights: the Llama saved as the real repo holds it (bfloat16 safetensors) --------------------------------
@pytest.fixture(scope="module")
def saved_bf16_llama(tiny_original, tmp_path_factory):
    """The tiny models saved like the real repos (as conftest's `saved`), the Llama then in bfloat16 as its repo holds it."""
    root = tmp_path_factory.mktemp("models")
    save_like_repos(tiny_original, root)                      # the Llama whole, in float32
    build_tiny_llama(TINY).to(torch.bfloat16).save_pretrained(root / HUNYUAN.text_encoder.repo / "text_encoder")
    return root


def _preset(llama_dtype: str):
    return dataclasses.replace(HUNYUAN_FP32, text_encoder=dataclasses.replace(HUNYUAN.text_encoder,
                                                                                 dtype=llama_dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])      # the file's dtype (raw bytes), and a conversion
def test_real_weights_read_only_the_rows_and_layers_they_use(saved_bf16_llama, dtype):
    folder = saved_bf16_llama / HUNYUAN.text_encoder.repo / "text_encoder"
    dt = getattr(torch, dtype)
    c = load_components(_preset(dtype), "original", model_dir=saved_bf16_llama)
    llama = c.text_encoder
    emb = llama.embed_tokens
    assert isinstance(emb, FileEmbedding) and not list(emb.parameters()) and not list(emb.buffers())
    assert emb.bytes_read == 0 and len(llama.layers) == 1 and llama.dtype == dt
    pack = HostPack.of(llama)
    names = {e.name for ch in pack.chunks for e in ch.entries}
    assert not names & _dropped(3) and not any(n.startswith("layers.1.") for n in names)

    whole = HostPack.of(load_from_files(LlamaModel, folder, dt))      # the same files, nothing dropped
    dropped = [whole.files.tensors[n] for n in _dropped(3)]
    assert whole.nbytes - pack.nbytes == sum(_align(math.prod(t.shape) * dt.itemsize) for t in dropped)
    assert (sum(ch.file_bytes for ch in whole.chunks) - sum(ch.file_bytes for ch in pack.chunks)
            == sum(t.nbytes for t in dropped))

    ref = LlamaModel.from_pretrained(folder, dtype=dt).eval()       # the library's loader, the whole model
    assert len(ref.layers) == 3 and isinstance(ref.embed_tokens, torch.nn.Embedding)
    row = llama.config.hidden_size * 2                                # bfloat16 in the file
    with MemoryManager(device="cpu", plan_on_cpu=True).stage("text encoders", text_encoder=llama,
                                                             text_encoder_2=c.text_encoder_2):
        for prompt in PROMPTS:
            before = emb.bytes_read
            ours = encode_prompt(c.tokenizer, llama, c.tokenizer_2, c.text_encoder_2, prompt, c.crop_start, "cpu")
            ids, _ = _ids(c.tokenizer, prompt, c.crop_start)
            assert emb.bytes_read - before == len(torch.unique(ids)) * row       # each distinct token once
            theirs = encode_llama(c.tokenizer, ref, prompt, c.crop_start, "cpu")
            assert ours.llama.dtype == dt and torch.equal(ours.llama, theirs[0]), prompt
            assert torch.equal(ours.mask, theirs[1]) and ours.truncated == theirs[2]
    vocab = ref.config.vocab_size
    for ids in (torch.arange(vocab).flip(0)[None], torch.tensor([[5, 5, 4, 6, vocab - 1], [0, 9, 8, 9, 5]]),
                torch.zeros((1, 0), dtype=torch.long)):                       # any order, repeats, no token at all
        assert torch.equal(emb(ids), ref.embed_tokens(ids))
    with pytest.raises(IndexError):
        emb(torch.tensor([[0, ref.config.vocab_size]]))


def test_a_deeper_llama_from_files_streams_and_matches_the_whole_one(tmp_path):
    _deep_llama(5).to(torch.bfloat16).save_pretrained(tmp_path / "text_encoder")
    llama = _load_role("text_encoder", tmp_path / "text_encoder", HUNYUAN.text_encoder)     # float16, as real
    pack = HostPack.of(llama)
    nominal, _ = _chunk_sizes("llama", _items(dict(TINY.tiny_configs["llama"], num_hidden_layers=5)), 2, files=True)
    assert len(pack.blocks) == 3 and nominal[0] == pack.rest.file_bytes == 0
    assert list(nominal[1:]) == [ch.nbytes for ch in pack.blocks]         # the UI's plan sees these chunks
    tok = build_llama_tokenizer()
    crop = template_crop_start(tok)
    ref = LlamaModel.from_pretrained(tmp_path / "text_encoder", dtype=torch.float16).eval()   # whole, as loaded
    cap_gb = (pack.rest.nbytes + pack.blocks[0].nbytes) / GIB + 2.0              # 2 GB text reserve
    with MemoryManager(device="cpu", cap_gb=cap_gb, plan_on_cpu=True).stage("text encoders",
                                                                           text_encoder=llama) as rec:
        ours = [encode_llama(tok, llama, p, crop, "cpu") for p in PROMPTS]
    assert "1/3 blocks" in rec.placement["text_encoder"]
    for prompt, (hidden, mask, cut) in zip(PROMPTS, ours):
        theirs = encode_llama(tok, ref, prompt, crop, "cpu")
        assert torch.equal(hidden, theirs[0]) and torch.equal(mask, theirs[1]) and cut == theirs[2]


def test_the_librarys_loader_is_trimmed_too(tmp_path):
    """Files that do not match the class exactly fall back to from_pretrained: that Llama is trimmed as well."""
    folder = tmp_path / "text_encoder"
    _deep_llama(4).save_pretrained(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["layers.0.input_layernorm.weight"]                       # from_pretrained makes it again (ones)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    llama = _load_role("text_encoder", folder, HUNYUAN.text_encoder)
    assert getattr(llama, TRIMMED_ATTR) and len(llama.layers) == 2
    assert isinstance(llama.norm, torch.nn.Identity) and isinstance(llama.embed_tokens, torch.nn.Embedding)


# ---- the UI's nominal plan ----------------------------------------------------------------------------------------
def test_the_nominal_llama_is_the_trimmed_one():
    cfg = dict(REAL_LLAMA_CONFIG)
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    layer = 2 * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h)                        # float16 bytes of one layer
    saved = 2 * v * h + LLAMA_SKIP_LAYERS * layer + 2 * h                          # embedding, 2 layers, norm
    plain, fp8 = _chunk_sizes("llama", REAL_LLAMA_CONFIG, 2, files=True)
    assert len(plain) == 1 + cfg["num_hidden_layers"] - LLAMA_SKIP_LAYERS and plain[0] == 0
    assert set(plain[1:]) == {layer} and sum(plain) + saved == (2 * v * h + 32 * layer + 2 * h)
    assert saved == 1_923_653_632 and len(fp8) == len(plain)                    # 1.92 GB less to read per job

    text = next(m for m in nominal_models(HUNYUAN, "original", 20, 6, "cuda") if m.name == "text_encoder")
    assert text.nbytes == sum(plain) and sum(text.file_bytes) == sum(plain)
    tiny = next(m for m in nominal_models(TINY, "original", 20, 6, "cuda") if m.name == "text_encoder")
    trimmed = trim_llama(build_tiny_llama(TINY))                                 # the tiny preset keeps its table
    assert len(tiny.chunk_bytes) == 2 and sum(tiny.chunk_bytes) == sum(_align(p.numel() * 4)
                                                                        for p in trimmed.parameters())
    for preset in (HUNYUAN, TINY):
        plan = nominal_plan(preset, "original", 20, 6, "cuda", host_ram_gb=32)
        assert plan.model("text_encoder").nbytes == (text if preset is HUNYUAN else tiny).nbytes

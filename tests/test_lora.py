"""LoRAs: every key format of tiny LoRA files for the tiny transformer, applied (resident and streamed) equals the
hand merge; strength 0 is no LoRA; two LoRAs add; bad files are refused naming the file and the key; a job with a
LoRA records it and leaves the next job's weights as they were."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import save_file

from common.errors import InputError
from common.units import GIB
from configs.lora import LORA
from memory.hostpack import HostPack
from memory.manager import MemoryManager
from pipeline import lora
from tests.conftest import make_image
from tests.lora_helpers import (
    RANK,
    WRITERS,
    merged_by_hand,
    weights_in_stage,
    write_comfy,
    write_diffusers,
    write_musubi,
)


@pytest.fixture(scope="module")
def tr(tiny_original):
    return tiny_original.transformer


def _close(state, expected, tol=1e-5):
    assert state.keys() == expected.keys()
    worst = max(float((state[k] - expected[k]).abs().max()) for k in state)
    assert worst <= tol, worst


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_each_key_format_applied_equals_the_hand_merge(tr, tmp_path, fmt):
    path, expected = WRITERS[fmt](tr, tmp_path / f"{fmt}.safetensors")
    before = {k: v.clone() for k, v in tr.state_dict().items()}
    loras = lora.load_set(f"{path.name}:0.7", tmp_path, tr)
    assert sorted(loras.loras[0].factors) == sorted(expected)
    _close(weights_in_stage(tr, loras), merged_by_hand(tr, [(expected, 0.7)]))
    assert any(float((merged_by_hand(tr, [(expected, 0.7)])[k] - before[k]).abs().max()) > 1e-3 for k in before)
    _close(dict(tr.state_dict()), before, 0.0)             # the host copy never changed


def test_strength_zero_is_no_lora_and_two_loras_add(tr, tmp_path):
    a, ea = write_diffusers(tr, tmp_path / "a.safetensors")
    b, eb = write_comfy(tr, tmp_path / "b.safetensors")
    plain = weights_in_stage(tr, lora.LoraSet())
    zero = weights_in_stage(tr, lora.load_set("a.safetensors:0", tmp_path, tr))
    _close(zero, plain, 0.0)
    both = weights_in_stage(tr, lora.load_set("a.safetensors:0.5, b.safetensors:-1.5", tmp_path, tr))
    _close(both, merged_by_hand(tr, [(ea, 0.5), (eb, -1.5)]))


def test_streamed_blocks_get_the_lora_too(tiny_original, tmp_path):
    """Under a cap that streams blocks (plan_on_cpu), the transformer's output with a LoRA equals the output of a
    copy whose weights were merged by hand and which runs fully resident."""
    import copy

    from diffusers import HunyuanVideoFramepackTransformer3DModel

    from tests.model_helpers import step_inputs, two_steps

    cfg = {k: v for k, v in tiny_original.transformer.config.items() if not k.startswith("_")}
    cfg.update(num_layers=2, num_single_layers=2)
    torch.manual_seed(3)
    deep = HunyuanVideoFramepackTransformer3DModel(**cfg).eval().requires_grad_(False)
    by_hand = copy.deepcopy(deep)
    path, expected = write_musubi(deep, tmp_path / "m.safetensors")
    by_hand.load_state_dict(merged_by_hand(deep, [(expected, 1.3)]))
    inputs = step_inputs(deep)
    reference = two_steps(by_hand, inputs)
    plain = two_steps(deep, inputs)
    pack = HostPack.of(deep)
    mm = MemoryManager(device="cpu", cap_gb=(pack.rest.nbytes + pack.blocks[0].nbytes) / GIB, preserved_gb=0,
                       plan_on_cpu=True)
    lora.attach(deep, lora.load_set([f"{path}:1.3"], None, deep))
    try:
        with mm.stage("transformer", transformer=deep) as rec:
            streamed = two_steps(deep, inputs)
    finally:
        lora.detach(deep)
    assert "1/4 blocks" in rec.placement["transformer"]                # 3 of 4 blocks streamed
    assert all(float((s - r).abs().max()) <= 1e-5 for s, r in zip(streamed, reference))
    assert not all(torch.allclose(s, p) for s, p in zip(streamed, plain))
    with mm.stage("transformer", transformer=deep):                   # detached: the plain output again, exactly
        again = two_steps(deep, inputs)
    assert all(torch.equal(a, p) for a, p in zip(again, plain))


# ---- the setting ------------------------------------------------------------------------------------------------
def test_parse_spec():
    assert lora.parse_spec("") == ()
    assert lora.parse_spec("a.safetensors:0.8, b.safetensors\nc/d.safetensors:-2") == (
        lora.LoraChoice("a.safetensors", 0.8), lora.LoraChoice("b.safetensors", 1.0),
        lora.LoraChoice("c/d.safetensors", -2.0))
    assert lora.parse_spec(["a.safetensors:1.5", "b.safetensors:0"])[1].strength == 0.0
    assert lora.format_spec(lora.parse_spec("a.safetensors:0.80")) == "a.safetensors:0.8"
    with pytest.raises(InputError, match=r"LoRAs: 'a.safetensors:2.5': strength 2.5 is out of range.*-2 and 2"):
        lora.parse_spec("a.safetensors:2.5")
    with pytest.raises(InputError, match="'x' is not a strength"):
        lora.parse_spec("a.safetensors:x")
    assert lora.parse_spec(None) == () and lora.parse_spec(r"C:\\loras\\a.safetensors")[0].strength == 1.0
    assert lora.parse_spec("dir/v1:2/a.safetensors") == (lora.LoraChoice("dir/v1:2/a.safetensors", 1.0),)
    for bad, words in [(5, "text like 'style.safetensors:0.8' is required, got int"),
                       ("a" * (LORA.max_text_chars + 1), f"{LORA.max_text_chars + 1} characters; the setting may "
                                                         f"have at most {LORA.max_text_chars}"),
                       (", ".join(f"l{i}.safetensors" for i in range(LORA.max_count + 1)),
                        f"{LORA.max_count + 1} LoRAs; at most {LORA.max_count} at once"),
                       ("a.safetensors:nan", "strength nan is out of range")]:
        with pytest.raises(InputError) as e:
            lora.parse_spec(bad)
        assert e.value.field == "LoRAs" and words in e.value.message, e.value.message


def test_a_clients_loras_are_names_of_the_folders_list(tmp_path):
    (tmp_path / "style.safetensors").write_bytes(b"")
    lora.names_only("style.safetensors:0.5")
    lora.listed_only("style.safetensors:0.5", tmp_path)
    for path in ("../style.safetensors", "/etc/style.safetensors", "~/style.safetensors", "sub\\style.safetensors"):
        with pytest.raises(InputError, match="name a file of the LoRA folder .* not a path"):
            lora.names_only(path)
    with pytest.raises(InputError) as e:
        lora.listed_only("other.safetensors", tmp_path)
    assert "'other.safetensors' is not in the LoRA folder's list" in e.value.message
    assert str(tmp_path) not in str(e.value)                   # a client never sees the folder's path


# ---- refusals -----------------------------------------------------------------------------------------------------
def _refused(tr, folder, spec, *patterns):
    with pytest.raises(InputError) as e:
        lora.load_set(spec, folder, tr)
    text = str(e.value)
    assert text.startswith("LoRAs: ")
    for p in patterns:
        assert p in text, text
    return text


def test_refusals_name_the_file_and_the_first_bad_key(tr, tmp_path):
    h = tr.config.num_attention_heads * tr.config.attention_head_dim
    save_file({"transformer.transformer_blocks.0.attn.to_qq.lora_A.weight": torch.zeros(RANK, h),
               "transformer.transformer_blocks.0.attn.to_qq.lora_B.weight": torch.zeros(h, RANK)},
              str(tmp_path / "nomatch.safetensors"))
    _refused(tr, tmp_path, "nomatch.safetensors", "nomatch.safetensors", "transformer.transformer_blocks.0.attn.to_qq",
             "matches no layer")
    save_file({"lora_unet_transformer_blocks_0_attn_to_k.lora_down.weight": torch.zeros(RANK, h + 8),
               "lora_unet_transformer_blocks_0_attn_to_k.lora_up.weight": torch.zeros(h, RANK)},
              str(tmp_path / "shape.safetensors"))
    _refused(tr, tmp_path, "shape.safetensors:0.5", "shape.safetensors",
             "lora_unet_transformer_blocks_0_attn_to_k.lora_down.weight", f"({h}×{h})", "wrong rank or shape")
    save_file({"transformer.proj_out.lora_A.weight": torch.zeros(RANK, h),
               "transformer.proj_out.lora_B.weight": torch.zeros(tr.proj_out.out_features, RANK + 1)},
              str(tmp_path / "rank.safetensors"))
    _refused(tr, tmp_path, "rank.safetensors", "rank.safetensors", "transformer.proj_out.lora_A.weight",
             "rank-r")
    save_file({"transformer.proj_out.lora_A.weight": torch.zeros(RANK, h)}, str(tmp_path / "half.safetensors"))
    _refused(tr, tmp_path, "half.safetensors", "half.safetensors", "no matching lora_B")
    save_file({"transformer.proj_out.weight": torch.zeros(2, 2)}, str(tmp_path / "full.safetensors"))
    _refused(tr, tmp_path, "full.safetensors", "full.safetensors", "'transformer.proj_out.weight' is not a LoRA")
    (tmp_path / "old.ckpt").write_bytes(b"\x80\x04 pickle")
    _refused(tr, tmp_path, "old.ckpt", "old.ckpt is not a .safetensors file")
    (tmp_path / "fake.safetensors").write_bytes(b"this is not a safetensors file at all")
    _refused(tr, tmp_path, "fake.safetensors", "fake.safetensors is not a readable safetensors file")
    _refused(tr, tmp_path, "missing.safetensors", "missing.safetensors: not in the LoRA folder")


def test_size_limit(tr, tmp_path, monkeypatch):
    path, _ = write_diffusers(tr, tmp_path / "big.safetensors")
    with pytest.raises(InputError, match=r"big.safetensors is .* MB, over the 0 MB limit"):
        lora.read_file(path, max_mb=0)


def test_lora_files_lists_the_folder(tmp_path):
    (tmp_path / "b.safetensors").write_bytes(b"")
    (tmp_path / "a.SAFETENSORS").write_bytes(b"")
    (tmp_path / "c.ckpt").write_bytes(b"")
    assert lora.lora_files(tmp_path) == ["a.SAFETENSORS", "b.safetensors"]
    assert lora.lora_files(tmp_path / "none") == []


# ---- jobs ---------------------------------------------------------------------------------------------------------
def _request(**kw):
    from pipeline.request import Request

    return Request(image=make_image(64, 64), prompt="a cat", seconds=1.0, steps=2, seed=7, teacache=0.0, **kw)


def _frames(done):
    info = json.loads((done.job_dir / "job.json").read_text())
    return [s["frames_sha256"] for s in info["sections"]], info


def _run(tiny, tmp_path, loras, lora_dir):
    from pipeline.orchestrator import generate
    from pipeline.request import prepare

    prepared = prepare(_request(loras=loras), tiny.preset.default_resolution)
    events = list(generate(prepared, tiny, MemoryManager(device="cpu"), outputs=tmp_path / "out",
                           lora_dir=lora_dir))
    return events[-1]


def test_a_job_with_a_lora_records_it_and_the_next_job_is_as_before(tiny_original, tmp_path):
    from pipeline.events import Done, Failed

    folder = tmp_path / "loras"
    folder.mkdir()
    path, _ = write_comfy(tiny_original.transformer, folder / "style.safetensors")
    plain_before = _run(tiny_original, tmp_path, "", folder)
    with_lora = _run(tiny_original, tmp_path, "style.safetensors:1.5", folder)
    assert isinstance(with_lora, Done), with_lora
    frames_plain, _ = _frames(plain_before)
    frames_lora, info = _frames(with_lora)
    assert frames_lora != frames_plain                                   # the LoRA changed the video
    assert info["settings"]["loras"] == "style.safetensors:1.5"          # what "Reuse settings" restores
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert info["loras"] == [{"file": "style.safetensors", "sha256": digest, "strength": 1.5,
                              "layers": 8}]
    refused = _run(tiny_original, tmp_path, "style.safetensors:1, missing.safetensors", folder)
    assert isinstance(refused, Failed) and refused.job_dir is None       # refused before a job folder
    assert refused.message.startswith("LoRAs: missing.safetensors: not in the LoRA folder")
    after = _run(tiny_original, tmp_path, "", folder)
    assert _frames(after)[0] == frames_plain                             # nothing left applied
    assert _frames(with_lora)[0] == _frames(_run(tiny_original, tmp_path, "style.safetensors:1.5", folder))[0]


def test_cli_lora_option_repeats(tmp_path):
    from cli.commands import build_parser, request_from_args

    args = build_parser().parse_args(["generate", "--image", "x.png", "--lora", "a.safetensors:0.8", "--lora",
                                      "b.safetensors:-1", "--lora-dir", str(tmp_path)])
    assert request_from_args(args).loras == "a.safetensors:0.8, b.safetensors:-1"
    assert args.lora_dir == tmp_path
    assert request_from_args(build_parser().parse_args(["generate", "--image", "x.png"])).loras == ""


def test_lora_step_benchmark_tiny(tmp_path):
    """benchmarks/lora_step.py end to end on the tiny preset (CPU): 0, 1 and 3 LoRAs through the streamed stage."""
    from benchmarks.lora_step import main

    out = tmp_path / "lora_step.json"
    main(["--tiny", "--out", str(out), "--warmup", "0", "--steps", "1", "--rank", "4", "--variants", "merge,forward"])
    every = json.loads(out.read_text())["results"]
    assert [(r["loras"], r["variant"]) for r in every] == [(0, "-"), (1, "merge"), (1, "forward"), (3, "merge"),
                                                             (3, "forward")]
    # LoRA layers in the forward pass compute what the merge computes (float32 on the CPU: rounding only)
    assert all(r["max_abs_diff_vs_merge"] < 1e-4 for r in every if r["variant"] == "forward")
    results = [r for r in every if r["variant"] != "forward"]
    assert results[0]["x_no_lora"] == 1.0 and all(r["x_no_lora"] > 0 for r in results)
    assert results[0]["max_abs_diff_vs_no_lora"] == 0.0
    assert results[1]["max_abs_diff_vs_no_lora"] > 0 and results[2]["lora_layers"] == 3 * results[1]["lora_layers"]
    assert all("1/2 blocks" in r["placement"] for r in results)          # one block streamed


def test_picker_adds_to_the_box_and_reuse_restores_it():
    from ui import panel_lora
    from ui import settings as st

    assert panel_lora.added("a.safetensors", 0.8, "") == "a.safetensors:0.8"
    assert panel_lora.added("b.safetensors", -1, "a.safetensors:0.8") == "a.safetensors:0.8, b.safetensors:-1"
    assert panel_lora.added("a.safetensors", 2, "a.safetensors:0.8, b.safetensors") == \
        "b.safetensors:1, a.safetensors:2"                                  # a LoRA once, at its new strength
    assert panel_lora.added(None, 1, "a.safetensors:1") == "a.safetensors:1"
    assert panel_lora.added("c.safetensors", 1, "a:x") == "a:x, c.safetensors:1"   # left for the job to explain
    values = st.values_from_settings({"loras": "style.safetensors:-0.75", "prompt": "p"}, 64)
    assert values["loras"] == "style.safetensors:-0.75"
    assert "loras" in st.CONTROLS                                          # a parameter of the /video API


def test_fp8_host_storage_gets_the_lora_on_its_loaded_weights(tr, tmp_path):
    """With fp8 host storage the LoRA is added to the loaded (dequantized) weight: loaded with − loaded without =
    the hand delta; the fp8 host copy is untouched."""
    import copy

    model = copy.deepcopy(tr)
    model.__dict__.pop("_steadyframe_host_pack", None)
    pack = HostPack.of(model)
    for c in pack.chunks:
        c.set_fp8(True)
    assert pack.fp8
    hosts = [c.host.clone() for c in pack.chunks]
    path, expected = write_diffusers(model, tmp_path / "a.safetensors")
    plain = weights_in_stage(model, lora.LoraSet())
    with_lora = weights_in_stage(model, lora.load_set(f"{path}:-1.25", None, model))
    for name in plain:
        module = name.removesuffix(".weight")
        want = -1.25 * expected[module] if name.endswith(".weight") and module in expected else 0 * plain[name]
        assert float((with_lora[name] - plain[name] - want).abs().max()) <= 1e-5, name
    assert all(torch.equal(h, c.host) for h, c in zip(hosts, pack.chunks))


def test_a_missing_file_says_where_it_was_looked_for_without_a_path_nobody_gave(tmp_path, monkeypatch):
    """Issue 33 item 10: "looked in loras" (the default folder, relative) said nothing about where that was; issue 41:
    the folder's absolute path is not in the message (it reaches clients of the app; the user did not give it).
    The message names the field, the folder as configured, and what to do."""
    monkeypatch.chdir(tmp_path)
    for folder, where in (("loras", "not in the default LoRA folder, 'loras' in the current folder"),
                          (tmp_path / "mine", f"not in the LoRA folder, --lora-dir {tmp_path / 'mine'}")):
        with pytest.raises(InputError) as e:
            lora.resolve("missing.safetensors", folder)
        assert e.value.field == "LoRAs" and str(e.value).startswith(f"LoRAs: missing.safetensors: {where}; put the "
                                                                    f"file there, name its folder with --lora-dir")
    with pytest.raises(InputError) as e:
        lora.resolve("missing.safetensors", "loras")
    assert str(tmp_path) not in str(e.value)                  # the default's absolute path: never
    with pytest.raises(InputError) as e:
        lora.resolve("sub/missing.safetensors", "loras")      # a path: as its user gave it
    assert str(e.value) == ("LoRAs: sub/missing.safetensors: no such file; check the path (a file of the LoRA "
                            "folder is named by its file name alone)")


def test_more_files_that_are_no_lora_for_this_transformer_are_refused(tr, tmp_path):
    h = tr.config.num_attention_heads * tr.config.attention_head_dim
    save_file({}, str(tmp_path / "empty.safetensors"))
    _refused(tr, tmp_path, "empty.safetensors", "empty.safetensors holds no tensors")
    save_file({"lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight": torch.zeros(RANK, 8)},
              str(tmp_path / "text.safetensors"))
    _refused(tr, tmp_path, "text.safetensors", "text.safetensors holds nothing for the transformer: its 1 key(s)")
    save_file({"transformer.x_embedder.proj.lora_A.weight": torch.zeros(RANK, h),
               "transformer.x_embedder.proj.lora_B.weight": torch.zeros(h, RANK)}, str(tmp_path / "conv.safetensors"))
    _refused(tr, tmp_path, "conv.safetensors", "x_embedder.proj is a Conv3d, only Linear layers take a LoRA here")
    _refused(tr, tmp_path, str(tmp_path / "sub" / "gone.safetensors"), "gone.safetensors: no such file; check the path")
    assert "the default LoRA folder, 'loras' in the current folder" in _refused(tr, None, "gone.safetensors")
    (tmp_path / "big.safetensors").write_bytes(b"\x00" * 2048)
    with pytest.raises(InputError, match=r"big.safetensors is 0 MB, over the 0 MB limit for a LoRA \(is it a full"):
        lora.read_file(tmp_path / "big.safetensors", max_mb=0)

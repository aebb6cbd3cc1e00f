"""benchmarks/vae_decode.py runs end to end on the CPU with the tiny VAE (its logic; the numbers come from a GPU)."""
from __future__ import annotations

import importlib
import json


def test_vae_decode_benchmark_tiny(tmp_path, capsys):
    bench = importlib.import_module("benchmarks.vae_decode")
    out = tmp_path / "vae.json"
    assert bench.main(["--tiny", "--out", str(out), "--reps", "1", "--shapes", "1",
                       "--rows", "channels_last;tiling whole frames, 16-frame temporal tiles"]) == 0
    result = json.loads(out.read_text())
    (shape,) = result["shapes"].values()
    rows = {r["row"]: r for r in shape["rows"]}
    assert list(rows) == ["baseline", "channels_last", "tiling whole frames, 16-frame temporal tiles"]
    assert rows["baseline"]["max_abs"] == 0 and rows["baseline"]["x_baseline"] == 1
    assert rows["channels_last"]["max_abs"] < 1e-3 and rows["channels_last"]["s"] > 0
    assert rows["tiling whole frames, 16-frame temporal tiles"]["max_abs"] > 0       # tiling does change pixels
    assert result["profile"] and abs(sum(p["share"] for p in result["profile"]) - 1) < 0.2
    groups = {g["group"]: g["share"] for g in result["profile_groups"]}
    assert abs(sum(groups.values()) - 1) < 1e-6 and max(groups, key=groups.get) == "convolution"
    assert {"normalization", "activation"} <= set(groups)        # the decoder's GroupNorm and SiLU are seen apart
    assert result["profile_of"]["shape"] == "first section"      # the last (only) shape run is the one profiled
    assert "| baseline | whole frames, all frames at once |" in capsys.readouterr().out


def test_profile_groups_name_the_kernels_of_a_gpu_decode():
    bench = importlib.import_module("benchmarks.vae_decode")
    assert bench.op_group("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_ndhwc") == "convolution"
    assert bench.op_group("aten::cudnn_convolution") == "convolution"
    assert bench.op_group("fmha_cutlassF_f16_aligned_64x64_rf_sm80") == "attention"
    assert bench.op_group("aten::native_group_norm") == "normalization"
    assert bench.op_group("aten::replication_pad3d") == "copies, padding, concatenation"
    assert bench.op_group("aten::upsample_nearest3d") == "upsampling"
    assert bench.op_group("something else") == "other"

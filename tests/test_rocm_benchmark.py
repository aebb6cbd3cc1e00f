"""benchmarks/conv_tiers.py runs end to end on CPU with the tiny VAE (its logic; the numbers come from a GPU)."""

from __future__ import annotations

import importlib
import json

import pytest

pytest.importorskip("diffusers")


def test_conv_tiers_small_cpu(tmp_path, capsys):
    bench = importlib.import_module("benchmarks.conv_tiers")
    out = tmp_path / "bench.json"
    assert bench.main(["--device", "cpu", "--small", "--out", str(out), "--tiers", "1,3", "--cpu",
                       "--reps", "1", "--warmup", "0", "--budget-s", "2", "--e2e"]) == 0
    result = json.loads(out.read_text())
    assert result["tiers"] == [1, 3, 5] and result["distinct_shapes"] == len(result["shapes"]) > 10
    assert result["conv_calls"] == sum(r["count"] for r in result["shapes"])
    timed = [r for r in result["shapes"] if r["ms"]]
    assert timed and all(set(r["ms"]) == {"1", "3", "5"} for r in timed)
    assert all(err < 1e-4 for r in timed for err in r["max_rel_err"].values())
    skipped = [r for r in result["shapes"] if not r["ms"]]
    assert all(r["errors"]["all"] == "skipped: time budget" for r in skipped)
    assert result["totals"]["shapes_timed"] == len(timed) and set(result["totals"]["relative"]) == {"1", "3", "5"}
    e2e = result["e2e"]
    # (on the CPU tier 1's float32 conv3d is oneDNN's and the plain decode's PyTorch's small-input path: rocm/tiers.py)
    assert e2e["tier1_max_abs_diff"] < 1e-4 and e2e["tier3_max_abs_diff"] < 1e-3 and "tier5_s" not in e2e
    table = capsys.readouterr().out
    assert "| conv input -> weight | calls | tier 1 ms | tier 3 x | tier 5 x |" in table
    assert "whole tiled decode" in table

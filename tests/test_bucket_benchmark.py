"""benchmarks/bucket_step.py runs end to end on a CPU with the tiny preset (its logic; the numbers come from a GPU)."""
from __future__ import annotations

import json


def test_bucket_step_tiny_streams_under_its_cap_and_matches_resident(tmp_path, capsys):
    from benchmarks.bucket_step import main

    out = tmp_path / "bucket_step.json"
    results = main(["--tiny", "--warmup", "0", "--steps", "1", "--out", str(out)])
    resident, capped = results
    assert resident["config"] == "resident" and "cap, streamed" in capped["config"]
    assert capped["streamed_bytes"] > 0 and resident["streamed_bytes"] == 0        # the capped run streamed
    assert capped["within_cap"] is True and capped["x_resident"] > 0
    assert capped["max_abs_diff"] < 1e-5                                           # the same step, streamed
    saved = json.loads(out.read_text())
    assert saved["meta"]["bucket"] == [128, 128] and saved["meta"]["tokens"] > 0
    printed = capsys.readouterr().out
    assert "| resident | " in printed and "× resident" in printed and "≤ cap" in printed

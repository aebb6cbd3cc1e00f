"""benchmarks/read_speed.py and benchmarks/vae_repeat.py run end to end on the CPU (their logic; the numbers come
from a GPU machine)."""
from __future__ import annotations

import importlib
import json


def test_read_speed_reads_the_whole_file_each_way(tmp_path, capsys):
    bench = importlib.import_module("benchmarks.read_speed")
    out = tmp_path / "rs.json"
    assert bench.main(["--make-gb", "0.03", "--dir", str(tmp_path), "--out", str(out), "--threads", "1,2",
                       "--piece-mb", "8"]) == 0
    result = json.loads(out.read_text())
    ways = {(r["way"], r["threads"]) for r in result["rows"]}
    assert {("buffered", 1), ("buffered", 2)} <= ways                   # O_DIRECT only where the file system allows
    assert all(r["s"] > 0 and r["gb_per_s"] > 0 for r in result["rows"])
    assert result["rows"][0]["x_one_thread"] == 1.0
    assert abs(result["file_gb"] - 0.03) < 0.001
    assert not list(tmp_path.glob("*.safetensors"))                      # the file it made is gone
    assert "| buffered | 2 |" in capsys.readouterr().out


def test_vae_repeat_gives_the_same_frames_on_the_cpu(tmp_path):
    bench = importlib.import_module("benchmarks.vae_repeat")
    out = tmp_path / "vr.json"
    assert bench.main(["--tiny", "--out", str(out)]) == 0
    rows = [r for s in json.loads(out.read_text())["shapes"].values() for r in s["rows"]]
    assert {r["variant"] for r in rows} == {"default", "deterministic"}
    for shape in json.loads(out.read_text())["shapes"].values():
        assert len({r["sha"] for r in shape["rows"]}) == 1               # the CPU's convolutions: one result
        assert all(r["max_levels"] == 0 for r in shape["rows"])
    frag = tmp_path / "frag.json"
    assert bench.main(["--tiny", "--fragment", "--out", str(frag)]) == 0
    cases = json.loads(frag.read_text())["fragment"]
    assert [c["case"] for c in cases] == ["clean (warm-up)", "clean", "fragmented", "clean again"]
    assert len({c["sha"] for c in cases}) == 1

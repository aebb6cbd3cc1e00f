"""fp8 attention's inputs in the compiled blocks: rocm/fp8_qkv.py's three Triton passes at the full-size step's
shapes, for a few launch settings, against the steps they replace run eagerly (issue 46).

    python3 benchmarks/fp8_qkv.py --out fp8_qkv.json          # an NVIDIA GPU with Triton; ~1 minute

For the single-stream blocks (q, k, v as one product each over 17,500 video + 985 prompt tokens × 3,072: the pieces
are views) and the double-stream blocks (the video's and the prompt's products apart), each launch setting
(`rocm.fp8_qkv.Setting`: the default, then one or two fields changed) is timed with CUDA events (median of `--reps`),
beside the floor at the GPU's memory bandwidth (`--bandwidth`, 4.8 TB/s on an H200: q, k, v read twice and the e4m3
tensors written once). Each setting's e4m3 values are compared with diffusers' norm and rotary steps followed by
`rocm.fp8_attention.quantize` for FlashAttention-3, eagerly: the count of values that differ. `--best` writes the
fastest setting for `benchmarks/compiled.py step --qkv-setting`.
"""
from __future__ import annotations

import argparse
import json
import logging
import types
from dataclasses import asdict
from pathlib import Path

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

import torch  # noqa: E402

from benchmarks.attention import timed  # noqa: E402
from rocm import fp8_attention as fa  # noqa: E402
from rocm import fp8_qkv  # noqa: E402

log = logging.getLogger("benchmarks.fp8_qkv")
VIDEO, PROMPT, HEADS, D = 17_500, 985, 24, 128
SETTINGS = (   # rocm/fp8_qkv.py's default first, then a few fields changed each
    fp8_qkv.SETTING,
    fp8_qkv.Setting(stats_bt=16, stats_warps=8, stages=1, stats_heads=1, bt=16, warps=2, heads=1, heads_first=False,
                    chunks_at_once=1),                  # the launches before 2026-12-03's third session
    fp8_qkv.Setting(stats_warps=2),
    fp8_qkv.Setting(stats_bt=4, stats_warps=2),
    fp8_qkv.Setting(stats_bt=4),
    fp8_qkv.Setting(stats_heads=1),
    fp8_qkv.Setting(stats_heads=1, stats_warps=2),
    fp8_qkv.Setting(stats_bt=4, stats_heads=4, stats_warps=2),
    fp8_qkv.Setting(stats_bt=16),
    fp8_qkv.Setting(stages=2),
    fp8_qkv.Setting(stages=4),
    fp8_qkv.Setting(rows=512),
    fp8_qkv.Setting(rows=128),
    fp8_qkv.Setting(bt=4, warps=2),
    fp8_qkv.Setting(warps=2),
    fp8_qkv.Setting(bt=16),
    fp8_qkv.Setting(heads=4, warps=2),
    fp8_qkv.Setting(warps=8),
)
QUANTIZE_FIELDS = ("bt", "warps", "heads")      # the quantization pass's; the others are the statistics pass's


class _Skipped:
    """A kernel that is not launched (`launch` with the statistics and scales passes alone)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _inputs(single: bool, dev: torch.device):
    g = torch.Generator(device=dev).manual_seed(0)

    def r(*shape, shift=0.0):
        return (torch.randn(*shape, generator=g, device=dev) + shift).bfloat16()

    if single:
        q, k, v = (r(1, VIDEO + PROMPT, HEADS * D, shift=s) for s in (0.0, 2.0, 0.5))
        pieces = [q[:, :VIDEO], q[:, VIDEO:], k[:, :VIDEO], k[:, VIDEO:], v[:, :VIDEO], v[:, VIDEO:]]
        wq, wk = r(D, shift=1.0), r(D, shift=1.0)
        weights = [wq, wq, wk, wk]
    else:
        pieces = [r(1, n, HEADS * D, shift=s) for s in (0.0, 2.0, 0.5) for n in (VIDEO, PROMPT)]
        weights = [r(D, shift=1.0) for _ in range(4)]
    angles = torch.rand(VIDEO, D // 2, generator=g, device=dev) * 6
    cos = angles.cos().repeat_interleave(2, dim=1).contiguous()
    sin = angles.sin().repeat_interleave(2, dim=1).contiguous()
    return pieces, weights, cos, sin


def reference(pieces, weights, cos, sin, eps):
    """What the passes compute, the way the code before them did (the tests' reference too): diffusers' RMSNorm and `apply_rotary_emb` on the
    video's tokens, the tokens joined, then `fp8_attention.quantize(..., kernel=FA3)`; in the passes' output forms."""
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.normalization import RMSNorm

    heads = pieces[0].shape[-1] // D

    def norm(x, w):
        m = RMSNorm(D, eps=eps).to(device=w.device, dtype=w.dtype).requires_grad_(False)
        m.weight.data.copy_(w)
        return m(x.unflatten(2, (heads, D)))

    def qk(a, b, wa, wb):
        return torch.cat([apply_rotary_emb(norm(a, wa), (cos, sin), sequence_dim=1), norm(b, wb)], dim=1)

    q, k = qk(pieces[0], pieces[1], weights[0], weights[1]), qk(pieces[2], pieces[3], weights[2], weights[3])
    v = torch.cat([pieces[4], pieces[5]], dim=1).unflatten(2, (heads, D))
    with torch.no_grad():
        z = fa.quantize(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kernel=fa.FA3)
    b = q.shape[0]
    descales = torch.stack([t.reshape(b * heads) for t in (z.descale_q, z.descale_k, z.descale_v)], dim=1)
    scales = torch.cat([descales, 1.0 / descales], dim=1)
    k_mean = k.float().mean(dim=1).reshape(b * heads, D)
    means = torch.stack([k_mean, z.v_mean.reshape(b * heads, D)], dim=1)
    return (*(t.transpose(1, 2).contiguous() for t in (z.q, z.k, z.v)), scales, means)


def _fastest(rows: list[dict]) -> fp8_qkv.Setting:
    """The default with the statistics pass's fields of the fastest statistics and scales passes (over both block
    kinds) and the quantization pass's fields of the fastest quantization. Each pass is judged on the mean of every
    row with its fields: a setting that changes only the other pass's fields measures this pass again (the same
    kernels timed twice in one run differed by up to 10 %: the mean of many rows, not one row, picks)."""
    fields = list(asdict(fp8_qkv.SETTING))

    def best(own: list[str], key: str) -> dict:
        times: dict[tuple, list[float]] = {}
        for r in rows:
            times.setdefault(tuple(r[k] for k in own), []).append(r[key])
        winner = min(times, key=lambda t: sum(times[t]) / len(times[t]))
        return dict(zip(own, winner))

    stats = best([k for k in fields if k not in QUANTIZE_FIELDS], "statistics and scales ms")
    quant = best(list(QUANTIZE_FIELDS), "quantization ms")
    return fp8_qkv.Setting(**stats, **quant)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--bandwidth", type=float, default=4.8e12)
    ap.add_argument("--best", type=Path, help="write the fastest setting here (summed over both block kinds), for "
                                              "`compiled.py step --qkv-setting`")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    dev = torch.device("cuda")
    assert fp8_qkv.prepare(), "Triton does not import here"
    kernels = fp8_qkv.prepared()
    n = VIDEO + PROMPT
    floor_ms = (3 * n * HEADS * D * 2 * 2 + 3 * n * HEADS * D) / args.bandwidth * 1e3
    out = [torch.empty((1, n, HEADS, D), dtype=fa.FP8, device=dev) for _ in range(3)]
    first = types.SimpleNamespace(stats=kernels.stats, scales=kernels.scales, quantize=_Skipped())
    with torch.no_grad():
        cases = {}
        for single in (True, False):
            pieces, weights, cos, sin = _inputs(single, dev)
            cases["single-stream" if single else "double-stream"] = (
                (pieces, weights, cos, sin), reference(pieces, weights, cos, sin, 1e-6)[:3])

        def measure(setting, block):
            inputs, want = cases[block]

            def run(k=kernels):
                return fp8_qkv.launch(k, *inputs, 1e-6, *out, setting=setting)
            ms = timed(run, args.reps)
            first_ms = timed(lambda: run(first), args.reps)
            run()
            row = {"block": block, **asdict(setting), "ms": round(ms, 4),
                   "statistics and scales ms": round(first_ms, 4), "quantization ms": round(ms - first_ms, 4),
                   "floor_ms": round(floor_ms, 4), "GB/s": round((3 * n * HEADS * D * 5) / ms / 1e6, 1),
                   "values that differ from eager": [int((a.view(torch.uint8) != b.view(torch.uint8)).sum())
                                                     for a, b in zip(out, want)]}
            log.info("%s", row)
            return row

        rows = [measure(setting, block) for block in cases for setting in SETTINGS]
        best = _fastest(rows)               # the fastest of each pass together, measured as well
        rows += [measure(best, block) for block in cases]
    if args.best:
        args.best.write_text(json.dumps(asdict(best)))
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "rows": rows}, indent=1))
    print(f"fastest: {best}")
    print("| block | setting (changed from the default) | ms | statistics + scales ms | quantization ms | floor ms | "
          "values differing from eager |")
    print("|---|---|---:|---:|---:|---:|---|")
    base = asdict(fp8_qkv.SETTING)
    for r in rows:
        changed = ", ".join(f"{k}={r[k]}" for k in base if r[k] != base[k]) or "default"
        print(f"| {r['block']} | {changed} | {r['ms']:.3f} | {r['statistics and scales ms']:.3f} | "
              f"{r['quantization ms']:.3f} | {r['floor_ms']:.3f} | {r['values that differ from eager']} |")


if __name__ == "__main__":
    main()

"""benchmarks/hostram.py's report: the configurations' results side by side, and fp8's error on the job's latents."""
from __future__ import annotations

import json
from pathlib import Path

from common.units import GIB


def fp8_latent_error(a: dict, c: dict, window: int = 9) -> dict | None:
    """Relative error of (c)'s latents against (a)'s: the whole job, and the first section generated (in the original
    mode it is the last `window` latent frames of the video)."""
    from safetensors.torch import load_file

    from memory.fp8 import relative_error

    paths = [Path(r.get("job_dir") or "") / "latents.safetensors" for r in (a, c)]
    if not all(p.is_file() for p in paths):
        return None
    ra, rc = (load_file(str(p))["real"] for p in paths)
    return {"job": relative_error(rc, ra), "first_section": relative_error(rc[:, :, -window:], ra[:, :, -window:])}


def _gib(x) -> str:
    return f"{x / GIB:.2f}" if isinstance(x, (int, float)) and x else "–"


def report(results: Path) -> dict:
    """Combine RESULTS/<config>.json into one table (printed, and saved with the rows as RESULTS/hostram.json)."""
    from benchmarks.hostram import CONFIGS

    rows = {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))
            if p.stem in CONFIGS and p.stem != "fp8step"}
    fp8 = json.loads((results / "fp8step.json").read_text()) if (results / "fp8step.json").exists() else None
    a = rows.get("a", {})
    lines = ["| config | status | job s | × (a) | whole run s (× (a)) | load s | host arrange s | "
             "first step s (since start) | text enc s | "
             "VAE enc s | image enc s | transformer s | VAE dec s | cgroup memory.peak GiB | RSS peak anon / file "
             "GiB | pinned GiB | VRAM peak GiB | read from files in the job GiB | video = (a) |",
             "|" + "---|" * 19]
    for name, r in rows.items():
        t = r.get("timings") or {}
        peak = r.get("memory.peak")
        ratio = (f"{r['job_s'] / a['job_s']:.3f}" if r.get("job_s") and a.get("job_s") and name != "cold" else "–")
        same = ("–" if name in ("a", "cold") or not r.get("video_sha256")
                else "yes" if r.get("video_sha256") == a.get("video_sha256")
                else "no (fp8)" if r.get("storage") == "fp8" else "NO")
        rss = r.get("rss_peak") or {}
        # the child process from its start to its exit: models loaded, host arranged, the job, the end (a CLI run)
        run = (f"{r['wall_s']:.1f} ({r['wall_s'] / a['wall_s']:.3f})" if r.get("wall_s") and a.get("wall_s")
               and name != "cold" else "–")
        host = r.get("host") or {}
        lines.append(
            f"| {name}: {r.get('what', '')} | {r.get('status')} | {r.get('job_s', 0):.1f} | {ratio} | {run} | "
            f"{r.get('load_s', 0):.1f} | {r.get('arrange_s', 0):.1f} | "
            f"{(r.get('first_step_since_start_s') or 0):.1f} | {t.get('text encoders', 0):.2f} | "
            f"{t.get('VAE encode', 0):.2f} | {t.get('image encoder', 0):.2f} | {t.get('transformer', 0):.1f} | "
            f"{t.get('VAE decode', 0):.1f} | {_gib(int(peak)) if peak else '– (' + str(r.get('cgroup_note', 'none')) + ')'} | "
            f"{_gib(rss.get('anon'))} / {_gib(rss.get('file'))} | {_gib(host.get('pinned_peak_bytes'))} | "
            f"{_gib(r.get('vram_peak_reserved'))} | {_gib(r.get('file_bytes_in_stages'))} | {same} |")
    errors = fp8_latent_error(a, rows["c"]) if "a" in rows and "c" in rows else None
    summary = {"rows": rows, "fp8_step": fp8, "fp8_latents": errors, "table": "\n".join(lines)}
    print(summary["table"])
    if fp8:
        print(f"\nfp8 vs bf16, one transformer step: relative error {fp8['step_relative_error']:.4f}")
    if errors:
        print(f"fp8 (c) vs bf16 (a) latents: whole job {errors['job']:.4f}, first section {errors['first_section']:.4f}")
    for name, r in rows.items():
        for i, rep in enumerate(r.get("repeats") or [], 2):
            print(f"\n({name}) job {i}: {rep['job_s']:.1f} s, stages {', '.join(dict.fromkeys(rep['stages']))}; "
                  f"same video as job 1: {rep['video_sha256'] == r.get('video_sha256')}; same latents: "
                  f"{rep.get('latents_sha256') == r.get('latents_sha256')}; same VAE decode tilings and retries: "
                  f"{rep.get('vae_tilings') == r.get('vae_tilings')}")
    for name, r in rows.items():
        plan = (r.get("host") or {}).get("plan") or {}
        if plan.get("text"):
            print(f"\n({name}) host plan: {plan['text']}")
    (results / "hostram.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary

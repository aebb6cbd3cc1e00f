"""The text form of ``python -m rocm doctor``'s report (``rocm.doctor.collect`` gathers it)."""

from __future__ import annotations


def _verdict_lines(ver: dict) -> list[str]:
    lines = ["", f"verdicts     {ver['cache_dir']}" + (f"   (reset: removed {len(ver['reset'])} file(s))"
                                                         if ver.get("reset") is not None else "")]
    if not ver["files"]:
        lines.append("  none recorded")
    for f in ver["files"]:
        build = f["build"]
        what = ", ".join(f"{k} {v}" for k, v in build.items() if v) or f["file"]
        if not f["readable"]:
            lines.append(f"    {f['file']}: unreadable or of an older format, ignored (--reset removes it)")
            continue
        lines.append(f"  {'*' if f['current'] else ' '} {f['count']:>4} verdicts  {what}"
                     + ("   <- this machine now" if f["current"] else "   (another build: not used)"))
        if f["current"]:
            for key, v in f["verdicts"].items():
                if v["failed"] or v["unconfirmed_timeouts"]:
                    failed = "; ".join(f"tier {t}: {r[:70]}" for t, r in v["failed"].items())
                    again = (f"  [timeouts re-probed next run: tiers {v['unconfirmed_timeouts']}]"
                             if v["unconfirmed_timeouts"] else "")
                    lines.append(f"      {key.split('|')[0]} {key.split('|')[1]} -> tier {v['ok_tier']}  "
                                 f"({failed}){again}")
    lines.append("  clear them with: python -m rocm doctor --reset")
    lines.append("fallbacks    features that failed here and are not tried again (rocm/fallbacks.py)")
    for f in ver.get("fallbacks", []):
        lines.append(f"  {'*' if f['current'] else ' '} {f['feature']}: off on {f['machine']}"
                     + ("   <- this machine now" if f["current"] else "") + f"\n      failed with: {f['error']}")
    if not ver.get("fallbacks"):
        lines.append("  none (compiled blocks and fp8 compute are tried where they apply)")
    else:
        lines.append("  forget them with: python -m rocm doctor --reset (the next start tries again)")
    return lines


def _attention_lines(att: dict) -> list[str]:
    lines = ["", "attention    " + ", ".join(f"{k}={v}" for k, v in att.items()
                                           if k not in ("check", "aotriton", "fp8_attention"))]
    if att.get("aotriton"):
        lines.append(f"  note: {att['aotriton']}")
    if att.get("fp8_attention"):
        lines.append(f"  fp8 attention: {att['fp8_attention']}")
    check = att.get("check", {})
    if not check.get("ran"):
        lines.append(f"  timing skipped: {check.get('reason', '-')}")
        return lines
    shape = check["shape"]
    lines.append(f"  timing on {check['device']}: {shape['dtype']}, {shape['heads']} heads x {shape['tokens']} "
                 f"tokens x head {shape['head_dim']} (median of {check['reps']})")
    for case in check["cases"]:
        label = "with mask" if case["masked"] else "no mask  "
        cells = [f"{name} {b['ms']:.2f} ms" if b["ran"] else f"{name} -" for name, b in case["backends"].items()]
        lines.append(f"  {label}  " + "   ".join(cells))
        lines.append(f"             the app uses: {case['app']['uses']} ({case['app']['ms']:.2f} ms)")
        for name, b in case["backends"].items():
            if not b["ran"]:
                lines.append(f"             {name}: {b['reason'][:150]}")
    return lines


def _probe_lines(probe: dict) -> list[str]:
    lines = [""]
    if not probe["ran"]:
        return lines + [f"probe table  skipped: {probe['reason']}"]
    lines.append(f"probe table  ({probe['device']}, timeout {probe['timeout_s']:g} s per conv"
                 f"{', small shapes' if probe['small_shapes'] else ''}; writes no verdicts)")
    for tier, why in probe.get("skipped_tiers", {}).items():
        lines.append(f"  tier {tier}  skipped: {why}")
    for row in probe["rows"]:
        lines.append(f"  tier {row['tier']}  {row['outcome']:<12} {row['elapsed_s']:>8.3f} s  {row['shape']}"
                     + (f"  [{row['message'][:80]}]" if row["outcome"] != "ok" else ""))
    return lines


def _gpu_lines(rep: dict) -> list[str]:
    """The GPU, its architecture and the convolution library's switches: only where there is a GPU."""
    gpu = rep["gpu"]
    if rep["backend"] == "cpu":
        return ["GPU          none: PyTorch sees no CUDA or ROCm device; everything runs on the CPU"]
    mem = f"{gpu['total_memory_gib']} GiB" if gpu["total_memory_gib"] else "-"
    return [f"GPU          {gpu['name']}   arch {gpu['arch']}   family {gpu['family'] or '-'}   VRAM {mem}",
            f"arch from    {gpu['arch_source']}",
            f"KFD arch     {rep['kfd_arch'] or '-'} (read before torch, from /sys/class/kfd"
            + ("" if rep["kfd_arch"] else ": none there on Windows, WSL2 or in a container") + f")   driver "
            f"{gpu['driver'] or '-'}",
            *(["AMD GPUs     " + ", ".join(f"{g['arch']}{' (integrated)' if g['integrated'] else ''}"
                                         f"{' <- the jobs run here' if g['used'] else ''}"
                                         for g in gpu.get("kfd_gpus", []))
               + (f"   selected by {gpu['visible_devices']}" if gpu.get("visible_devices") else "")]
              if len(gpu.get("kfd_gpus", [])) > 1 else []),
            f"wheel arches {', '.join(gpu['wheel_arches']) or '-'}   has kernels for "
            f"{gpu['reported_arch'] or gpu['arch']}"
            + (" (the ISA the override loads)" if gpu["reported_arch"] and gpu["reported_arch"] != gpu["arch"] else "")
            + f": {'-' if gpu['wheel_has_arch'] is None else gpu['wheel_has_arch']}",
            f"torch        cudnn/MIOpen enabled {rep['torch_settings']['cudnn_enabled']}, benchmark "
            f"{rep['torch_settings']['cudnn_benchmark']}"]


def _conv_lines(rep: dict) -> list[str]:
    plan = rep["conv_plan"]
    if rep["backend"] == "cpu":
        return ["", "conv tiers   not used without a GPU: convolutions run on the CPU as they are"]
    lines = ["", f"conv tiers   {plan['tiers']} (conv3d from tier {plan['conv3d_first_tier']}; "
                 f"MIOpen/cuDNN inside tier 3: {plan['vendor_in_decomposition']})"]
    lines += [f"  {t}: {n}" for t, n in plan["tier_names"].items()] + [f"  note: {n}" for n in plan["notes"]]
    return lines + [f"  verdicts: {plan['verdict_file']}"]


def render_text(rep: dict) -> str:
    env = rep["environment"]
    lines = ["SteadyFrame rocm doctor", "",
             f"backend      {rep['backend']}" + ("  (no GPU)" if rep["backend"] == "cpu" else ""),
             f"torch        {rep['torch']}   HIP {rep['hip'] or '-'}   CUDA {rep['cuda'] or '-'}   "
             + (f"MIOpen {rep.get('miopen')}" if rep["backend"] == "rocm" else f"cuDNN {rep.get('cudnn')}"),
             f"python       {rep['python']} on {rep['platform']}", *_gpu_lines(rep), "",
             f"environment profile: {env['profile'] or 'none (not ROCm)'}"
             + (f", applied {env['profile_applied']}" if env.get("profile_applied") else "")]
    lines += [f"  note       {n}" for n in env.get("profile_notes", [])]
    lines += [f"  would set  {k}={v}" for k, v in env["profile_would_set"].items()]
    lines += [f"  yours      {k}={v}" for k, v in env["user_kept"].items()]
    lines += [f"  env        {k}={v}" for k, v in env["relevant"].items()]
    lines += [f"  {w['severity']:<7}    {w['variable']}={w['value']}: {w['message']}" for w in env["warnings"]]
    if not env["warnings"]:
        lines.append("  no warnings")
    lines += _conv_lines(rep)
    lines += _verdict_lines(rep["verdicts"]) + _attention_lines(rep["attention"]) + _probe_lines(rep["probe"])
    lines += ["", "recommendations"] + [f"  - {r}" for r in rep["recommendations"]]
    return "\n".join(lines)

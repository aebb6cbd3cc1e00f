"""After a job: the memory timeline (a PNG drawn with PIL: allocated and reserved VRAM over time, host RSS, the cap,
stages shaded and named) and the per-stage timings table (Markdown)."""
from __future__ import annotations

import math
from collections import OrderedDict

from PIL import Image, ImageDraw, ImageFont

from common.units import GIB as GB  # memory figures are binary (common/units.py)

SIZE = (960, 340)
MARGIN = dict(left=64, right=24, top=76, bottom=44)
COLORS = {"allocated": (37, 99, 235), "reserved": (234, 88, 12), "host RSS": (120, 120, 120), "cap": (220, 38, 38)}
STAGE_FILLS = ((239, 246, 255), (254, 243, 231))
SHORT = {"text encoders": "text", "VAE encode": "enc", "image encoder": "img", "transformer": "DiT",
         "VAE decode": "dec"}


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = max(span, 1e-9) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _series(timeline, records) -> dict[str, list[tuple[float, float]]]:
    """(time, GB) points per series: every snapshot, and each stage's peak held over the whole stage (drawn as
    steps, a stage shows as a plateau at its peak)."""
    pts: dict[str, list[tuple[float, float]]] = {"allocated": [], "reserved": [], "host RSS": []}
    for s in timeline:
        pts["allocated"].append((s.time, s.allocated / GB))
        pts["reserved"].append((s.time, s.reserved / GB))
        pts["host RSS"].append((s.time, s.host_rss / GB))
    for r in records:
        if r.ended and (r.peak_allocated or r.peak_reserved):
            eps = (r.ended - r.started) * 1e-3
            for t in (r.started + eps, r.ended - eps):
                pts["allocated"].append((t, r.peak_allocated / GB))
                pts["reserved"].append((t, r.peak_reserved / GB))
    return {k: sorted(v) for k, v in pts.items()}


def memory_timeline_image(timeline, records, device: str = "cpu") -> Image.Image:
    """The memory timeline of one job. Works with an empty timeline (draws the frame and a note)."""
    w, h = SIZE
    img = Image.new("RGB", SIZE, "white")
    d = ImageDraw.Draw(img)
    font, small = _font(13), _font(11)
    x0, x1, y0, y1 = MARGIN["left"], w - MARGIN["right"], MARGIN["top"], h - MARGIN["bottom"]
    gpu = not str(device).startswith("cpu")
    cap = next((s.cap for s in timeline if getattr(s, "cap", None)), None)
    title = (f"Memory timeline on {device}" + (f" (cap {cap / GB:.1f} GB)" if cap else "") if gpu else
             "Memory timeline: CPU run, no GPU memory is used (VRAM stays 0); host RSS shown")
    d.text((x0, 6), title, fill="black", font=font)

    series = _series(timeline, records)
    times = [t for pts in series.values() for t, _ in pts] + [r.started for r in records] + \
        [r.ended for r in records if r.ended]
    if not times:
        d.rectangle((x0, y0, x1, y1), outline=(180, 180, 180))
        d.text((x0 + 10, y0 + 10), "no memory snapshots were recorded", fill="gray", font=font)
        return img
    t0, t_end = min(times), max(times)
    span_t = max(t_end - t0, 1e-3)
    top = max([v for pts in series.values() for _, v in pts] + [cap / GB if cap else 0.0, 0.1]) * 1.1

    def px(t: float) -> float:
        return x0 + (t - t0) / span_t * (x1 - x0)

    def py(v: float) -> float:
        return y1 - v / top * (y1 - y0)

    # stages: shaded spans, names on two rows above the plot where they fit
    label_end = [float("-inf"), float("-inf")]
    for i, r in enumerate(records):
        a, b = px(r.started), px(r.ended or t_end)
        d.rectangle((a, y0, max(b, a + 1), y1), fill=STAGE_FILLS[i % 2])
        d.line((a, y0 - 4, a, y1), fill=(200, 200, 200))
        for name in (r.name, SHORT.get(r.name, r.name[:4])):
            width = d.textlength(name, font=small)
            row = next((k for k in (0, 1) if a + 2 > label_end[k] + 4), None)
            if row is not None and (width < b - a + 30 or name != r.name):
                d.text((a + 2, y0 - 28 + 13 * row), name, fill=(90, 90, 90), font=small)
                label_end[row] = a + 2 + width
                break
    d.rectangle((x0, y0, x1, y1), outline=(160, 160, 160))
    # axes
    step = _nice_step(top)
    v = 0.0
    while v <= top:
        d.line((x0 - 4, py(v), x0, py(v)), fill="black")
        d.text((4, py(v) - 7), f"{v:g} GB", fill="black", font=small)
        v += step
    tstep = _nice_step(span_t, 8)
    t = 0.0
    while t <= span_t + 1e-9:
        d.line((px(t0 + t), y1, px(t0 + t), y1 + 4), fill="black")
        d.text((px(t0 + t) - 8, y1 + 6), f"{t:g}", fill="black", font=small)
        t += tstep
    d.text(((x0 + x1) / 2 - 30, h - 18), "seconds since the job started", fill="black", font=small)
    if cap:
        d.line((x0, py(cap / GB), x1, py(cap / GB)), fill=COLORS["cap"], width=1)
    # series, drawn as steps
    for name, pts in series.items():
        if len(pts) < 1:
            continue
        line = []
        for i, (t, v) in enumerate(pts):
            if i:
                line.append((px(t), py(pts[i - 1][1])))
            line.append((px(t), py(v)))
        width = 1 if name == "host RSS" else 2
        if len(line) > 1:
            d.line(line, fill=COLORS[name], width=width)
    # legend
    lx = x0 + 8
    names = ["allocated", "reserved", "host RSS"] + (["cap"] if cap else [])
    for name in names:
        d.line((lx, 32, lx + 18, 32), fill=COLORS[name], width=3)
        d.text((lx + 22, 25), name, fill="black", font=small)
        lx += 30 + d.textlength(name, font=small) + 12
    d.text((lx + 10, 25), "(GPU lines: each stage at its peak)", fill=(110, 110, 110), font=small)
    return img


def timings_markdown(records, timings: dict | None = None) -> str:
    """Per-stage table: runs, seconds, load/unload seconds and peaks, plus the job's own timings."""
    rows: OrderedDict[str, dict] = OrderedDict()
    for r in records:
        row = rows.setdefault(r.name, {"runs": 0, "s": 0.0, "load": 0.0, "unload": 0.0, "pa": 0, "pr": 0})
        row["runs"] += 1
        row["s"] += max((r.ended or r.started) - r.started, 0.0)
        row["load"] += r.load_s
        row["unload"] += r.unload_s
        row["pa"] = max(row["pa"], r.peak_allocated)
        row["pr"] = max(row["pr"], r.peak_reserved)
    lines = ["| stage | runs | seconds | load s | unload s | peak allocated | peak reserved |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['runs']} | {row['s']:.2f} | {row['load']:.2f} | {row['unload']:.2f} | "
                     f"{row['pa'] / GB:.2f} GB | {row['pr'] / GB:.2f} GB |")
    for name, seconds in (timings or {}).items():
        if name not in rows:
            lines.append(f"| {name} |  | {float(seconds):.2f} |  |  |  |  |")
    if len(lines) == 2:
        return "_No stage ran._"
    return "\n".join(lines)

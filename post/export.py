"""Exports of a post job's video (its H.264 final.mp4) through FFmpeg's own encoders and filters (PyAV): MP4 H.265,
WebM VP9, GIF with its own palette (palettegen, then paletteuse), the frames as a zip of PNGs, one frame as a PNG
(a new job's start image). Frames are streamed from the file to the encoder (one at a time; the GIF reads the file
twice: once for its palette, once to write), so the memory does not grow with the video. The job's settings go
into the file's metadata where the format holds it (MP4, WebM); GIF and PNG have no place for them."""
from __future__ import annotations

import io
import json
import zipfile
from fractions import Fraction
from pathlib import Path

from common.files import atomic_path

SUFFIX = {"h265": ".mp4", "webm": ".webm", "gif": ".gif", "zip": ".zip", "frame": ".png"}
NAME = {"h265": "final-h265.mp4", "webm": "final.webm", "gif": "final.gif", "zip": "frames.zip", "frame": "frame.png"}
GIF_FPS_MAX = 50            # browsers show GIF frames at most this often (2/100 s delays)


def _frames(path: Path):
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate = stream.average_rate or Fraction(30)
        for frame in container.decode(stream):
            yield frame, rate


def _encode(path: Path, out: Path, codec: str, options: dict, fmt: str, metadata: dict, pix_fmt: str) -> None:
    import av

    with atomic_path(out) as tmp, av.open(str(tmp), mode="w", format=fmt) as container:
        for key, value in metadata.items():
            container.metadata[key] = value if isinstance(value, str) else json.dumps(value)
        stream = None
        for frame, rate in _frames(path):
            if stream is None:
                stream = container.add_stream(codec, rate=rate)
                stream.width, stream.height, stream.pix_fmt = frame.width, frame.height, pix_fmt
                stream.options = options
            frame.pts = None
            for packet in stream.encode(frame.reformat(format=pix_fmt)):
                container.mux(packet)
        for packet in stream.encode() if stream is not None else ():
            container.mux(packet)


def _gif(path: Path, out: Path) -> None:
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate = min(stream.average_rate or Fraction(30), Fraction(GIF_FPS_MAX))
        graph = av.filter.Graph()
        src = graph.add_buffer(template=stream)
        gen = graph.add("palettegen", "stats_mode=full")
        sink = graph.add("buffersink")
        src.link_to(gen)
        gen.link_to(sink)
        graph.configure()
        for frame in container.decode(stream):
            graph.push(frame)
        graph.push(None)
        palette = graph.pull()
    with av.open(str(path)) as container, atomic_path(out) as tmp, \
            av.open(str(tmp), mode="w", format="gif") as gif:
        stream = container.streams.video[0]
        graph = av.filter.Graph()
        video = graph.add_buffer(template=stream)
        pal = graph.add_buffer(width=palette.width, height=palette.height, format=palette.format.name,
                               time_base=Fraction(1, 1000))
        fps = graph.add("fps", f"fps={rate}")
        use = graph.add("paletteuse", "dither=bayer:bayer_scale=3")
        sink = graph.add("buffersink")
        video.link_to(fps)
        fps.link_to(use, 0, 0)
        pal.link_to(use, 0, 1)
        use.link_to(sink)
        graph.configure()
        palette.pts = 0
        pal.push(palette)
        pal.push(None)
        out_stream = gif.add_stream("gif", rate=rate)
        out_stream.width, out_stream.height, out_stream.pix_fmt = stream.width, stream.height, "pal8"

        def drain():
            while True:
                try:
                    frame = sink.pull()
                except (av.error.BlockingIOError, av.error.EOFError):
                    return
                frame.pts = None
                for packet in out_stream.encode(frame):
                    gif.mux(packet)

        for frame in container.decode(stream):
            video.push(frame)
            drain()
        video.push(None)
        drain()
        for packet in out_stream.encode():
            gif.mux(packet)


def _png(frame) -> bytes:
    buf = io.BytesIO()
    frame.to_image().save(buf, format="PNG")
    return buf.getvalue()


def _zip(path: Path, out: Path) -> None:
    with atomic_path(out) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for n, (frame, _) in enumerate(_frames(path)):
            info = zipfile.ZipInfo(f"frame_{n:05d}.png", date_time=(1980, 1, 1, 0, 0, 0))
            z.writestr(info, _png(frame))


def _one_frame(path: Path, out: Path, index: int) -> None:
    chosen = None
    for n, (frame, _) in enumerate(_frames(path)):
        if index < 0 or n <= index:
            chosen = frame
        if index >= 0 and n >= index:
            break
    with atomic_path(out) as tmp:
        tmp.write_bytes(_png(chosen))


def export(video: Path, kind: str, folder: Path, *, metadata: dict | None = None, frame: int = -1,
           crf: int = 16) -> Path:
    """Write the export `kind` of `video` into `folder`; its path."""
    out = Path(folder) / NAME[kind]
    meta = metadata or {}
    if kind == "h265":
        _encode(video, out, "libx265", {"crf": str(crf + 4), "preset": "medium", "x265-params": "log-level=error"},
                "mp4", meta, "yuv420p")
    elif kind == "webm":
        _encode(video, out, "libvpx-vp9", {"crf": str(min(63, crf + 15)), "b": "0", "row-mt": "1",
                                           "deadline": "good", "cpu-used": "4"}, "webm", meta, "yuv420p")
    elif kind == "gif":
        _gif(video, out)
    elif kind == "zip":
        _zip(video, out)
    elif kind == "frame":
        _one_frame(video, out, frame)
    else:
        raise ValueError(f"unknown export {kind!r}")
    return out

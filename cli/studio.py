"""`python -m cli studio FILE`: a FramePack-Studio job's settings (its metadata .json, or the PNG it saves with the
metadata in its text chunks: jobs/studio.py reads and maps them) printed as one line for `python -m cli batch`;
what could not be mapped goes to stderr.

    python -m cli studio STUDIO.json --image start.png >> jobs.jsonl
    python -m cli studio STUDIO.png >> jobs.jsonl          # the PNG is Studio's start image: used as the image
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.errors import InputError
from jobs.studio import StudioImport, import_file, job_values


def batch_line(imported: StudioImport, image=None, end_image=None) -> str:
    """One line for `python -m cli batch` (the settings and the images' absolute paths; jobs.studio.job_values)."""
    files = {name: Path(path).resolve() if path else None for name, path in (("image", image),
                                                                              ("end_image", end_image))}
    return json.dumps(job_values(imported, files), ensure_ascii=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cli studio",
        description="Print a FramePack-Studio job's settings (its metadata .json, or the PNG it saves with the "
                    "metadata in its text chunks) as one line for `python -m cli batch`; what could not be mapped "
                    "goes to stderr.")
    parser.add_argument("file", type=Path, help="Studio's <job_id>.json or <job_id>.png")
    parser.add_argument("--image", type=Path, help="the start image (default: the PNG itself, when a PNG is given)")
    parser.add_argument("--end-image", type=Path, help="the end image (original mode)")
    args = parser.parse_args(argv)
    try:
        imported = import_file(args.file)
    except InputError as e:
        print(e.cli_text(), file=sys.stderr)
        return 2
    image = args.image or (args.file if imported.kind == "png" and not imported.text_to_video else None)
    for line in imported.report():
        print(f"not mapped or changed: {line}", file=sys.stderr)
    if image is not None and imported.text_to_video:
        print("note: Studio's job had no start image; with --image it starts from that image instead",
              file=sys.stderr)
    elif image is None and not imported.text_to_video:
        print("note: no start image; add --image start.png (the batch refuses a line without one)", file=sys.stderr)
    print(batch_line(imported, image, args.end_image))
    return 0


if __name__ == "__main__":
    sys.exit(main())

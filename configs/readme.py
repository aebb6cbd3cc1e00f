"""The README's table of controls, made from configs/controls.py: `python -m configs.readme` prints it,
`python -m configs.readme --write README.md` puts it into the README (tests/test_controls.py fails when the
README's copy is out of date)."""
from __future__ import annotations

import argparse
from pathlib import Path

from configs.controls import CONTROLS, Control, control


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def _value(c: Control, value) -> str:
    if isinstance(value, float) and value.is_integer() and c.kind == "float":
        return f"{value:g}"
    return str(value)


def markdown_table(controls: tuple[Control, ...] = CONTROLS) -> str:
    """The README's table of controls."""
    rows = ["| control | API / job.json key | command line | default | range | meaning |", "|---|---|---|---|---|---|"]
    for c in controls:
        where = c.label + (" (*Advanced*)" if c.advanced else "") if c.widget else "not on the page"
        option = f"`{c.option}`" if c.option else "—"
        if c.cli_aliases:
            option += " (alias " + ", ".join(f"`{a}`" for a in c.cli_aliases) + ")"
        if c.required:
            unless = f" unless `{control(c.required_unless).option}`" if c.required_unless else ""
            option += f" (required{unless})"
        if c.default_text:
            default = c.default_text
        elif c.is_file:
            default = "—"
        elif c.kind == "text":
            default = "empty" if c.default == "" else f"`{c.default}`"
        else:
            default = f"`{_value(c, c.default)}`"
        if c.kind == "choice":
            span = ", ".join(f"`{v}`" for v in c.choices)
        elif c.limits:
            lo, hi = c.limits
            span = (f"{_value(c, lo)}–{_value(c, hi)}" if hi < 10**6 else f"≥ {_value(c, lo)}")
            if c.multiple_of:
                span += f", multiple of {c.multiple_of}"
        else:
            span = "—"
        rows.append(f"| {_cell(where)} | `{c.name}` | {_cell(option)} | {_cell(default)} | {_cell(span)} | "
                    f"{_cell(c.help)} |")
    return "\n".join(rows)


README_BEGIN = ("<!-- controls table: generated from configs/controls.py "
                "(python -m configs.readme --write README.md) -->")
README_END = "<!-- end of the controls table -->"


def readme_with_table(text: str, controls: tuple[Control, ...] = CONTROLS) -> str:
    """`text` (the README) with its table of controls replaced by the current one."""
    head, begin, rest = text.partition(README_BEGIN)
    _, end, tail = rest.partition(README_END)
    if not begin or not end:
        raise ValueError(f"the README has no {README_BEGIN!r} ... {README_END!r} block")
    return f"{head}{README_BEGIN}\n{markdown_table(controls)}\n{README_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m configs.readme", description="Print the README's table of "
                                "controls, or write it into a README.")
    p.add_argument("--write", type=Path, metavar="README", help="replace the table in this file")
    args = p.parse_args(argv)
    if args.write is None:
        print(markdown_table())
        return 0
    old = args.write.read_text("utf-8")
    new = readme_with_table(old)
    if new != old:
        args.write.write_text(new, "utf-8")
    print(f"{args.write}: {'updated' if new != old else 'up to date'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

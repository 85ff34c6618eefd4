"""Generated blocks in the results files: a script's tables between
`<!-- generated: NAME -->` and `<!-- /generated -->`, the prose around them the file's own."""

from __future__ import annotations

import re
from pathlib import Path


def write_into(path: Path, blocks: dict[str, str]) -> None:
    """Replace each named block's body; a name the file lacks is an error, nothing written."""
    text = path.read_text()
    for name, body in blocks.items():
        pat = re.compile(rf"(<!-- generated: {re.escape(name)} -->\n).*?(<!-- /generated -->)",
                         re.S)
        if not pat.search(text):
            raise SystemExit(f"{path}: no block '<!-- generated: {name} -->'")
        text = pat.sub(lambda m, b=body: m.group(1) + b.rstrip() + "\n" + m.group(2), text,
                       count=1)
    path.write_text(text)


def cpu_name() -> str:
    """The machine's CPU model, for the line that says where a benchmark ran."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def show_or_write(text: str, into: Path | None, block: str) -> None:
    """A benchmark's --report: print its markdown, or with --into write it into `block`."""
    if into is None:
        print(text)
    else:
        write_into(into, {block: text})

"""Where a benchmark's results go: results.json, results.md, and the terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def publish(out: Path, data: dict[str, Any], table: str, *, as_json: bool, where: str) -> None:
    """Write ``data`` and ``table`` under ``out``; print the table (or ``data`` with --json).

    ``where`` tells the reader what else ``out`` holds (artifacts, logs).
    """
    (out / "results.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    (out / "results.md").write_text(table + "\n", encoding="utf-8")
    if as_json:
        print(json.dumps(data))
        return
    print()
    print(table)
    print(f"\nraw data: {out}/results.json; {where}")

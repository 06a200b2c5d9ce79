"""Writing results of benchmarks and experiments: JSON (with the command), CSV and a Markdown table."""
from __future__ import annotations

import csv
import json
import os
import sys
import time


def write_results(out_dir: str, stem: str, rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Write ``<stem>.json``, ``<stem>.csv`` and ``<stem>.md`` into ``out_dir``; return the table.

    ``columns`` are ``(title, row key, format)`` for the Markdown table, e.g.
    ``("rounds/s", "rounds_per_s", "{:.1f}")``; the JSON and CSV keep every field.
    """
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
                   "rows": rows}, f, indent=1)
    flat = [k for k in rows[0] if not isinstance(rows[0][k], (list, dict))] if rows else []
    with open(os.path.join(out_dir, f"{stem}.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=flat, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(title for title, _, _ in columns) + " |",
             "| " + " | ".join("---" if fmt == "{}" else "---:" for _, _, fmt in columns) + " |"]
    for r in rows:
        lines.append("| " + " | ".join("-" if r.get(key) is None else fmt.format(r[key])
                                       for _, key, fmt in columns) + " |")
    table = "\n".join(lines)
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(table + "\n")
    return table

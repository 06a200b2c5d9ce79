"""Writing results of benchmarks and experiments: JSON (with the command), CSV and a Markdown table."""
from __future__ import annotations

import csv
import json
import os
import sys
import time

from .experiments import median_of


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


def new_figure(size=(7, 4.5)):
    """A matplotlib figure and its axes, drawn without a display."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=size)


def save_figure(fig, ax, title: str, path: str, legend_size=8) -> None:
    """Title, grid and legend; write the PNG and free the figure."""
    import matplotlib.pyplot as plt
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: what the x keys of an accuracy curve's points are: (for a launched run, for a virtual one)
AXES = {"time_s": ("training time (s)", "virtual time (s)"),
        "step": ("iterations of worker 0 (its steps)",
                 "iterations per worker (the job's pushes / n)")}


def plot_accuracy(runs, rows, cluster, path, title, x="time_s", error=False):
    """Worker 0's (a virtual run: the servers') test accuracy, or top-1 error, of each
    paradigm's median trial against ``x`` (a key of the curve's points)."""
    fig, ax = new_figure()
    for row in rows:
        if row["cluster"] != cluster:
            continue
        run = median_of(runs, row)
        ax.plot([p[x] for p in run["curve"]],
                [1 - p["test_accuracy"] if error else p["test_accuracy"] for p in run["curve"]],
                marker=".", label=row["paradigm"])
    virtual = any(r.get("virtual") for r in runs if r["cluster"] == cluster)
    ax.set_xlabel(AXES.get(x, (x, x))[virtual])
    whose = "servers' weights" if virtual else "worker 0"
    ax.set_ylabel(f"top-1 test error ({whose})" if error else f"test accuracy ({whose})")
    lows = [p["test_accuracy"] for r in runs if r["cluster"] == cluster for p in r["curve"]]
    if lows:
        low = max(0.0, sorted(lows)[len(lows) // 10] - 0.02)
        ax.set_ylim(*((0.0, 1.0 - low) if error else (low, 1.0)))
    save_figure(fig, ax, title, path, legend_size=None)

"""The lab's output: the rows as a text table, and a PNG of replicas and latency over
time."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynamo.planner.lab.replay import Run
from dynamo.planner.lab.settings import Settings

COLUMNS = (
    ("config", "config", "{}"),
    ("replicas", "replicas", "{}"),
    ("SLA", "sla_attainment", "{:.3f}"),
    ("GPU h", "gpu_hours", "{:.3f}"),
    ("goodput/GPU h", "goodput_per_gpu", "{:.0f}"),
    ("vs peak", "vs_static_peak", "{:.2f}x"),
    ("TTFT p90 ms", "ttft_p90_ms", "{:.0f}"),
    ("ITL p90 ms", "itl_p90_ms", "{:.1f}"),
    ("scale events", "scale_events", "{}"),
    ("reversals", "reversals", "{}"),
    ("failed at down", "failed_at_scale_down", "{}"),
    ("recovery s", "recovery_s", "{:.0f}"),
    ("to min s", "to_min_s", "{:.0f}"),
)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as an aligned text table (disaggregated rows: each pool's most replicas
    in a ``prefill+decode`` column)."""
    columns = list(COLUMNS)
    if any("pools" in r for r in rows):
        columns.insert(2, ("prefill+decode", "pools", "{}"))
    table = [[title for title, _, _ in columns]]
    table += [["-" if r.get(key) is None else fmt.format(r[key]) for _, key, fmt in columns] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in table
    )


def plot(runs: dict[str, Run], settings: Settings, path: Path, title: str) -> bool:
    """Replicas, arrival rate and p90 latencies over time, per configuration, as a PNG;
    False (with a message) without matplotlib."""
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        print("matplotlib is not installed: no plot written (pip install matplotlib)", file=sys.stderr)
        return False
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for name, run in runs.items():
        ts = [p[0] / 60 for p in run.timeline]
        axes[0].step(ts, [p[1] for p in run.timeline], where="pre", label=name)  # over the window to each t
        if run.pools and len(run.pools[0]) > 1:  # disaggregated: each pool too, dotted
            for role in run.pools[0]:
                axes[0].step(ts, [p[role] for p in run.pools], where="pre", ls=":", lw=0.8, label=f"{name} {role}")
        axes[1].plot(ts, [p[3] if p[3] is not None else float("nan") for p in run.timeline], label=name, lw=0.8)
        axes[2].plot(ts, [p[4] if p[4] is not None else float("nan") for p in run.timeline], label=name, lw=0.8)
    first = next(iter(runs.values()), None)
    if first is not None:
        rate = axes[0].twinx()
        rate.plot([p[0] / 60 for p in first.timeline], [p[2] for p in first.timeline], color="grey", lw=0.6, alpha=0.6)
        rate.set_ylabel("arrivals/s (grey)")
    axes[1].axhline(settings.ttft_ms, color="black", ls="--", lw=0.8)
    axes[2].axhline(settings.itl_ms, color="black", ls="--", lw=0.8)
    axes[0].set_ylabel("replicas")
    axes[1].set_ylabel("p90 TTFT ms")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("p90 ITL ms")
    axes[2].set_xlabel("simulated minutes")
    axes[0].set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True

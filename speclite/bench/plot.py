"""The bench's PNG: speedup vs k per method, and acceptance per draft position (matplotlib, extra `plot`)."""

from __future__ import annotations

import re
from pathlib import Path

from speclite.errors import SpecliteError


def require_matplotlib() -> None:
    """Fail before any model is loaded when --plot cannot be honoured."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SpecliteError("--plot needs matplotlib: pip install 'speclite[plot]'") from None


def check_plot_path(path: Path, json_path: Path | None) -> None:
    """Before the run: a file kind matplotlib writes (by its suffix), not the --json file too."""
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in kinds:
        raise SpecliteError(f"--plot {path}: name a .png file (or one of {', '.join(sorted(kinds))})")
    if json_path is not None and json_path.resolve() == path.resolve():
        raise SpecliteError(f"--plot {path} is the --json file too: name two files")


def speedup_series(rows: list[dict], auto_x: float) -> dict[str, list[tuple[float, float]]]:
    """(k, speedup) points per line of the plot: one per method, token map, quant and policy (a row's label
    without its k); k = auto drawn at auto_x."""
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r["method"] not in ("plain", "naive"):
            name = re.sub(r" k=\S+", "", r["label"])
            series.setdefault(name, []).append((auto_x if r["k"] == "auto" else r["k"], r["speedup"]))
    return series


def save_plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_k, ax_pos) = plt.subplots(1, 2, figsize=(12, 4.5))
    numeric_ks = sorted({r["k"] for r in rows if isinstance(r["k"], int) and r["method"] not in ("plain", "naive")})
    auto_x = (max(numeric_ks) + 1) if numeric_ks else 1
    for name, points in speedup_series(rows, auto_x).items():
        xs, ys = zip(*sorted(points))
        ax_k.plot(xs, ys, marker="o", label=name)
    ax_k.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="plain")
    ticks = numeric_ks + (["auto"] if any(r["k"] == "auto" for r in rows) else [])
    ax_k.set_xticks([auto_x if t == "auto" else t for t in ticks], [str(t) for t in ticks])
    ax_k.set_xlabel("k (drafts per iteration)")
    ax_k.set_ylabel("speedup over plain decoding")
    ax_k.set_title("speedup vs k")
    ax_k.legend(fontsize=8)

    for r in rows:
        acc = r["accepted_per_position"]
        if acc:
            ax_pos.plot(range(1, len(acc) + 1), acc, marker=".", label=r["label"])
    ax_pos.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_pos.set_ylim(0, 1.05)
    ax_pos.set_xlabel("draft position")
    ax_pos.set_ylabel("accepted fraction")
    ax_pos.set_title("acceptance per draft position")
    if ax_pos.lines:
        ax_pos.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise SpecliteError(f"cannot write --plot {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)

"""Raw runs -> per-configuration figures (the JSON) -> Rich tables.

tokens/s of a configuration in one repeat = its output tokens over all prompts / the summed wall
time of those runs; the reported figure is the median over repeats. speedup = that median / the
median of plain decoding with the same target quant, from the same run.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from rich.markup import escape
from rich.table import Table

from speclite.bench.runner import RunRecord
from speclite.bench.sweep import BenchConfig
from speclite.engine.stats import add_part, parts_summary


def _tps_per_repeat(runs: list[RunRecord]) -> list[float]:
    by_repeat: dict[int, list[RunRecord]] = defaultdict(list)
    for r in runs:
        by_repeat[r.repeat].append(r)
    out = []
    for repeat in sorted(by_repeat):
        rs = by_repeat[repeat]
        seconds = sum(r.elapsed_s for r in rs)
        out.append(sum(r.output_tokens for r in rs) / seconds if seconds > 0 else 0.0)
    return out


def _acceptance(runs: list[RunRecord]) -> dict:
    proposed_at: list[int] = []
    accepted_at: list[int] = []
    for r in runs:
        for i, (p, a) in enumerate(zip(r.proposed_at, r.accepted_at)):
            if i == len(proposed_at):
                proposed_at.append(0)
                accepted_at.append(0)
            proposed_at[i] += p
            accepted_at[i] += a
    parts: dict[str, list[int]] = {}
    for r in runs:
        for name, (drafted, kept) in r.parts.items():
            add_part(parts, name, drafted, kept)
    proposed, accepted = sum(r.proposed for r in runs), sum(r.accepted for r in runs)
    tokens, iters = sum(r.output_tokens for r in runs), sum(r.iter_count for r in runs)
    return {
        "output_tokens": tokens,
        "iter_count": iters,
        "avg_tokens_per_iter": tokens / iters if iters else 0.0,
        "proposed": proposed,
        "accepted": accepted,
        "accept_rate": accepted / proposed if proposed else 0.0,
        "proposed_at": proposed_at,
        "accepted_at": accepted_at,
        "accepted_per_position": [a / p if p else 0.0 for a, p in zip(accepted_at, proposed_at)],
        "by_part": parts,  # hybrid: part -> [drafted, accepted]
    }


def summarise(configs: list[BenchConfig], records: list[RunRecord], peak_bytes: dict[str, int]) -> list[dict]:
    """One dict per configuration with every figure the table, the plot and the JSON show."""
    runs_of = defaultdict(list)
    for r in records:
        runs_of[r.config].append(r)
    plain_of = {c.quant: c.label for c in configs if c.method == "plain"}
    rows = []
    for c in configs:
        runs = runs_of[c.label]
        plain_runs = runs_of[plain_of[c.quant]]
        tps_runs = _tps_per_repeat(runs)
        tps = statistics.median(tps_runs)
        plain_tps = statistics.median(_tps_per_repeat(plain_runs))
        elapsed = sum(r.elapsed_s for r in runs)
        draft_s, verify_s = sum(r.draft_s for r in runs), sum(r.verify_s for r in runs)
        by_workload = {}
        for workload in dict.fromkeys(r.workload for r in runs):
            w_runs = [r for r in runs if r.workload == workload]
            w_tps = statistics.median(_tps_per_repeat(w_runs))
            w_plain = statistics.median(_tps_per_repeat([r for r in plain_runs if r.workload == workload]))
            acc = _acceptance(w_runs)
            by_workload[workload] = {"tokens_per_s": w_tps, "speedup": w_tps / w_plain if w_plain else 0.0,
                                     "avg_tokens_per_iter": acc["avg_tokens_per_iter"], "accept_rate": acc["accept_rate"]}
        rows.append({
            "label": c.label,
            "method": c.method,
            "k": c.k,
            "quant": c.quant,
            "accept_policy": c.accept_policy,
            "draft": c.draft,
            "tokens_per_s": tps,
            "tokens_per_s_runs": tps_runs,
            "plain_tokens_per_s": plain_tps,
            "speedup": tps / plain_tps if plain_tps else 0.0,
            **_acceptance(runs),
            "elapsed_s": elapsed,
            "draft_s": draft_s,
            "verify_s": verify_s,
            "draft_share": draft_s / elapsed if elapsed else 0.0,
            "verify_share": verify_s / elapsed if elapsed else 0.0,
            # Plain decoding's verify time per iteration is exactly one single-token forward + pick.
            "step_s": verify_s / sum(r.iter_count for r in runs) if runs else 0.0,
            "peak_memory_bytes": peak_bytes.get(c.label, 0),
            "same_as_plain": None if any(r.same_as_plain is None for r in runs) else sum(r.same_as_plain for r in runs),
            "runs": len(runs),
            "by_workload": by_workload,
        })
    return rows


def _pct(values: list[float]) -> str:
    return " ".join(f"{v:.0%}" for v in values) or "-"


def results_table(rows: list[dict], title: str, memory_kind: str) -> Table:
    table = Table(title=title, title_justify="left")
    by_part = any(r.get("by_part") for r in rows)  # the column only when a hybrid ran (rows of older JSON lack it)
    # The column only when methods ran with different drafts (else the title names the one).
    drafts = len({r.get("draft") for r in rows if r.get("draft")}) > 1
    left = ("configuration", "draft", "accept per position", "accept by part")
    for col in ("configuration", *(("draft",) if drafts else ()), "tok/s", "speedup", "tok/iter", "accept", "accept per position",
                *(("accept by part",) if by_part else ()), "draft/verify time", f"peak MiB ({memory_kind})", "= plain"):
        table.add_column(col, justify="left" if col in left else "right", no_wrap=col == "configuration")
    for r in rows:
        table.add_row(
            escape(r["label"]), *((escape(r.get("draft") or "-"),) if drafts else ()), f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}x", f"{r['avg_tokens_per_iter']:.2f}",
            f"{r['accept_rate']:.0%}" if r["proposed"] else "-", _pct(r["accepted_per_position"]),
            *((parts_summary(r.get("by_part", {})) or "-",) if by_part else ()),
            f"{r['draft_share']:.0%} / {r['verify_share']:.0%}", f"{r['peak_memory_bytes'] / 2**20:.1f}",
            "-" if r["same_as_plain"] is None else f"{r['same_as_plain']}/{r['runs']}",
        )
    return table


def workload_table(rows: list[dict]) -> Table:
    workloads = list(dict.fromkeys(w for r in rows for w in r["by_workload"]))
    table = Table(title="speedup over plain by workload (tokens/iteration)", title_justify="left")
    table.add_column("configuration", no_wrap=True)
    for w in workloads:
        table.add_column(w, justify="right")
    for r in rows:
        if r["method"] == "plain":
            continue
        cells = [r["by_workload"].get(w) for w in workloads]
        table.add_row(escape(r["label"]), *(f"{c['speedup']:.2f}x ({c['avg_tokens_per_iter']:.1f})" if c else "-" for c in cells))
    return table


def roofline_lines(rooflines: dict) -> list[str]:
    lines = []
    for quant, rf in rooflines.items():
        measured = rf["measured_step_s"]
        ratio = f" = {rf['measured_over_roofline']:.1f}x the roofline" if measured else ""
        lines.append(
            f"roofline{f' [{quant}]' if quant else ''}: {rf['weight_bytes'] / 1e9:.3f} GB of weights / "
            f"{rf['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s copy bandwidth = {rf['roofline_step_s'] * 1e3:.2f} ms "
            f"per decode step; measured plain step {measured * 1e3:.2f} ms{ratio}"
        )
    return lines

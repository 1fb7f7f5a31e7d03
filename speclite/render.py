"""Rich renderables shared by the commands: the speculation summary, the quantization report."""

from __future__ import annotations

from rich.table import Table

from speclite.engine.stats import RequestStats, parts_summary


def summary_table(stats: RequestStats, title: str) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("output tokens", f"{stats.output_len}"),
        ("tokens/s", f"{stats.tokens_per_s:.1f}"),
        ("iterations", f"{stats.iter_count}"),
        ("avg tokens / iteration", f"{stats.avg_tokens_per_iter:.2f}"),
        ("accept rate", f"{stats.accept_rate:.1%}"),
        ("accepted per position", " ".join(f"{x:.0%}" for x in stats.accepted_per_position) or "-"),
        *((("accepted by part", parts_summary(stats.parts)),) if stats.parts else ()),
        ("draft / verify time", f"{stats.draft_s * 1000:.0f} ms / {stats.verify_s * 1000:.0f} ms"),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def quant_report(report) -> Table:
    """`speclite quantize`'s closing table: sizes, speed and held-out perplexity before and after."""
    table = Table(title=f"{report.scheme} ({report.method}) -> {report.out_dir}", title_justify="left")
    table.add_column("")
    table.add_column("original", justify="right")
    table.add_column("quantized", justify="right")
    table.add_row("weights", f"{report.bytes_before / 1e6:.1f} MB", f"{report.bytes_after / 1e6:.1f} MB")

    def ppl(x):
        return f"{x:.3f}" if x is not None else report.eval_skipped

    table.add_row("held-out perplexity", ppl(report.ppl_before), ppl(report.ppl_after))
    speed = report.bytes_before / 1e6 / max(report.quantize_seconds, 1e-9)
    table.add_row("quantized linears", "", f"{report.quantized_linears} in {report.quantize_seconds:.1f} s "
                  f"({speed:.0f} MB/s)")
    table.add_row("total time", "", f"{report.seconds:.1f} s")
    return table

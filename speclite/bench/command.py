"""`speclite bench`: plain vs speculative decoding side by side, method x k x quant sweeps."""

from __future__ import annotations

import json
from pathlib import Path

import click

from speclite.bench.prompts import WORKLOADS
from speclite.cli_options import console, method_option_flags, refuse_unused_method_flags, split_method_options
from speclite.speculate import METHODS, get_method
from speclite.speculate.verify import POLICIES
from speclite.errors import SpecliteError
from speclite.files import check_writable


def _check_method_flags(ctx, sp_types: str | None) -> None:
    """A method flag none of the swept methods takes is named: --sp-type's, or the default sweep's."""
    try:
        methods = [get_method(name.strip()) for name in (sp_types or "").split(",") if name.strip()]
    except (SpecliteError, KeyError):
        return  # an unknown name: the sweep names it
    if not methods:
        methods = [m for m in METHODS.values() if m.in_default_sweep]
        sp_types = f"(the default sweep: {', '.join(m.name for m in methods)}; name the method)"
    refuse_unused_method_flags(ctx, methods, sp_types)


@click.command()
@click.option("--model", "-m", default=None, help="Target: alias, org/name repo id, or local directory.")
@click.option("--draft", default=None,
              help="One draft for every method that takes one (default: models.toml's recommendation for each method).")
@click.option("--sp-type", "sp_types", default=None,
              help=f"Comma list of methods ({', '.join(METHODS)}). Default: all that apply.")
@click.option("--k", "--gen-num-per-cycle", "ks", default=None,
              help="Comma list of drafts per iteration, or auto [default: each method's own: 4; dflash: the drafter's "
                   "block size - 1; suffix: 32]. --gen-num-per-cycle, the other commands' name, is this flag too.")
@click.option("--quant", "quants", default=None, help="Comma list of target quant schemes (none, int4, w8a8, fp8-block, nf4; BODY/HEAD such as int4/w8a8).")
@click.option("--draft-quant", default=None, help="Quantize the draft at load time.")
@click.option("--accept-policy", type=click.Choice(list(POLICIES)), default="normal",
              show_default=True, help="accept_all: k+1 tokens per iteration by construction (loop overhead).")
@click.option("--prompts", default="builtin", show_default=True,
              help=f"builtin, builtin:{','.join(WORKLOADS)} (one or several), or a JSONL file.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True, help="Interleaved repeats; the median is reported.")
@click.option("--ignore-eos", is_flag=True, help="Always generate --max-new-tokens (on for --synthetic).")
@click.option("--temperature", type=float, default=0.0, show_default=True,
              help="0 = greedy; above, sampled runs (rejection sampling), each prompt seeded with its index in "
                   "every configuration ('= plain' is then '-').")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True, help="0 = off.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto", show_default=True)
@click.option("--threads", type=int, default=None, help="CPU threads (default: one per physical core).")
@click.option("--static", is_flag=True, help="Fixed-shape steps replayed as CUDA graphs (GPU; the CPU runs them without graphs).")
@click.option("--max-model-len", type=int, default=None, help="Context (KV cache) length.")
@click.option("--synthetic", default=None, help="Random-weight target of a real shape: qwen2.5-7b, qwen2.5-1.5b, ...")
@click.option("--synthetic-draft", default=None, help="Random-weight draft of a real shape, e.g. qwen2.5-0.5b.")
@click.option("--layers", type=int, default=None, help="Synthetic: fewer layers, for a quick run.")
@click.option("--draft-layers", type=int, default=None, help="Synthetic draft layers (default: --layers).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write every raw figure here.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="PNG: speedup vs k, acceptance per position (needs matplotlib).")
@method_option_flags
@click.pass_context
def bench(ctx, json_path, plot_path, **flags):
    """Plain vs speculative tokens/s on the same prompts, in one process, interleaved."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from speclite.bench.report import results_table, roofline_lines, workload_table
    from speclite.bench.session import BenchOptions, check_options, run_bench

    options = BenchOptions(
        model=flags["model"], draft=flags["draft"], sp_types=flags["sp_types"], ks=flags["ks"],
        quants=flags["quants"], draft_quant=flags["draft_quant"], accept_policy=flags["accept_policy"],
        prompts=flags["prompts"], max_new_tokens=flags["max_new_tokens"], repeats=flags["repeats"],
        device=flags["device"], dtype=flags["dtype"], max_model_len=flags["max_model_len"],
        method_options=split_method_options(flags), ignore_eos=flags["ignore_eos"], temperature=flags["temperature"],
        top_p=flags["top_p"], top_k=flags["top_k"],
        synthetic=flags["synthetic"], synthetic_draft=flags["synthetic_draft"], layers=flags["layers"],
        draft_layers=flags["draft_layers"], threads=flags["threads"], static=flags["static"], models_file=(ctx.obj or {}).get("models_file"),
    )
    # Everything that can be refused is refused before minutes of model loading.
    check_options(options)
    _check_method_flags(ctx, flags["sp_types"])
    for path, flag in ((json_path, "--json"), (plot_path, "--plot")):
        if path is not None:
            check_writable(path, flag)
    if plot_path is not None:
        from speclite.bench.plot import check_plot_path, require_matplotlib

        require_matplotlib()
        check_plot_path(plot_path, json_path)
    err = console(stderr=True)
    progress = Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                        TimeElapsedColumn(), console=err, transient=True)
    with progress:
        task = progress.add_task("loading", total=None)
        result = run_bench(
            options,
            on_start=lambda n: progress.update(task, total=n, description="warm-up"),
            on_run=lambda rec: progress.update(task, advance=1, description=f"{rec.config} / {rec.prompt}"),
        )
    meta = result["meta"]
    drafts = set(meta["drafts"].values())
    title = (f"{meta['model']}" + (f" + draft {meta['draft']}" if len(drafts) == 1 else
                                   " + each method's own draft" if drafts else "") +
             f" | {meta['device']} {meta['dtype']}, {meta['threads']} threads | {len(meta['prompts'])} prompts x "
             f"{meta['max_new_tokens']} new tokens | median of {meta['repeats']} interleaved repeats")
    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 150)  # redirected to a file: keep each table row on one line
    out.print(results_table(result["configs"], title, meta["memory_kind"]))
    out.print(workload_table(result["configs"]))
    for line in roofline_lines(result["rooflines"]):
        out.print(line, markup=False)  # "[int4]" is a label, not markup
    out.print(f"process peak RSS {meta['process_peak_rss_bytes'] / 2**20:.0f} MiB; "
              "speedups are ratios within this run: absolute tokens/s vary with machine load")
    if json_path is not None:
        try:
            json_path.write_text(json.dumps(result, indent=1))
        except OSError as e:
            raise SpecliteError(f"cannot write --json {json_path}: {e.strerror or e}") from None
        out.print(f"wrote {json_path}", markup=False)
    if plot_path is not None:
        from speclite.bench.plot import save_plot

        save_plot(result["configs"], plot_path, title)
        out.print(f"wrote {plot_path}", markup=False)

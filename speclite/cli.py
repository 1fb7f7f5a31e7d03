"""The `speclite` command: parse flags, call the library, render. Errors are one line, exit 1."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from speclite.bench.command import bench
from speclite.chat.command import chat
from speclite.cli_options import (QUANT_SCHEMES, build_llm, console, model_options, sampling_options,
                                  sampling_params, spec_options)
from speclite.errors import SpecliteError

@click.group()
@click.option("--models-file", envvar="SPECLITE_MODELS_FILE", type=click.Path(dir_okay=False), default=None,
              help="Extra model aliases (TOML, same format as models.toml).")
@click.version_option(package_name="speclite")
@click.pass_context
def cli(ctx, models_file):
    """speclite: fast, lossless speculative decoding on one GPU or a CPU."""
    ctx.obj = {"models_file": models_file}


@cli.command()
@click.pass_context
def models(ctx):
    """List model aliases, whether each is available locally, and recommended drafts."""
    from rich.table import Table

    from speclite.hub import is_cached, load_registry

    registry = load_registry(ctx.obj["models_file"])
    table = Table(title="speclite models")
    for col in ("alias", "source", "local", "recommended draft"):
        table.add_column(col)
    for alias in registry.aliases.values():
        source = alias.repo or f"(bundled) {alias.path.name}"
        default = " (default)" if alias.name == registry.default_target else ""
        table.add_row(alias.name + default, source, "yes" if is_cached(alias) else "no", alias.draft or "")
    console().print(table)


@cli.command()
@click.argument("model")
@click.pass_context
def pull(ctx, model):
    """Download MODEL (alias or org/name) from the Hugging Face hub."""
    from speclite.hub import download, load_registry

    registry = load_registry(ctx.obj["models_file"])
    alias = registry.aliases.get(model)
    if alias is not None and alias.path is not None:
        click.echo(f"{model} is bundled with speclite: {alias.path}")
        return
    repo = alias.repo if alias is not None else model
    if alias is None and model.count("/") != 1:
        raise SpecliteError(f"unknown model '{model}': not an alias ({', '.join(registry.aliases)}) or an org/name repo id")
    click.echo(f"downloading {model} ({repo})")
    click.echo(str(download(repo, label=model)))


@cli.command()
@model_options
@spec_options
@sampling_options
@click.option("--input", "-i", "input_path", required=True, type=click.Path(path_type=Path), help="JSONL prompts.")
@click.option("--output", "-o", "output_path", required=True, type=click.Path(path_type=Path), help="JSONL results (appended).")
@click.option("--echo", is_flag=True, help="Also print each finished completion.")
@click.pass_context
def generate(ctx, input_path, output_path, echo, max_new_tokens, temperature, top_p, top_k, seed, **flags):
    """Generate for every line of a JSONL file; re-running resumes where it stopped."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from speclite.batch import check_output_writable, parse_jobs, run_batch
    from speclite.render import summary_table

    # Bad files fail before a model is loaded, which can take minutes.
    check_output_writable(output_path)
    jobs = parse_jobs(input_path, sampling_params(max_new_tokens, temperature, top_p, top_k, seed))
    llm = build_llm(ctx, **flags)
    err = console(stderr=True)
    err.print(f"loaded: {llm.describe()}", markup=False)  # "[int4]" is a label, not markup
    progress = Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=False)
    out = console()

    def finished(record):
        progress.advance(task)
        if echo:
            key = record.get("id", record.get("line"))
            out.rule(f"{key}", align="left")
            out.print(record.get("text", f"error: {record.get('error')}"), markup=False)

    with progress:
        task = progress.add_task("generate", total=None)
        summary = run_batch(llm, jobs, output_path, on_start=lambda n: progress.update(task, total=n),
                            on_result=finished)
    err.print(f"{summary.done} done, {summary.failed} failed, {summary.skipped} already in {output_path}", markup=False)
    if summary.done:
        err.print(summary_table(summary.stats, f"{llm.spec_config.method} on {llm.model_name}"))


@cli.command()
@click.argument("model")
@click.option("--scheme", type=click.Choice(QUANT_SCHEMES), required=True)
@click.option("--method", type=click.Choice(["rtn", "gptq", "smoothquant"]), default="rtn", show_default=True,
              help="rtn: any scheme, no data; gptq: int4, through GPTQModel (speclite[gptq]); smoothquant: w8a8.")
@click.option("--group-size", type=int, default=128, show_default=True)
@click.option("--sym", is_flag=True, help="Symmetric int4 (default asymmetric).")
@click.option("--act-order", is_flag=True, help="GPTQ: quantize columns in order of activation size.")
@click.option("--alpha", type=float, default=0.5, show_default=True, help="SmoothQuant migration strength.")
@click.option("--calib", type=click.Path(path_type=Path), default=None, help="Calibration text (default: shipped sample).")
@click.option("--calib-samples", type=int, default=128, show_default=True)
@click.option("--seq-len", type=int, default=512, show_default=True)
@click.option("--output", "-o", "out_dir", required=True, type=click.Path(path_type=Path))
@click.pass_context
def quantize(ctx, model, scheme, method, group_size, sym, act_order, alpha, calib, calib_samples, seq_len, out_dir):
    """Quantize MODEL into a checkpoint vLLM, SGLang and transformers load."""
    from speclite.hub import resolve
    from speclite.quant import quantize_to_dir
    from speclite.render import quant_report

    model_dir = resolve(model, ctx.obj["models_file"])
    err = console(stderr=True)
    report = quantize_to_dir(model_dir, out_dir, scheme, method=method, group_size=group_size, sym=sym,
                             act_order=act_order, alpha=alpha, calib=calib, calib_samples=calib_samples,
                             seq_len=seq_len, progress=lambda msg: err.print(f"  {msg}", markup=False))
    console().print(quant_report(report))


cli.add_command(chat)
cli.add_command(bench)


def main():
    """Entry point: bad input is one line on stderr and a non-zero exit, never a traceback."""
    try:
        cli(standalone_mode=False)
    except SpecliteError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort):
        click.echo("interrupted: finished results are saved; run the same command again to resume", err=True)
        sys.exit(130)
    except MemoryError:
        click.echo("error: out of memory: try --quant int4 (or fp8-block on a GPU) or a smaller model", err=True)
        sys.exit(1)
    except Exception as e:  # torch.OutOfMemoryError without importing torch here
        if type(e).__name__ == "OutOfMemoryError":
            click.echo("error: out of GPU memory: try --quant int4 or fp8-block, or a smaller --max-model-len", err=True)
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()

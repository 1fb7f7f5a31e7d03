"""The `speclite` command: parse flags, call the library, render. Errors are one line, exit 1."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from speclite.errors import SpecliteError

SP_TYPES = ("none", "naive", "vanilla", "deterministic")
VERIFIERS = ("greedy", "rejection", "topp", "target_match")
QUANT_SCHEMES = ("fp8-block", "int4", "w8a8")


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def model_options(f):
    """Target, device and precision flags shared by every command that loads a model."""
    options = [
        click.option("--model", "-m", default=None, help="Alias, org/name hub repo id, or local directory."),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True),
        click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                     show_default=True, help="auto: bfloat16 on CUDA, float32 on the CPU."),
        click.option("--quant", default=None, help="Quantize the target at load time: fp8-block, int4 or w8a8."),
        click.option("--max-model-len", type=int, default=None, help="Context length (default: model's, at most 4096)."),
    ]
    return functools.reduce(lambda acc, opt: opt(acc), reversed(options), f)


def spec_options(f):
    """Speculative decoding flags (RTP-LLM names)."""
    options = [
        click.option("--sp-type", type=click.Choice(SP_TYPES), default="none", show_default=True,
                     help="Speculation method."),
        click.option("--draft", default=None, help="Draft model for --sp-type vanilla (default: models.toml's)."),
        click.option("--draft-quant", "--sp-quantization", "draft_quant", default=None,
                     help="Quantize the draft at load time: fp8-block / FP8_PER_BLOCK, int4 / INT4, w8a8 / W8A8."),
        click.option("--gen-num-per-cycle", "k", default="4", show_default=True,
                     help="Drafts per iteration, or 'auto' to adapt to acceptance and cost."),
        click.option("--sp-min-token-match", "min_match", type=int, default=1, show_default=True),
        click.option("--sp-max-token-match", "max_match", type=int, default=3, show_default=True),
        click.option("--verify", type=click.Choice(VERIFIERS), default=None,
                     help="Default: greedy at temperature 0, rejection (lossless) otherwise."),
        click.option("--accept-policy", type=click.Choice(["normal", "accept_all", "reject_all"]), default="normal",
                     show_default=True, help="accept_all / reject_all: for debugging and loop overhead."),
    ]
    return functools.reduce(lambda acc, opt: opt(acc), reversed(options), f)


def sampling_options(f):
    options = [
        click.option("--max-new-tokens", type=int, default=256, show_default=True),
        click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy."),
        click.option("--top-p", type=float, default=1.0, show_default=True),
        click.option("--top-k", type=int, default=0, show_default=True, help="0 = off."),
        click.option("--seed", type=int, default=None),
    ]
    return functools.reduce(lambda acc, opt: opt(acc), reversed(options), f)


def build_llm(ctx, model, device, dtype, quant, max_model_len, sp_type, draft, draft_quant, k, min_match, max_match,
              verify, accept_policy):
    from speclite.api import LLM, SpecConfig
    from speclite.hub import load_registry

    models_file = ctx.obj.get("models_file")
    if model is None:
        model = load_registry(models_file).default_target
    if draft is not None and sp_type != "vanilla":
        raise SpecliteError("--draft is only used with --sp-type vanilla")
    spec = SpecConfig(sp_type, k, draft, draft_quant, min_match, max_match, verify, accept_policy)
    return LLM(model, spec, device=device, dtype=dtype, quant=quant, models_file=models_file,
               max_model_len=max_model_len)


def sampling_params(max_new_tokens, temperature, top_p, top_k, seed):
    from speclite.engine.sampling import SamplingParams

    return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)


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
    _console().print(table)


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
@click.pass_context
def generate(ctx, input_path, output_path, max_new_tokens, temperature, top_p, top_k, seed, **flags):
    """Generate for every line of a JSONL file; re-running resumes where it stopped."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from speclite.batch import check_output_writable, parse_jobs, run_batch
    from speclite.render import summary_table

    # Bad files fail before a model is loaded, which can take minutes.
    check_output_writable(output_path)
    jobs = parse_jobs(input_path, sampling_params(max_new_tokens, temperature, top_p, top_k, seed))
    llm = build_llm(ctx, **flags)
    err = _console(stderr=True)
    err.print(f"loaded: {llm.describe()}")
    progress = Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=False)
    with progress:
        task = progress.add_task("generate", total=None)
        summary = run_batch(
            llm, jobs, output_path,
            on_start=lambda n: progress.update(task, total=n),
            on_result=lambda rec: progress.advance(task),
        )
    err.print(f"{summary.done} done, {summary.failed} failed, {summary.skipped} already in {output_path}")
    if summary.done:
        err.print(summary_table(summary.stats, f"{llm.spec_config.method} on {llm.model_name}"))


@cli.command()
@click.argument("model")
@click.option("--scheme", type=click.Choice(QUANT_SCHEMES), required=True)
@click.option("--method", type=click.Choice(["rtn", "gptq", "smoothquant"]), default="rtn", show_default=True,
              help="rtn: any scheme, no data; gptq: int4; smoothquant: w8a8.")
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
    err = _console(stderr=True)
    report = quantize_to_dir(model_dir, out_dir, scheme, method=method, group_size=group_size, sym=sym,
                             act_order=act_order, alpha=alpha, calib=calib, calib_samples=calib_samples,
                             seq_len=seq_len, progress=lambda msg: err.print(f"  {msg}"))
    _console().print(quant_report(report))


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

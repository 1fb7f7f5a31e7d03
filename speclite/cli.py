"""The `speclite` command: parse flags, call the library, render. Errors are one line, exit 1."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import click

from speclite.bench.command import bench
from speclite.chat.command import chat
from speclite.cli_options import (GIVEN, QUANT_SCHEMES, build_llm, console, model_options, sampling_options,
                                  sampling_params, spec_options, threads_option)
from speclite.errors import CLI_RUNNING, Interrupted, SpecliteError
from speclite.serve.command import serve

# The SIGINTs main() saw: a KeyboardInterrupt raised while torch's C++ runs Python code can reach us as
# another error (a ValueError from torch.tensor, say), and the signal itself says it was Ctrl-C.
_sigints: list[int] = []


@contextlib.contextmanager
def interrupted_as(stands: Callable[[], str]):
    """A command's work (also a decorator): a Ctrl-C inside it ends the command with what `stands()` says
    stands and what to run again, on its one line."""
    try:
        yield
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt) or _sigints:
            raise Interrupted(stands()) from None
        raise


@click.group()
@click.option("--models-file", envvar="SPECLITE_MODELS_FILE", type=click.Path(dir_okay=False), default=None,
              help="Extra model aliases (TOML, same format as models.toml).")
@click.option("--debug", is_flag=True, envvar="SPECLITE_DEBUG",
              help="Show the full traceback of an error (also SPECLITE_DEBUG=1).")
@click.version_option(package_name="speclite")
@click.pass_context
def cli(ctx, models_file, debug):
    """speclite: fast, lossless speculative decoding on one GPU or a CPU."""
    ctx.obj = {"models_file": models_file}
    running = CLI_RUNNING.set(True)  # errors name our flags, not the Python API's keys
    ctx.call_on_close(lambda: CLI_RUNNING.reset(running))
    if debug:
        os.environ["SPECLITE_DEBUG"] = "1"  # read by main() once the command has failed


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
        drafts = [alias.draft or ""] + [f"{method}: {draft}" for method, draft in alias.drafts.items()]
        table.add_row(alias.name + default, source, "yes" if is_cached(alias) else "no", "\n".join(filter(None, drafts)))
    console().print(table)


@cli.command()
@click.argument("model")
@click.pass_context
def pull(ctx, model):
    """Download MODEL (alias or org/name) from the Hugging Face hub."""
    from speclite.hub import download, is_repo_id, load_registry

    registry = load_registry(ctx.obj["models_file"])
    alias = registry.aliases.get(model)
    if alias is not None and alias.path is not None:
        click.echo(f"{model} is bundled with speclite: {alias.path}")
        return
    repo = alias.repo if alias is not None else model
    if alias is None and not is_repo_id(model):
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
@interrupted_as(lambda: "finished results are saved; run the same command again to resume")
def generate(ctx, input_path, output_path, echo, max_new_tokens, temperature, top_p, top_k, seed, **flags):
    """Generate for every line of a JSONL file; re-running resumes where it stopped."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.text import Text

    from speclite.batch import check_output_writable, parse_jobs, run_batch
    from speclite.render import summary_table

    # Bad files fail before a model is loaded, which can take minutes; the output is made once the
    # input and flags were found good (nothing is left behind by a run that never started).
    jobs = parse_jobs(input_path, sampling_params(max_new_tokens, temperature, top_p, top_k, seed))
    check_output_writable(output_path, input_path)
    llm = build_llm(ctx, **flags)
    err = console(stderr=True)
    err.print(f"loaded: {llm.describe()}", markup=False)  # "[int4]" is a label, not markup
    progress = Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=False)
    out = console()

    def finished(record):
        progress.advance(task)
        if echo:  # ids and texts as they are: no markup, no :emoji: codes, no wrapping
            out.rule(Text(str(record.get("id", record.get("line")))), align="left")
            out.print(record.get("text", f"error: {record.get('error')}"), markup=False, emoji=False, soft_wrap=True)

    with progress:
        task = progress.add_task("generate", total=None)
        summary = run_batch(llm, jobs, output_path, on_start=lambda n: progress.update(task, total=n),
                            on_result=finished)
    err.print(f"{summary.done} done, {summary.failed} failed, {summary.skipped} already in {output_path}", markup=False)
    if summary.done:
        err.print(summary_table(summary.stats, f"{llm.spec_config.method} on {llm.model_name}"))
    if summary.failed:  # a script learns it from the exit status
        raise SpecliteError(f"{summary.failed} of {len(jobs)} lines failed: their error records are in {output_path}; "
                            "fix them and run the same command again (it skips the finished ones)")


@cli.command()
@click.argument("model")
@click.option("--scheme", type=click.Choice(QUANT_SCHEMES), required=True)
@click.option("--method", type=click.Choice(["rtn", "gptq", "awq", "smoothquant"]), default="rtn", show_default=True,
              help="rtn: any scheme, no data; gptq, awq: int4, through GPTQModel (speclite[gptq]); smoothquant: w8a8.")
@click.option("--group-size", type=int, default=128, show_default=True)
@click.option("--sym", is_flag=True, help="Symmetric int4 (default asymmetric).")
@click.option("--act-order", is_flag=True, help="GPTQ: quantize columns in order of activation size.")
@click.option("--alpha", type=float, default=0.5, show_default=True, help="SmoothQuant migration strength.")
@click.option("--calib", type=click.Path(path_type=Path), default=None, help="Calibration text (default: shipped sample).")
@click.option("--calib-samples", type=int, default=128, show_default=True)
@click.option("--seq-len", type=int, default=512, show_default=True)
@click.option("--output", "-o", "out_dir", required=True, type=click.Path(path_type=Path))
@click.option("--shard-size", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Largest output shard in MB (memory use grows with it).")
@click.option("--no-eval", is_flag=True, help="Skip the held-out perplexity of the original and quantized model.")
@click.option("--verbose", "-v", is_flag=True, help="List every tensor as it is written.")
@threads_option
@click.pass_context
def quantize(ctx, model, scheme, method, group_size, sym, act_order, alpha, calib, calib_samples, seq_len, out_dir,
             shard_size, no_eval, verbose):
    """Quantize MODEL into a checkpoint vLLM, SGLang and transformers load."""
    from speclite.hub import resolve
    from speclite.quant import quantize_to_dir
    from speclite.quant.progress import ConsoleProgress
    from speclite.render import quant_report

    # A flag the scheme and method would ignore is named (each given on the command line, not its default).
    unused = {"group_size": (scheme != "int4", f"--scheme {scheme} has no groups (int4's)"),
              "alpha": (method != "smoothquant", "it is SmoothQuant's migration strength"),
              "calib_samples": (method == "rtn" and no_eval, "rtn reads no data and --no-eval skips the evaluation"),
              "seq_len": (method == "rtn" and no_eval, "rtn reads no data and --no-eval skips the evaluation")}
    for name, (ignored, why) in unused.items():
        if ignored and ctx.get_parameter_source(name) in GIVEN:
            raise SpecliteError(f"--{name.replace('_', '-')} is not used here: {why}")
    model_dir = resolve(model, ctx.obj["models_file"])
    progress = ConsoleProgress(console(stderr=True), verbose)

    def stands() -> str:
        if progress.out_dir is None:
            return "nothing was written; run the same command again"
        return f"{progress.out_dir} is written; its perplexity report was skipped"

    with interrupted_as(stands):
        try:
            report = quantize_to_dir(model_dir, out_dir, scheme, method=method, group_size=group_size, sym=sym,
                                     act_order=act_order, alpha=alpha, calib=calib, calib_samples=calib_samples,
                                     seq_len=seq_len, shard_bytes=shard_size * 1024**2, evaluate=not no_eval,
                                     progress=progress)
        finally:
            progress.stop()
    console().print(quant_report(report))


@cli.command("token-map")
@click.argument("model")
@click.option("--corpus", multiple=True, required=True, type=click.Path(exists=True, path_type=Path),
              help="Text the drafts will resemble: files, JSONL (each record's \"text\" or \"prompt\") or directories; "
              "repeatable.")
@click.option("--size", type=click.IntRange(min=1), default=32768, show_default=True, help="Tokens in the map.")
@click.option("--output", "-o", "output_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help=".pt (FR-Spec's torch-saved list, what SGLang reads) or .json.")
@click.pass_context
def token_map(ctx, model, corpus, size, output_path):
    """Write MODEL's SIZE most frequent tokens over a corpus: a --token-map for a drafter's head (FR-Spec)."""
    from speclite.api import eos_ids, load_tokenizer
    from speclite.hub import resolve
    from speclite.speculate import token_map as maps

    if output_path.suffix not in (".pt", ".json"):
        raise SpecliteError(f"--output {output_path}: name a .pt or .json file")
    maps.check_writable(output_path)
    model_dir = resolve(model, ctx.obj["models_file"])
    tokenizer = load_tokenizer(model_dir)
    counts = maps.count(tokenizer, maps.corpus_texts(corpus))
    total = sum(counts.values())
    if not total:
        raise SpecliteError(f"the corpus ({', '.join(map(str, corpus))}) holds no text")
    ids = maps.most_frequent(counts, size, sorted(eos_ids(model_dir, tokenizer)))
    maps.save(ids, output_path)
    covered = sum(counts[i] for i in ids)
    click.echo(f"{output_path}: {len(ids)} of {len(tokenizer)} tokens, {covered / total:.1%} of the corpus's {total} tokens")


cli.add_command(chat)
cli.add_command(bench)
cli.add_command(serve)


INTERRUPTED = "interrupted"


def main():
    """Entry point, and the one place an exception becomes one line on stderr and a non-zero exit."""
    _sigints.clear()

    def on_interrupt(signum, frame):
        _sigints.append(signum)
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        cli(standalone_mode=False)
        return
    except Exception as e:  # noqa: BLE001 - every failure ends here, as one line
        error, (code, message) = e, _one_line(e)
        if _sigints and code != 130:
            code, message = 130, INTERRUPTED
    except KeyboardInterrupt as e:
        error, code, message = e, 130, _interrupted(e)
    finally:
        signal.signal(signal.SIGINT, previous)  # main() called in-process (tests) leaves the caller's handler
    if os.environ.get("SPECLITE_DEBUG", "") not in ("", "0"):
        traceback.print_exception(error)
    click.echo(message, err=True)
    sys.exit(code)


def _interrupted(e: BaseException | None) -> str:
    """A Ctrl-C's one line: with what stands, where the command said (an Interrupted)."""
    return f"{INTERRUPTED}: {e}" if isinstance(e, Interrupted) else INTERRUPTED


def _one_line(e: Exception) -> tuple[int, str]:
    """(exit code, message) for a failure; only an unexpected one points at --debug."""
    if isinstance(e, SpecliteError):
        return 1, f"error: {e}"
    if isinstance(e, click.exceptions.Abort):  # click's for a KeyboardInterrupt, the cause
        return 130, _interrupted(e.__cause__)
    if isinstance(e, click.ClickException):  # bad flags: click's message without the usage block
        hint = f" (see '{e.ctx.command_path} --help')" if getattr(e, "ctx", None) else ""
        return e.exit_code, f"error: {e.format_message()}{hint}"
    text = str(e).splitlines()[0] if str(e) else ""
    # torch.OutOfMemoryError (CUDA) and the CPU allocator's RuntimeError, without importing torch here.
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in text:
        return 1, "error: out of memory: try --quant int4 (or fp8-block on a GPU), a smaller --max-model-len or model"
    if isinstance(e, OSError) and e.strerror:
        where = f": {e.filename}" if e.filename else ""
        return 1, f"error: {e.strerror}{where}"
    return 1, f"error: internal error ({type(e).__name__}: {text}); run with --debug or SPECLITE_DEBUG=1 for the traceback"


if __name__ == "__main__":
    main()

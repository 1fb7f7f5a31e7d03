"""Flags shared by every command that loads a model, and building an LLM from them."""

from __future__ import annotations

import functools

import click
from click.core import ParameterSource

from speclite.errors import SpecliteError

QUANT_SCHEMES = ("fp8-block", "int4", "w8a8")


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _set_threads(ctx, param, threads):
    if threads is not None:
        if threads < 1:
            raise click.BadParameter(f"must be at least 1, got {threads}", ctx, param)
        import torch

        torch.set_num_threads(threads)
    return threads


def threads_option(f):
    """--threads N: CPU threads for the matmuls (torch's and speclite's kernels); set as the flag is read."""
    return click.option("--threads", type=int, default=None, expose_value=False, callback=_set_threads,
                        help="CPU threads (default: one per physical core).")(f)


def model_options(f):
    """Target, device and precision flags shared by every command that loads a model."""
    options = [
        click.option("--model", "-m", default=None, help="Alias, org/name hub repo id, or local directory."),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True),
        click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                     show_default=True, help="auto: bfloat16 on CUDA, float32 on the CPU."),
        click.option("--quant", default=None, help="Quantize the target at load time: fp8-block, int4, w8a8 or nf4 (bitsandbytes); "
                     "BODY/HEAD, e.g. int4/w8a8, quantizes lm_head too."),
        click.option("--max-model-len", type=int, default=None, help="Context length (default: model's, at most 4096)."),
        click.option("--static", is_flag=True, help="Fixed-shape decode/verify steps, replayed as CUDA graphs (GPU; the CPU runs them without graphs)."),
        threads_option,
    ]
    return functools.reduce(lambda acc, opt: opt(acc), reversed(options), f)


def method_option_flags(f):
    """One flag per registered method option (e.g. --sp-min-token-match), collected into `method_opts`."""
    from speclite.speculate.registry import all_options

    options = [click.option(o.cli_flag, f"opt_{o.name}", type=o.type, default=o.default, show_default=True,
                            help=o.help) for o in all_options()]
    return functools.reduce(lambda acc, opt: opt(acc), reversed(options), f)


def split_method_options(flags: dict) -> dict:
    """Pop the method-option flags out of a command's keyword arguments: {option name: value}."""
    return {name.removeprefix("opt_"): flags.pop(name) for name in list(flags) if name.startswith("opt_")}


def spec_options(f):
    """Speculative decoding flags (RTP-LLM names); methods, verifiers and policies from the registry."""
    from speclite.speculate.registry import method_names
    from speclite.speculate.verify import POLICIES, VERIFIERS

    options = [
        click.option("--sp-type", type=click.Choice(method_names()), default="none", show_default=True,
                     help="Speculation method."),
        click.option("--draft", default=None, help="Draft model (or head) for the methods that need one "
                     "(default: models.toml's recommendation for the method)."),
        click.option("--draft-quant", "--sp-quantization", "draft_quant", default=None,
                     help="Quantize the draft at load time: fp8-block / FP8_PER_BLOCK, int4 / INT4, w8a8 / W8A8, nf4."),
        click.option("--gen-num-per-cycle", "k", default=None,
                     help="Drafts per iteration, or 'auto' to adapt to acceptance and cost "
                     "[default: 4; dflash: the drafter's block size - 1; suffix: 32]."),
        click.option("--verify", type=click.Choice(list(VERIFIERS)), default=None,
                     help="Default: greedy at temperature 0, rejection (lossless) otherwise."),
        click.option("--accept-policy", type=click.Choice(list(POLICIES)), default="normal",
                     show_default=True, help="accept_all / reject_all: for debugging and loop overhead."),
    ]
    return method_option_flags(functools.reduce(lambda acc, opt: opt(acc), reversed(options), f))


def sampling_options(f, serving: bool = False):
    """The sampling flags; `serving`: the server's per-request defaults, whose help says what a request
    that sets neither flag nor field gets (OpenAI's defaults), not the flag's own value."""
    options = [
        click.option("--max-new-tokens", type=int, default=256, show_default=not serving,
                     help="[default: up to the end of the context]" if serving else None),
        click.option("--temperature", type=float, default=0.0, show_default=not serving,
                     help="0 = greedy. [default: 1, OpenAI's]" if serving else "0 = greedy."),
        click.option("--top-p", type=float, default=1.0, show_default=True),
        click.option("--top-k", type=int, default=0, show_default=True, help="0 = off."),
        click.option("--seed", type=int, default=None),
    ]
    return functools.reduce(lambda acc, opt: opt(acc), reversed(options), f)


GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)  # a flag the user set, not its default


def refuse_unused_method_flags(ctx, methods: list, sp_type: str) -> set[str]:
    """The options `methods` take; a method flag given on the command line that none of them takes is
    a mistake to name (it would be ignored)."""
    own = {o.name for method in methods for o in method.options}
    for param in ctx.command.params:
        if (param.name.startswith("opt_") and param.name.removeprefix("opt_") not in own
                and ctx.get_parameter_source(param.name) in GIVEN):
            raise SpecliteError(f"{param.opts[0]} is not used by --sp-type {sp_type}")
    return own


def build_llm(ctx, model, device, dtype, quant, max_model_len, static, sp_type, draft, draft_quant, k, verify,
              accept_policy, **method_opts):
    from speclite.api import LLM, SpecConfig
    from speclite.hub import load_registry
    from speclite.speculate.registry import NONE, get_method

    models_file = ctx.obj.get("models_file")
    if model is None:
        model = load_registry(models_file).default_target
    method = get_method(sp_type) if sp_type != NONE else None
    # Only the chosen method's options; the other methods' flags keep their defaults, unused.
    own = refuse_unused_method_flags(ctx, [method] if method else [], sp_type)
    options = {name: value for name, value in split_method_options(method_opts).items() if name in own}
    spec = SpecConfig(method=sp_type, k=k, draft=draft, draft_quant=draft_quant, verify=verify,
                      accept_policy=accept_policy, options=options)
    return LLM(model, spec, device=device, dtype=dtype, quant=quant, models_file=models_file,
               max_model_len=max_model_len, static=static)


def sampling_params(max_new_tokens, temperature, top_p, top_k, seed):
    from speclite.sampling import SamplingParams

    return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)

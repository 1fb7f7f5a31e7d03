"""`speclite serve --print-engine-command {vllm,sglang}`: the same model and speculation on a peer engine.

Flag and key names are those the engines document: vLLM's `--speculative-config` JSON (method
`draft_model` / `ngram`, num_speculative_tokens, prompt_lookup_min/max) and SGLang's
`--speculative-algorithm STANDALONE|NGRAM` with its num-steps / eagle-topk / num-draft-tokens flags.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from speclite import hub
from speclite.cli_options import split_method_options
from speclite.errors import SpecliteError
from speclite.speculate.schedule import DEFAULT_K


def engine_command(engine: str, models_file, *, host: str, port: int, api_key: str | None,
                   served_model_name: str | None, model: str | None, dtype: str, quant: str | None,
                   max_model_len: int | None, sp_type: str, draft: str | None, draft_quant: str | None,
                   k: str | None, verify: str | None, accept_policy: str, **rest) -> str:
    """One shell command line; SpecliteError names what has no equivalent on that engine.

    `rest` holds the methods' own flags (opt_*) and the runtime ones (device, static), which need no
    flag: both engines run on the GPU with CUDA graphs.
    """
    if sp_type not in ("none", "vanilla", "deterministic"):
        raise SpecliteError(f"--print-engine-command knows vanilla and deterministic speculation, not --sp-type {sp_type}")
    options = split_method_options(rest)
    model = model or hub.load_registry(models_file).default_target
    _check_portable(quant, draft_quant, k, verify, accept_policy)
    source = _source(model, models_file)
    args = ["vllm", "serve", source] if engine == "vllm" else ["python", "-m", "sglang.launch_server", "--model-path", source]
    args += ["--host", host, "--port", str(port), "--served-model-name", served_model_name or model]
    if api_key:
        args += ["--api-key", api_key]
    if dtype != "auto":
        args += ["--dtype", dtype]
    if max_model_len:
        args += ["--max-model-len" if engine == "vllm" else "--context-length", str(max_model_len)]
    if quant:
        args += ["--quantization", "fp8"]  # dynamic FP8 at load time, as --quant fp8-block is here
    if sp_type in ("vanilla", "deterministic"):
        draft = _source(draft or _recommended(model, models_file), models_file) if sp_type == "vanilla" else None
        spec = _vllm_spec if engine == "vllm" else _sglang_spec
        args += spec(sp_type, DEFAULT_K if k is None else int(k), draft, options["min_match"], options["max_match"])
    return shlex.join(args)


def _vllm_spec(sp_type: str, k: int, draft: str | None, min_match: int, max_match: int) -> list[str]:
    if sp_type == "vanilla":
        config = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
    else:
        config = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": min_match,
                  "prompt_lookup_max": max_match}
    return ["--speculative-config", json.dumps(config)]


def _sglang_spec(sp_type: str, k: int, draft: str | None, min_match: int, max_match: int) -> list[str]:
    if sp_type == "vanilla":
        # A chain of k draft steps (top-k 1): k drafts plus the verified token per step.
        return ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", draft,
                "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(k + 1)]
    return ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(k),
            "--speculative-ngram-min-match-window-size", str(min_match),
            "--speculative-ngram-max-match-window-size", str(max_match)]


def _check_portable(quant, draft_quant, k, verify, accept_policy) -> None:
    if quant and quant != "fp8-block":
        raise SpecliteError(f"--quant {quant} has no load-time equivalent there: write the checkpoint with "
                            "`speclite quantize MODEL --scheme int4|w8a8|fp8-block -o DIR` and pass --model DIR")
    if draft_quant:
        raise SpecliteError("--draft-quant has no load-time equivalent there: quantize the draft with "
                            "`speclite quantize` and pass --draft DIR")
    if k == "auto":
        raise SpecliteError("--gen-num-per-cycle auto (adaptive k) has no equivalent there: pass a number")
    if verify not in (None, "greedy", "rejection"):  # both engines verify greedily or by rejection sampling
        raise SpecliteError(f"--verify {verify} has no equivalent there")
    if accept_policy != "normal":
        raise SpecliteError("--accept-policy has no equivalent there")


def _recommended(model: str, models_file) -> str:
    draft = hub.recommended_draft(model, models_file, "vanilla")
    if draft is None:
        raise SpecliteError(f"--sp-type vanilla needs --draft: models.toml recommends no draft for '{model}'")
    return draft


def _source(model: str, models_file) -> str:
    """What the engine loads: the hub repo id (it downloads it itself) or a local directory."""
    alias = hub.load_registry(models_file).aliases.get(str(model))
    if alias is not None and alias.repo:
        return alias.repo
    if alias is None and str(model).count("/") == 1 and not Path(str(model)).expanduser().is_dir():
        return str(model)
    return str(hub.resolve(model, models_file, fetch=False))

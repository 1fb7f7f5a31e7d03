"""`speclite serve`: flags -> LLM -> the OpenAI-compatible app on uvicorn (or the equivalent vLLM/SGLang command)."""

from __future__ import annotations

import functools
import signal
from dataclasses import replace

import click

from speclite.cli_options import (GIVEN, build_llm, console, model_options, sampling_options, sampling_params,
                                  spec_options)
from speclite.errors import Interrupted, SpecliteError


# What an OpenAI request that sends no temperature gets (the flag's own default, 0, is greedy).
OPENAI_TEMPERATURE = 1.0
# Once told to stop, how long the server waits for its connections (their requests already ended) to close.
GRACE_S = 5


@click.command()
@model_options
@spec_options
@functools.partial(sampling_options, serving=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 exposes it to the network).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--api-key", envvar="SPECLITE_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on /v1 (also SPECLITE_API_KEY).")
@click.option("--served-model-name", default=None, help="Model id in the API (default: --model as given).")
@click.option("--max-queue", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests that may wait for the engine; more are answered 429.")
@click.option("--print-engine-command", type=click.Choice(["vllm", "sglang"]), default=None,
              help="Print the equivalent vLLM or SGLang launch command and exit.")
@click.pass_context
def serve(ctx, host, port, api_key, served_model_name, max_queue, print_engine_command,
          max_new_tokens, temperature, top_p, top_k, seed, **flags):
    """Serve a model over the OpenAI API, one request at a time; sampling flags are per-request defaults
    (left out: OpenAI's, temperature 1 and answers up to the end of the context)."""
    if print_engine_command:
        from speclite.serve.engine_command import engine_command

        click.echo(engine_command(print_engine_command, ctx.obj.get("models_file"), host=host, port=port,
                                  api_key=api_key, served_model_name=served_model_name, **flags))
        return
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise SpecliteError(f"speclite serve needs the 'serve' extra ({e.name} is missing): "
                            "pip install 'speclite[serve]'") from None
    from speclite.serve.app import create_app

    given = {name for name in ("max_new_tokens", "temperature") if ctx.get_parameter_source(name) in GIVEN}
    defaults = sampling_params(max_new_tokens, temperature if "temperature" in given else OPENAI_TEMPERATURE,
                               top_p, top_k, seed)  # checked before the model loads
    llm = build_llm(ctx, **flags)
    if "max_new_tokens" not in given:  # the loop stops at the end of the context
        defaults = replace(defaults, max_new_tokens=llm.max_len)
    name = served_model_name or llm.model_name
    app = create_app(llm, name, api_key, max_queue, defaults)
    err = console(stderr=True)
    err.print(f"loaded: {llm.describe()}", markup=False)
    err.print(f"serving '{name}' at http://{host}:{port}/v1 (queue {max_queue}"
              + (", API key required)" if api_key else ")"), markup=False)
    # lifespan off: the app has no start-up or shutdown handlers, and a second Ctrl-C cancelled uvicorn's
    # lifespan task, which printed a traceback on the way out.
    signals = run_server(app, uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                             timeout_graceful_shutdown=GRACE_S))
    if signal.SIGINT in signals:
        raise Interrupted("the server stopped; requests still running were ended")


def run_server(app, config) -> list[int]:
    """uvicorn until Ctrl-C or SIGTERM; the signals that stopped it. Each request still running or waiting
    ends at once (the engine stops after its current iteration), so the stop takes no longer than an
    iteration and the answers' ends. uvicorn raises the signals again once stopped: they are answered
    here by nothing (a KeyboardInterrupt inside its loop would end the tasks left with tracebacks)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            app.state.worker.stop()
            seen.append(sig)
            super().handle_exit(sig, frame)

    seen: list[int] = []
    before = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        Server(config).run()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    return seen

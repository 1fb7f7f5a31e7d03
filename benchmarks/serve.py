"""Overhead of the HTTP layer: time to first token and tokens/s through `speclite serve` vs the Python API.

    python benchmarks/serve.py --model tiny-code --sp-type vanilla --threads 1
    python benchmarks/serve.py --model tiny-code --sp-type deterministic --prompts builtin:edit,summary

The same model and speculation run twice: in this process (LLM.stream) and in a `speclite serve`
process (streamed through /v1/completions or /v1/chat/completions with the httpx client). Every
prompt runs on both, interleaved and alternating which goes first, greedy; the texts must match.
Reported: median time to first token and median tokens/s (completion tokens / request wall time)
per path, and server / API ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx
import torch
from rich.console import Console
from rich.table import Table

from speclite import LLM, SamplingParams, SpecConfig
from speclite.bench.prompts import load_prompts


def run_api(llm: LLM, prompt, extra: dict, max_new_tokens: int) -> tuple[float, float, int, str]:
    """(time to first token s, total s, tokens, text) of one streamed request in process."""
    result = []
    start = time.perf_counter()
    first = None
    for chunk in llm.stream(prompt, SamplingParams(max_new_tokens=max_new_tokens), extra, result):
        if first is None and chunk.text:
            first = time.perf_counter() - start
    total = time.perf_counter() - start
    return first or total, total, len(result[0].token_ids), result[0].text


def run_server(http: httpx.Client, prompt, extra: dict, max_new_tokens: int) -> tuple[float, float, int, str]:
    """The same through the server: SSE chunks until [DONE], usage from the include_usage chunk."""
    chat = not isinstance(prompt, str)
    body = {"messages" if chat else "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, **extra}
    start = time.perf_counter()
    first, text, tokens = None, [], 0
    with http.stream("POST", "/v1/chat/completions" if chat else "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event["choices"]:
                piece = choice["delta"].get("content") if chat else choice["text"]
                if piece:
                    first = first if first is not None else time.perf_counter() - start
                    text.append(piece)
    total = time.perf_counter() - start
    return first or total, total, tokens, "".join(text)


def start_server(args, port: int, env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "speclite.cli", "serve", "--model", args.model, "--sp-type", args.sp_type,
           "--gen-num-per-cycle", args.k, "--port", str(port)] + (["--draft", args.draft] if args.draft else [])
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            sys.exit(f"the server exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit("the server did not come up in 300 s")
        time.sleep(0.2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-code")
    ap.add_argument("--sp-type", default="vanilla")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--k", default="4")
    ap.add_argument("--prompts", default="builtin")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads for both (OMP_NUM_THREADS for the server)")
    args = ap.parse_args()

    env = dict(os.environ)
    if args.threads:
        torch.set_num_threads(args.threads)
        env["OMP_NUM_THREADS"] = str(args.threads)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = start_server(args, port, env)
    try:
        llm = LLM(args.model, SpecConfig(args.sp_type, args.k, args.draft))
        prompts = load_prompts(args.prompts)
        runs = {"api": [], "server": []}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
            paths = {"api": lambda p: run_api(llm, p.prompt, p.extra, args.max_new_tokens),
                     "server": lambda p: run_server(http, p.prompt, p.extra, args.max_new_tokens)}
            for p in prompts[:1]:  # warm-up
                paths["api"](p), paths["server"](p)
            mismatches = 0
            for rep in range(args.repeats):
                for i, p in enumerate(prompts):
                    order = ("api", "server") if (rep + i) % 2 == 0 else ("server", "api")
                    got = {name: paths[name](p) for name in order}
                    mismatches += got["api"][3] != got["server"][3]
                    for name in order:
                        runs[name].append(got[name])
    finally:
        proc.terminate()
        proc.wait(30)

    def medians(rows):
        return statistics.median(r[0] for r in rows), statistics.median(r[2] / r[1] for r in rows)

    api, server = medians(runs["api"]), medians(runs["server"])
    table = Table(title=f"serve vs Python API: {llm.describe()}, {len(prompts)} prompts x {args.repeats}, "
                        f"{args.max_new_tokens} new tokens", title_justify="left")
    for col in ("path", "TTFT ms (median)", "tokens/s (median)"):
        table.add_column(col, justify="left" if col == "path" else "right")
    table.add_row("Python API (LLM.stream)", f"{api[0] * 1e3:.1f}", f"{api[1]:.1f}")
    table.add_row("speclite serve (HTTP SSE)", f"{server[0] * 1e3:.1f}", f"{server[1]:.1f}")
    table.add_row("server / API", f"{server[0] / api[0]:.2f}x", f"{server[1] / api[1]:.2f}x")
    console = Console()
    console.print(table)
    console.print(f"greedy texts identical on both paths: {len(runs['api']) - mismatches}/{len(runs['api'])}")


if __name__ == "__main__":
    main()

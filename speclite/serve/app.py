"""The FastAPI app: OpenAI routes, auth, errors as OpenAI error bodies, SSE streaming, /health, /metrics."""

from __future__ import annotations

import asyncio
import json
import secrets
import time

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from speclite.api import SamplingParams
from speclite.serve.metrics import Metrics
from speclite.serve.protocol import ApiError, chunk, new_id, response, to_request
from speclite.serve.worker import EngineWorker, Job


# A proxy must pass the events on as they come, not buffer the stream.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def create_app(llm, served_name: str, api_key: str | None = None, max_queue: int = 8,
               defaults: SamplingParams | None = None) -> FastAPI:
    """An app serving `llm` as model `served_name`; `defaults` fill the sampling fields a request leaves out."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    defaults = defaults or SamplingParams()
    metrics = Metrics()
    worker = EngineWorker(llm, max_queue, metrics)
    registry = CollectorRegistry()
    registry.register(metrics.collector(lambda: worker.waiting, lambda: worker.running))
    app = FastAPI(title="speclite", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker = worker  # `serve` stops it first when the server is told to stop
    started = int(time.time())

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return JSONResponse(e.body(), e.status, headers=e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):  # unknown route, wrong method
        return JSONResponse(ApiError(str(e.detail), e.status_code).body(), e.status_code)

    @app.exception_handler(Exception)
    async def server_error(request, e: Exception):  # a bug: this request fails, the server goes on
        return JSONResponse(ApiError(f"internal error: {type(e).__name__}", 500, kind="server_error").body(), 500)

    async def authorize(request: Request):
        scheme, _, sent = request.headers.get("authorization", "").partition(" ")
        if api_key and not (scheme.lower() == "bearer" and secrets.compare_digest(sent.encode(), api_key.encode())):
            raise ApiError("missing or wrong API key: send 'Authorization: Bearer KEY'", 401,
                           kind="authentication_error")

    # /health and /metrics stay open (probes and scrapers); the API needs the key when one is set.
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorize)])

    @app.get("/health")
    async def health():
        if not worker.thread.is_alive():
            return JSONResponse({"status": "engine stopped"}, 503)
        return {"status": "ok", "waiting": worker.waiting, "running": worker.running}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    model = {"id": served_name, "object": "model", "created": started, "owned_by": "speclite",
             "max_model_len": llm.max_len}

    def served(name: str) -> None:
        if name != served_name:
            raise ApiError(f"model '{name}' is not served here: this server serves '{served_name}'", 404,
                           param="model", code="model_not_found")

    @v1.get("/models")
    async def models():
        return {"object": "list", "data": [model]}

    @v1.get("/models/{name:path}")
    async def one_model(name: str):
        served(name)
        return model

    @v1.post("/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    @v1.post("/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    app.include_router(v1)

    async def complete(request: Request, chat: bool):
        try:
            body = json.loads(await request.body(), parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            metrics.count("invalid")
            why = "nested too deeply" if isinstance(e, RecursionError) else e
            raise ApiError(f"the request body is not valid JSON: {why}") from None
        try:
            req = to_request(body, chat, defaults)
            if body.get("model") is not None:
                served(body["model"])
        except ApiError:
            metrics.count("invalid")
            raise
        job = worker.submit(req)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        handed_to_stream = False
        try:
            kind, value = await job.events.get()  # the first chunk, or why the request could not start
            if kind == "error":
                raise value
            rid = new_id(chat)
            if req.stream:
                handed_to_stream = True
                events = _sse(chat, rid, served_name, job, (kind, value), req.include_usage, watcher)
                return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
            while kind == "chunk":
                kind, value = await job.events.get()
            if kind == "error":
                raise value
            return response(chat, rid, served_name, value)
        finally:
            if not handed_to_stream:
                job.cancel()
                watcher.cancel()

    return app


async def _sse(chat: bool, rid: str, model: str, job: Job, first, include_usage: bool, watcher):
    """Server-sent events in OpenAI's chunk format: role, content deltas, finish reason, usage, [DONE]."""
    try:
        if chat:
            yield _event(chunk(chat, rid, model, role=True))
        kind, value = first
        while kind == "chunk":
            if value.text:
                yield _event(chunk(chat, rid, model, text=value.text))
            kind, value = await job.events.get()
        if kind == "error":  # failed after streaming began: the status line is already sent
            yield _event(value.body())
        else:
            yield _event(chunk(chat, rid, model, finish_reason=value.finish_reason))
            if include_usage:
                yield _event(chunk(chat, rid, model, result=value))
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()
        watcher.cancel()


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """Cancel the job when the client goes away, whether it is waiting, generating or streaming."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")

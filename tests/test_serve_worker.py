"""The server's queue in front of the one engine: a client that leaves while waiting frees its place at
once, not when the engine thread reaches its job."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from speclite.engine.stats import RequestStats
from speclite.sampling import SamplingParams
from speclite.serve.metrics import Metrics
from speclite.serve.protocol import ApiError, ApiRequest
from speclite.serve.worker import EngineWorker


class HeldEngine:
    """An LLM whose every stream blocks until released: the engine stays busy as long as the test likes."""

    def __init__(self):
        self.release, self.started = threading.Event(), threading.Event()

    def stream(self, prompt, params, extra, result):
        self.started.set()
        self.release.wait(60)
        result.append(SimpleNamespace(prompt_len=1, stats=RequestStats()))
        yield from ()


def test_clients_that_leave_while_waiting_free_their_places_at_once():
    engine = HeldEngine()

    async def scenario():
        worker = EngineWorker(engine, max_queue=2, metrics=Metrics())
        request = ApiRequest("p", SamplingParams(), {}, False, False)
        running = worker.submit(request)
        await asyncio.get_running_loop().run_in_executor(None, engine.started.wait, 30)
        waiting = [worker.submit(request) for _ in range(2)]
        with pytest.raises(ApiError, match="the server is busy: 2 requests are already waiting"):
            worker.submit(request)
        for job in waiting:
            job.cancel()
        assert worker.waiting == 0 and worker.running == 1
        queued = [worker.submit(request) for _ in range(2)]  # places, though the engine is still busy
        assert worker.waiting == 2
        engine.release.set()
        for job in [running, *queued]:
            assert (await asyncio.wait_for(job.events.get(), 30))[0] == "done"
        for job in waiting:
            kind, error = await asyncio.wait_for(job.events.get(), 30)
            assert kind == "error" and error.status == 499

    asyncio.run(scenario())

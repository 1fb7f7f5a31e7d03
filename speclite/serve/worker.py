"""One engine, one request at a time: a bounded queue in front of the thread that runs the LLM."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections import deque
from dataclasses import dataclass, field

from speclite.errors import ContextLengthError, SpecliteError
from speclite.serve.metrics import Metrics
from speclite.serve.protocol import ApiError, ApiRequest


def stopping_error(detail: str = "") -> ApiError:
    return ApiError(f"the server is stopping{detail}", status=503, kind="server_error")


@dataclass
class Job:
    """One request's handle: events flow from the engine thread to the request's event loop."""

    request: ApiRequest
    loop: asyncio.AbstractEventLoop
    # ("chunk", Chunk) per iteration, then ("done", RequestOutput) or ("error", exception)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def emit(self, kind: str, value) -> None:
        if not self.loop.is_closed():  # (the server stopped: nobody listens)
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))

    def cancel(self) -> None:
        """The client is gone: the engine stops this request after its current iteration."""
        self.cancelled.set()


class EngineWorker:
    """Runs queued jobs on one thread, in arrival order; at most `max_queue` wait behind the running one."""

    def __init__(self, llm, max_queue: int, metrics: Metrics):
        self.llm, self.metrics, self.max_queue = llm, metrics, max_queue
        # The waiting jobs; one whose client left still sits here until the engine thread reaches it,
        # but holds no place in the queue (`waiting` counts the others).
        self.jobs: deque[Job] = deque()
        self.arrived = threading.Condition()
        self.running, self.current, self.stopping = 0, None, False  # current: the job being generated
        # In the starting command's context: its errors name the server's own flags (speclite.errors).
        self.thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run,), name="speclite-engine",
                                       daemon=True)
        self.thread.start()

    @property
    def waiting(self) -> int:
        with self.arrived:
            return sum(not job.cancelled.is_set() for job in self.jobs)

    def submit(self, request: ApiRequest) -> Job:
        job = Job(request, asyncio.get_running_loop())
        with self.arrived:
            if self.stopping:
                raise stopping_error()
            # (the condition's lock is reentrant) An idle engine is about to take the first waiting job.
            if self.waiting - (self.current is None) >= self.max_queue:
                self.metrics.count("rejected")
                raise ApiError(f"the server is busy: {self.max_queue} requests are already waiting; retry shortly",
                               status=429, kind="rate_limit_error", headers={"Retry-After": "1"})
            self.jobs.append(job)
            self.arrived.notify()
        return job

    def stop(self) -> None:
        """The server is stopping: every request ends now (the running one after its current iteration,
        the waiting ones unrun), so its handlers answer and the shutdown waits for no generation."""
        with self.arrived:
            self.stopping = True
            for job in self.jobs:
                job.cancel()
            if self.current is not None:
                self.current.cancel()

    def _run(self) -> None:
        while True:
            with self.arrived:
                while not self.jobs:
                    self.arrived.wait()
                job = self.current = self.jobs.popleft()  # (stop() reaches it, queued or running)
            if job.cancelled.is_set():  # its client left, or the server stops, while it waited: run nothing
                self.metrics.count("cancelled")
                job.emit("error", stopping_error() if self.stopping else ApiError("the client went away", 499))
                self.current = None
                continue
            self.running = 1
            try:
                self._generate(job)
            finally:
                self.running, self.current = 0, None

    def _generate(self, job: Job) -> None:
        req, result = job.request, []
        try:
            chunks = self.llm.stream(req.prompt, req.params, req.extra, result)
            try:
                for chunk in chunks:
                    if job.cancelled.is_set():
                        break
                    job.emit("chunk", chunk)
            finally:
                chunks.close()  # the engine's bookkeeping (cached prefix, stats) for a stopped request
        except SpecliteError as e:  # the request cannot run (e.g. longer than the context): a 400
            self.metrics.count("invalid")
            code = "context_length_exceeded" if isinstance(e, ContextLengthError) else None
            job.emit("error", ApiError(str(e), code=code))
            return
        except Exception as e:  # a bug or out of memory: this request fails, the server goes on
            self.metrics.count("failed")
            job.emit("error", ApiError(f"generation failed: {type(e).__name__}: {e}", status=500,
                                       kind="server_error"))
            return
        self.metrics.finished(result[0], cancelled=job.cancelled.is_set())
        if self.stopping and result[0].finish_reason == "abort":  # cut short: no answer to pass for a whole one
            job.emit("error", stopping_error(": the answer was cut short"))
            return
        job.emit("done", result[0])

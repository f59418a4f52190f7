"""One engine call for the requests of many episodes: the gateway's batching of a sync engine.

paravt's engines are batched and synchronous (one `generate` call for a list of requests). The
gateway's episodes arrive one request at a time from concurrent agent programs; the batcher
collects what arrived within `wait_s` (up to `max_batch`), makes one `generate` call per distinct
`SamplingParams` on a single worker thread (engines are not thread-safe), and hands each episode
its output with the weight version after the call. The event loop never blocks on the engine.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from paravt.rollout.engine import GenerationOutput, GenerationRequest, RolloutEngine, SamplingParams


class Batcher:
    """Async front of a `RolloutEngine`: `await generate(request, params)`."""

    def __init__(self, engine: RolloutEngine, max_batch: int = 64, wait_s: float = 0.005):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.engine = engine
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.batches = 0  # engine calls made (tests and metrics read it)
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="paravt-gateway-engine")

    async def generate(
        self, request: GenerationRequest, params: SamplingParams
    ) -> tuple[GenerationOutput, int]:
        """The request's one output and the engine's weight version after its call."""
        if self._task is None or self._task.done():
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._run())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((request, params, future))
        return await future

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(self.wait_s)
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            groups = defaultdict(list)
            for item in batch:
                groups[item[1]].append(item)
            for params, items in groups.items():
                await self._call(params, items)

    async def _call(self, params: SamplingParams, items) -> None:
        live = [it for it in items if not it[2].done()]  # cancelled: the client went away
        if not live:
            return
        loop = asyncio.get_running_loop()
        try:
            outs, version = await loop.run_in_executor(
                self._pool, self._generate, [it[0] for it in live], params
            )
        except Exception as err:  # every waiting episode gets the engine's error
            for it in live:
                if not it[2].done():
                    it[2].set_exception(err)
            return
        for it, out in zip(live, outs, strict=True):
            if not it[2].done():
                it[2].set_result((out[0], version))

    def _generate(self, requests, params):
        self.batches += 1
        outs = self.engine.generate(requests, params)
        return outs, int(getattr(self.engine, "weight_version", 0))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

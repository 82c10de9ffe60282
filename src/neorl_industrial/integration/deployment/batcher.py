"""Micro-batching: concurrent requests answered by one compiled call.

Requests put their rows on a queue and wait. One task takes the first request, then
everything that arrives within ``max_wait`` seconds (or while the previous batch was
running) up to ``max_batch`` rows, runs the policy once on a worker thread (the event
loop keeps accepting requests), and hands each request its slice of the result. When
the shared call fails, each request is run on its own, so a request whose rows break
the policy fails alone and the others get their actions.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["MicroBatcher"]


@dataclasses.dataclass
class _Item:
    observations: np.ndarray  # [rows, obs]
    prev_actions: np.ndarray | None  # [rows, act] or None (unknown: rate limits off)
    future: asyncio.Future


class MicroBatcher:
    """Batches ``predict(observations, prev_actions)`` calls across concurrent requests.

    Args:
        predict: called on a worker thread with ``[rows, obs]`` and ``[rows, act]`` arrays;
            returns an object whose array fields have the rows on their first axis.
        action_size: width of the previous actions (unknown, NaN, for requests that send
            none: the shield leaves their rate limits out).
        max_batch: most rows in one call.
        max_wait: seconds to wait for more requests after the first (0: only take what
            is already waiting).
        on_batch: called (on the worker thread) with each call's row count.
        arriving: the number of requests that have arrived but not yet submitted (still
            being read or parsed); the batcher waits for more only while there are such
            requests, so a lone request never waits.
    """

    def __init__(
        self,
        predict: Callable[[np.ndarray, np.ndarray], Any],
        *,
        action_size: int,
        max_batch: int,
        max_wait: float,
        on_batch: Callable[[int], None] | None = None,
        arriving: Callable[[], int] | None = None,
    ) -> None:
        self.predict = predict
        self.action_size = action_size
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.on_batch = on_batch
        self.arriving = arriving
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._carry: collections.deque[_Item] = collections.deque()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="micro-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for item in [*self._carry, *self._drain()]:
            if not item.future.done():
                item.future.set_exception(RuntimeError("the server is shutting down"))
        self._executor.shutdown(wait=True)

    async def submit(self, observations: np.ndarray, prev_actions: np.ndarray | None) -> Any:
        """The decision for these rows (a batch of one or more)."""
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Item(observations, prev_actions, future))
        return await future

    async def barrier(self) -> None:
        """Returns once the call running on the policy thread, if any, has finished."""
        await asyncio.get_running_loop().run_in_executor(self._executor, lambda: None)

    def _drain(self) -> list[_Item]:
        items = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except asyncio.QueueEmpty:
                return items

    def _take(self, items: list[_Item]) -> tuple[list[_Item], int]:
        """Items that fit in one call; the rest wait for the next."""
        self._carry.extend(items)
        taken: list[_Item] = []
        rows = 0
        while self._carry:
            size = len(self._carry[0].observations)
            if taken and rows + size > self.max_batch:
                break
            taken.append(self._carry.popleft())
            rows += size
        return taken, rows

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._carry:
                self._carry.append(await self._queue.get())
            waiting = self._drain()
            rows = sum(len(item.observations) for item in [*self._carry, *waiting])
            if rows < self.max_batch and self.max_wait > 0 and self._more_coming():
                deadline = loop.time() + self.max_wait
                while loop.time() < deadline and self._more_coming():
                    await asyncio.sleep(0)  # let the event loop parse the other requests
                    waiting += self._drain()
            batch, rows = self._take(waiting)
            batch = [item for item in batch if not item.future.cancelled()]
            if not batch:
                continue
            try:
                decision = await self._decide(loop, batch)
            except Exception as error:
                if len(batch) == 1:
                    _fail(batch[0], error)
                    continue
                # One request's rows broke the shared call: each request is retried on its
                # own, so only the one that fails gets the error.
                for item in batch:
                    try:
                        _answer(item, await self._decide(loop, [item]))
                    except Exception as own_error:
                        _fail(item, own_error)
                continue
            start = 0
            for item in batch:
                stop = start + len(item.observations)
                if not item.future.done():
                    item.future.set_result(_rows(decision, start, stop))
                start = stop

    async def _decide(self, loop: asyncio.AbstractEventLoop, batch: list[_Item]) -> Any:
        observations = np.concatenate([item.observations for item in batch])
        prev = None
        if any(item.prev_actions is not None for item in batch):
            prev = np.concatenate(
                [
                    item.prev_actions
                    if item.prev_actions is not None
                    else np.full((len(item.observations), self.action_size), np.nan, np.float32)
                    for item in batch
                ]
            )
        return await loop.run_in_executor(self._executor, self._call, observations, prev)

    def _more_coming(self) -> bool:
        return self.arriving is None or self.arriving() > 0

    def _call(self, observations: np.ndarray, prev: np.ndarray | None) -> Any:
        decision = self.predict(observations, prev)
        if self.on_batch is not None:
            self.on_batch(len(observations))
        return decision


def _answer(item: _Item, decision: Any) -> None:
    if not item.future.done():
        item.future.set_result(decision)


def _fail(item: _Item, error: BaseException) -> None:
    if not item.future.done():
        item.future.set_exception(error)


def _rows(decision: Any, start: int, stop: int) -> Any:
    """The rows ``start:stop`` of every array field of a decision dataclass."""
    fields = {}
    for field in dataclasses.fields(decision):
        value = getattr(decision, field.name)
        fields[field.name] = value[start:stop] if isinstance(value, np.ndarray) else value
    return dataclasses.replace(decision, **fields)

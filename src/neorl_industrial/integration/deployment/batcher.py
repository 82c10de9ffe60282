"""Micro-batching: concurrent requests answered by one compiled call.

Requests put their rows on a queue and wait. One task takes the first request, then
everything that arrives within ``max_wait`` seconds (or while the previous batch was
running) up to ``max_batch`` rows, runs the policy once, and hands each request its
slice of the result. A batch of more than ``loop_rows`` rows runs on a worker thread (the
event loop keeps accepting requests meanwhile); a smaller one on the event loop, where
it takes less than the hop to the worker thread and back, and than the two threads
taking turns at the interpreter lock while the worker unpacks the call's result. When
the shared call fails, each request is run on its own, so a request whose rows break
the policy fails alone and the others get their actions.

A request that is the only one being answered and finds the batcher idle (nothing
queued, no call running) is decided at once on the event loop: there is nothing to batch
it with, and the hop to the worker thread and back costs more than the call itself.

Requests that send previous actions and requests that leave them out (unknown: the
shield leaves their rate limits out) are decided in separate calls of the same batch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["MicroBatcher"]


@dataclasses.dataclass
class _Item:
    observations: np.ndarray  # [rows, obs]
    prev_actions: np.ndarray | None  # [rows, act] or None (unknown: rate limits off)
    future: asyncio.Future | None  # None: decided at once, on the event loop


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
        arriving: the number of requests that have arrived but not yet submitted (being
            parsed); the batcher waits for more only while there are such requests, so a
            lone request never waits.
        alone: whether the submitting request is the only one being answered; such a
            request, finding the batcher idle, is decided at once on the event loop.
            None: every request goes through the batch.
        loop_rows: batches of at most this many rows are decided on the event loop,
            larger ones on the worker thread (0: every batch on the worker thread).
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
        alone: Callable[[], bool] | None = None,
        loop_rows: int = 0,
    ) -> None:
        self.predict = predict
        self.action_size = action_size
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.on_batch = on_batch
        self.arriving = arriving
        self.alone = alone
        self.loop_rows = loop_rows
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._carry: collections.deque[_Item] = collections.deque()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy")
        self._task: asyncio.Task | None = None
        self._busy = False  # a call is running on the worker thread
        self._stopped = False

    def start(self) -> None:
        # The loop, looked up once: asyncio's lookup asks the system for the process id
        # every time (a system call per request).
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="micro-batcher")

    async def stop(self) -> None:
        self._stopped = True
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
        if self._stopped:
            raise RuntimeError("the server is shutting down")
        if self._idle():
            return self._one(observations, prev_actions)
        future = self._loop.create_future()
        self._queue.put_nowait(_Item(observations, prev_actions, future))
        return await future

    def _idle(self) -> bool:
        return (
            self.alone is not None
            and not self._busy
            and not self._carry
            and self._queue.empty()
            and self.alone()
        )

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
                decisions = await self._decide(loop, batch)
            except Exception as error:
                if len(batch) == 1:
                    _fail(batch[0], error)
                    continue
                # One request's rows broke the shared call: each request is retried on its
                # own, so only the one that fails gets the error.
                for item in batch:
                    try:
                        _answer(item, (await self._decide(loop, [item]))[0])
                    except Exception as own_error:
                        _fail(item, own_error)
                continue
            for item, decision in zip(batch, decisions, strict=True):
                _answer(item, decision)

    async def _decide(self, loop: asyncio.AbstractEventLoop, batch: list[_Item]) -> list[Any]:
        if sum(len(item.observations) for item in batch) <= self.loop_rows:
            return self._call(batch)
        self._busy = True
        try:
            return await loop.run_in_executor(self._executor, self._call, batch)
        finally:
            self._busy = False

    def _more_coming(self) -> bool:
        return self.arriving is None or self.arriving() > 0

    def _one(self, observations: np.ndarray, prev_actions: np.ndarray | None) -> Any:
        """One request's decision: one policy call, nothing to group or split."""
        decision = self.predict(observations, prev_actions)
        if self.on_batch is not None:
            self.on_batch(len(observations))
        return decision

    def _call(self, batch: list[_Item]) -> list[Any]:
        """Each item's decision: one policy call for the items with previous actions, one
        for those without (an unknown previous action is not a number the policy takes)."""
        if len(batch) == 1:
            return [self._one(batch[0].observations, batch[0].prev_actions)]
        decisions: list[Any] = [None] * len(batch)
        for known in (True, False):
            group = [i for i, item in enumerate(batch) if (item.prev_actions is not None) is known]
            if not group:
                continue
            if len(group) == 1:
                item = batch[group[0]]
                observations, prev = item.observations, item.prev_actions
            else:
                observations = np.concatenate([batch[i].observations for i in group])
                prev = np.concatenate([batch[i].prev_actions for i in group]) if known else None
            decision = self.predict(observations, prev)
            if self.on_batch is not None:
                self.on_batch(len(observations))
            if len(group) == 1:
                decisions[group[0]] = decision
                continue
            start = 0
            for i in group:
                stop = start + len(batch[i].observations)
                decisions[i] = _rows(decision, start, stop)
                start = stop
        return decisions


def _answer(item: _Item, decision: Any) -> None:
    if not item.future.done():
        item.future.set_result(decision)


def _fail(item: _Item, error: BaseException) -> None:
    if not item.future.done():
        item.future.set_exception(error)


def _rows(decision: Any, start: int, stop: int) -> Any:
    """The rows ``start:stop`` of every array field of a decision dataclass."""
    rows = slice(start, stop)
    values = {}
    for name in _init_fields(type(decision)):
        value = getattr(decision, name)
        values[name] = value[rows] if isinstance(value, np.ndarray) else value
    return type(decision)(**values)


@functools.cache
def _init_fields(cls: type) -> tuple[str, ...]:
    """The fields a decision dataclass's constructor takes (looked up once per class)."""
    return tuple(field.name for field in dataclasses.fields(cls) if field.init)

"""The micro-batcher on its own: a lone request decided at once on the event loop,
concurrent ones batched (on the event loop up to ``loop_rows`` rows, on the worker thread
past it), requests with and without previous actions decided in separate calls of the
same batch, a failing request failing alone."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import numpy as np
import pytest

from neorl_industrial.integration.deployment.batcher import MicroBatcher


@dataclasses.dataclass
class _Decision:
    action: np.ndarray
    known_prev: np.ndarray
    label: str = "decision"


class _Policy:
    """Records every call: its rows, whether it had previous actions, and its thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool, str]] = []

    def __call__(self, observations: np.ndarray, prev: np.ndarray | None) -> _Decision:
        if prev is not None:
            assert np.isfinite(prev).all(), "an unknown previous action reached the policy"
        if (observations == -1).any():
            raise ValueError("poisoned row")
        self.calls.append((len(observations), prev is not None, threading.current_thread().name))
        known = np.full(len(observations), prev is not None)
        return _Decision(action=observations[:, :1] * 2, known_prev=known)


def _batcher(policy: _Policy, alone: bool | None) -> MicroBatcher:
    return MicroBatcher(
        policy, action_size=1, max_batch=64, max_wait=0.0,
        alone=None if alone is None else (lambda: alone),
    )  # fmt: skip


def _rows(values, width: int = 2) -> np.ndarray:
    return np.tile(np.asarray(values, np.float32)[:, None], (1, width))


def test_a_lone_request_is_decided_on_the_event_loop():
    async def main():
        policy = _Policy()
        batcher = _batcher(policy, alone=True)
        batcher.start()
        decision = await batcher.submit(_rows([3.0]), None)
        await batcher.stop()
        return policy, decision

    policy, decision = asyncio.run(main())
    assert decision.action.tolist() == [[6.0]]
    assert policy.calls == [(1, False, threading.main_thread().name)]


def test_concurrent_requests_are_batched_with_and_without_previous_actions_apart():
    async def main():
        policy = _Policy()
        batcher = _batcher(policy, alone=None)  # no protocol count: always batched
        batcher.start()
        submits = [
            batcher.submit(_rows([float(i)]), _rows([0.5], 1) if i % 2 else None) for i in range(8)
        ]
        decisions = await asyncio.gather(*submits)
        await batcher.stop()
        return policy, decisions

    policy, decisions = asyncio.run(main())
    for i, decision in enumerate(decisions):  # each request gets its own row back
        assert decision.action.tolist() == [[2.0 * i]]
        assert decision.known_prev.tolist() == [bool(i % 2)]
    assert sorted(policy.calls) == [
        (4, False, "policy_0"),
        (4, True, "policy_0"),
    ]


def test_a_small_batch_is_decided_on_the_event_loop_and_a_larger_one_on_the_worker():
    async def main():
        policy = _Policy()
        batcher = MicroBatcher(policy, action_size=1, max_batch=64, max_wait=0.0, loop_rows=4)
        batcher.start()
        small = await asyncio.gather(*(batcher.submit(_rows([float(i)]), None) for i in range(4)))
        large = await asyncio.gather(*(batcher.submit(_rows([float(i)]), None) for i in range(5)))
        await batcher.stop()
        return policy, small, large

    policy, small, large = asyncio.run(main())
    assert [decision.action.tolist() for decision in small] == [[[2.0 * i]] for i in range(4)]
    assert [decision.action.tolist() for decision in large] == [[[2.0 * i]] for i in range(5)]
    assert policy.calls == [(4, False, threading.main_thread().name), (5, False, "policy_0")]


def test_a_failing_request_fails_alone_in_a_batch():
    async def main():
        policy = _Policy()
        batcher = _batcher(policy, alone=False)
        batcher.start()
        values = [1.0, -1.0, 2.0]
        results = await asyncio.gather(
            *(batcher.submit(_rows([v]), None) for v in values), return_exceptions=True
        )
        await batcher.stop()
        return results

    first, poisoned, third = asyncio.run(main())
    assert first.action.tolist() == [[2.0]] and third.action.tolist() == [[4.0]]
    assert isinstance(poisoned, ValueError) and "poisoned" in str(poisoned)


def test_after_stop_a_request_is_refused():
    async def main():
        batcher = _batcher(_Policy(), alone=True)
        batcher.start()
        await batcher.stop()
        await batcher.submit(_rows([1.0]), None)

    with pytest.raises(RuntimeError, match="shutting down"):
        asyncio.run(main())

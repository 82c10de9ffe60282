"""Hot reload does not grow the server's memory: the old policy's compiled executables
and buffers are released (RSS of this process, the server running in it)."""

from __future__ import annotations

import collections
import gc
import os
import threading

import pytest
from fastapi.testclient import TestClient

from neorl_industrial.integration.deployment import create_app
from tests.integration.deployment.test_server import AS_ACT, AS_ADMIN, _settings, policies

__all__ = ["policies"]  # the fixture, shared with test_server


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reload_under_light_load(tmp_path, policies, reloads: int) -> tuple[list[int], list[int]]:
    """RSS after each reload (alternating two versions) and the failed requests' codes."""
    settings = _settings(tmp_path, policies["a"], tune_gc=True)
    failures: list[int] = []
    sizes: list[int] = []
    with TestClient(create_app(settings)) as client:
        stop = threading.Event()

        def light_load():
            while not stop.is_set():
                response = client.post("/v1/act", json={"observation": [50.0] * 6}, headers=AS_ACT)
                if response.status_code != 200:
                    failures.append(response.status_code)
                stop.wait(0.005)

        worker = threading.Thread(target=light_load)
        worker.start()
        try:
            for index in range(reloads):
                model = str(policies["b" if index % 2 == 0 else "a"])
                response = client.post("/v1/admin/reload", json={"model": model}, headers=AS_ADMIN)
                assert response.status_code == 200, response.text
                sizes.append(rss_bytes())
        finally:
            stop.set()
            worker.join()
    return sizes, failures


@pytest.mark.slow  # ~50 s; the 50-reload test below checks a stricter bound, also slow
def test_ten_reloads_grow_memory_by_little(tmp_path, policies):
    sizes, failures = _reload_under_light_load(tmp_path, policies, 10)
    print("RSS MiB after each reload:", [round(size / 2**20) for size in sizes])
    assert failures == []
    # Both versions have been served once by the third reload; from then on, a reload
    # frees what the one before it loaded (before the fix: ~37 MiB more per reload).
    assert sizes[-1] <= sizes[2] * 1.05
    assert sizes[-1] - sizes[2] < 16 * 2**20


def test_a_reload_keeps_the_served_policy_compiled(tmp_path, policies):
    """Releasing the replaced policy clears JAX's tracing caches; the policy being served
    keeps its compiled executables, so no request traces or compiles again."""
    settings = _settings(tmp_path, policies["a"])
    with TestClient(create_app(settings)) as client:
        response = client.post(
            "/v1/admin/reload", json={"model": str(policies["b"])}, headers=AS_ADMIN
        )
        assert response.status_code == 200, response.text
        served = client.app.state.serving.policy.artifact
        warmed = served.traced_batch_sizes
        assert sorted(warmed) == sorted(settings.batch_sizes)
        for rows in (1, 3, 16):
            batch = {"observations": [[50.0] * 6] * rows}
            assert client.post("/v1/act/batch", json=batch, headers=AS_ACT).status_code == 200
        assert served.traced_batch_sizes == warmed


@pytest.mark.slow
def test_fifty_reloads_stay_within_ten_percent_of_the_first(tmp_path, policies):
    sizes, failures = _reload_under_light_load(tmp_path, policies, 50)
    print("RSS MiB after each reload:", [round(size / 2**20) for size in sizes])
    assert failures == []
    # The target: RSS after 50 reloads within 10 % of RSS after the first.
    # Measured: 476 MiB after reload 1, 482 after 50 (+1.3 %); before the tracing caches
    # were cleared on reload: 557 and 631 (+13 %).
    assert sizes[-1] <= sizes[0] * 1.10


#: What one loaded policy keeps alive: its verified artifact, the server's check, the
#: deserialized functions and the jitted functions that hold its compiled executables.
_PER_POLICY = ("LoadedPolicy", "PolicyArtifact", "ServerCheck", "Exported", "PjitFunction")


def _live(names: tuple[str, ...]) -> dict[str, int]:
    gc.unfreeze()  # a server with tune_gc froze what was alive at its start
    gc.collect()
    counts = collections.Counter(type(item).__name__ for item in gc.get_objects())
    return {name: counts[name] for name in names}


def test_reloads_keep_a_bounded_number_of_policies_and_compiled_functions(tmp_path, policies):
    """What leaks per reload, counted directly rather than through the RSS: after the
    first reload and after the third the same number of policies, artifacts, server
    checks, deserialized functions and jitted functions (with their executables) is
    alive, and no more than the served policy and the one it replaced."""
    settings = _settings(tmp_path, policies["a"], batch_sizes=[1, 2], max_batch=2)
    # What this process held before (other tests' artifacts in module fixtures).
    before = _live(_PER_POLICY)
    counts = []
    with TestClient(create_app(settings)) as client:
        for index in range(3):
            model = str(policies["b" if index % 2 == 0 else "a"])
            response = client.post("/v1/admin/reload", json={"model": model}, headers=AS_ADMIN)
            assert response.status_code == 200, response.text
            act = client.post("/v1/act", json={"observation": [50.0] * 6}, headers=AS_ACT)
            assert act.status_code == 200, act.text
            if index in (0, 2):
                now = _live(_PER_POLICY)
                counts.append({name: now[name] - before[name] for name in _PER_POLICY})
    first, last = counts
    assert last == first, f"alive after the first reload {first}, after the third {last}"
    assert last["LoadedPolicy"] <= 2 and last["PolicyArtifact"] <= 2

"""A measured disturbance no action moves (``exogenous: true`` in the plant's schema):
the plant model takes it from the held-out log step by step instead of predicting it, and
so reproduces today's operation where predicting the disturbance cannot. A plant log with
no simulator behind it."""

from __future__ import annotations

import copy
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.models import make_dynamics
from neorl_industrial.wrappers.models import PlantModel
from neorl_industrial.wrappers.training.verdict import (
    PlantRules,
    VerdictCandidates,
    VerdictSettings,
    model_verdict,
)
from neorl_industrial.wrappers.training.verdict_fqe import _behaviour_clone, clone_residuals
from neorl_industrial.wrappers.training.verdict_model import _starts_of
from tests.wrappers.training.heater_plant import act, fitted_plant, write_csv

SCHEMA = """\
name: heater-feed
timestamp: time
sampling_period: 60
observations:
  - {column: temperature, unit: degC, physical: [0, 600]}
  - {column: feed_temp, unit: degC, physical: [-20, 80], exogenous: true}
actions:
  - {column: valve, unit: "%", bounds: [0, 100]}
reward: -abs(temperature - 350) - 0.01 * valve
costs:
  - {name: overheating, expression: "max(temperature - 365, 0)", limit: 5.0}
"""


def write_log(path, episodes: int, steps: int, seed: int = 0) -> None:
    """The heater of ``test_verdict`` with a feed whose temperature wanders (a random
    walk no valve moves) and heats the outlet; the operators' feedback on the outlet."""
    rng = np.random.default_rng(seed)
    seconds, temperature, feed, valve = [], [], [], []
    stamp = 0
    for _ in range(episodes):
        t, f = rng.uniform(335, 365), rng.uniform(0, 40)
        for _ in range(steps + 1):
            v = float(np.clip(50 + 0.8 * (350 - t) + rng.normal(0, 4), 0, 100))
            seconds.append(stamp)
            temperature.append(t)
            feed.append(f)
            valve.append(v)
            t = 0.8 * t + 0.2 * (300 + v) + 0.6 * (f - 20) + rng.normal(0, 0.5)
            f = float(np.clip(f + rng.normal(0, 4), -20, 80))
            stamp += 60
        stamp += 3600
    write_csv(path, seconds, {"temperature": temperature, "feed_temp": feed, "valve": valve})


@pytest.fixture(scope="module")
def plant(tmp_path_factory):
    fitted = fitted_plant(
        tmp_path_factory.mktemp("heater-feed"),
        SCHEMA,
        lambda path: write_log(path, episodes=30, steps=40),
    )
    return fitted["task"], fitted["model"], fitted["scaler"], fitted["heldout"]


def test_the_card_and_the_model_mark_the_feed_given(plant, tmp_path):
    task, model, _, _ = plant
    assert task.exogenous == ("feed_temp",) and model.dynamics.layout.given == (1,)
    assert model.card["layout"]["given"] == [1]
    # The fidelity on held-out episodes takes the feed from the log as a verdict does,
    # and does not score it.
    rows = model.card["fidelity"]["rows"]
    feed = [row for row in rows if row["name"] == "feed_temp"]
    assert feed and all(row["given"] and row["rmse"] is None for row in feed)
    assert all(row["rmse"] is not None for row in rows if row["name"] == "temperature")
    model.save(tmp_path / "model")
    assert PlantModel.load(tmp_path / "model").dynamics.layout.given == (1,)


def test_the_starts_carry_the_logged_feed_step_by_step(plant):
    _, _, _, heldout = plant
    starts = _starts_of(heldout, VerdictSettings(horizon=40, max_starts=20), (1,))
    logged = np.asarray(heldout.next_observations())
    for n, (row, length) in enumerate(zip(starts.rows, starts.lengths, strict=True)):
        np.testing.assert_array_equal(starts.given[n, :length], logged[row : row + length])
        assert np.all(starts.given[n, length:] == logged[row + length - 1])  # repeated
    assert (starts.lengths < starts.horizon).any()  # the repetition is exercised
    assert _starts_of(heldout, VerdictSettings(horizon=40, max_starts=20)).given is None


def test_taking_the_feed_from_the_log_reproduces_today_s_operation(plant):
    """One fit judged twice: the feed taken from the log, then predicted by the model
    (the same networks). Predicting a random walk drifts, and the verdict's error on the
    operators and every interval widen with it."""
    task, model, scaler, heldout = plant
    candidates = VerdictCandidates(
        ["controller"], act, {"gain": jnp.asarray([0.8]), "bias": jnp.asarray([0.0])}
    )
    rules = PlantRules(scaler, cost_limits=(5.0,), cost_names=task.cost_names)
    settings = VerdictSettings(fqe=False, horizon=40, bootstrap=300, bc_updates=300)
    given = model_verdict(candidates, heldout, model, rules, settings)
    layout = dataclasses.replace(model.dynamics.layout, given=())
    predicting = copy.copy(model)
    predicting.dynamics = make_dynamics(model.dynamics.config, layout)
    predicted = model_verdict(candidates, heldout, predicting, rules, settings)

    def width(interval):
        return interval.upper - interval.lower

    error, drift = given.calibration.error, predicted.calibration.error
    assert given.calibration.status == "passed"
    # Within the tolerance, and several times narrower than with the feed predicted.
    assert -given.calibration.tolerance <= error.lower <= error.upper <= given.calibration.tolerance
    assert width(drift) > 5 * width(error)
    gain, wide = (v.candidates[0]["estimates"][0]["improvement"] for v in (given, predicted))
    assert wide["upper"] - wide["lower"] > 3 * (gain["upper"] - gain["lower"])


def test_the_operators_own_deviations_can_be_replayed_on_the_clone(plant):
    """``replay_residuals``: today's operation in the model is the clone plus what the
    operators did beyond it, step by step along each start's logged steps; the residuals
    are exactly the logged actions less the clone's."""
    task, model, scaler, heldout = plant
    settings = VerdictSettings(fqe=False, horizon=40, bootstrap=300, bc_updates=300)
    clone = _behaviour_clone(heldout, settings)
    residuals = clone_residuals(clone, heldout)
    means = np.stack(
        [
            np.asarray(clone.act(clone.params, o, None, deterministic=True))
            for o in np.asarray(heldout.transition_observations())
        ]
    )
    np.testing.assert_allclose(residuals + means, np.asarray(heldout.actions), atol=1e-6)
    candidates = VerdictCandidates(
        ["controller"], act, {"gain": jnp.asarray([0.8]), "bias": jnp.asarray([0.0])}
    )
    rules = PlantRules(scaler, cost_limits=(5.0,), cost_names=task.cost_names)
    replayed = model_verdict(
        candidates, heldout, model, rules, dataclasses.replace(settings, replay_residuals=True)
    )
    noisy = model_verdict(candidates, heldout, model, rules, settings)
    assert replayed.settings["replay_residuals"] and replayed.calibration is not None
    # The same clone and model, another baseline: the operators' estimate moves.
    assert replayed.calibration.estimated.value != noisy.calibration.estimated.value

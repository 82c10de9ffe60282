"""The Agent facade: fit, shielded predict, evaluate, save/load round trip, export, and
clear errors for what does not fit."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from neorl_industrial.core.safety import satisfies
from neorl_industrial.wrappers.agents import Agent, AgentError, PolicyArtifact
from tests.wrappers.conftest import ib_shaped_dataset

FIT = dict(updates=100, chunk=50, batch_size=32, eval_every=50, eval_episodes=2, eval_horizon=20)


@pytest.fixture(scope="module")
def fitted(ib_data):
    agent = Agent("td3bc-lag", "IB-v0", hidden=(16, 16), cost_limits=[5.0, 5.0])
    agent.fit(ib_data, seeds=[0, 1], **FIT)
    return agent


def test_fit_keeps_every_run_and_predicts_with_the_best(fitted, ib_data):
    assert fitted.fitted and fitted.seeds == [0, 1]
    assert fitted.selected == fitted.result.best_run
    # The safe agent got the limits and the episode length of its environment.
    assert fitted.config.cost_limits == (5.0, 5.0) and fitted.config.episode_length == 1000
    assert fitted.config.obs_mean is not None  # observation statistics of the data
    observations = np.asarray(ib_data.observations[:8])
    batch = fitted.predict(observations)
    assert batch.shape == (8, 3)
    np.testing.assert_allclose(fitted.predict(observations[0]), batch[0], atol=1e-6)
    # Every predicted action keeps the hard constraints given the previous action.
    previous = np.full((8, 3), 0.9, np.float32)
    safe, report = fitted.decide(observations, previous)
    assert bool(
        np.all(
            jax.vmap(satisfies, (None, 0, 0, 0))(fitted.constraints, observations, safe, previous)
        )
    )
    raw, none = fitted.decide(observations, previous, shield_actions=False)
    assert none is None
    overridden = np.asarray(report.overridden)
    np.testing.assert_array_equal(safe[~overridden], raw[~overridden])


def test_save_load_gives_identical_actions_and_returns(fitted, tmp_path, ib_data):
    path = fitted.save(tmp_path / "agent")
    manifest = json.loads((path / "agent.json").read_text())
    assert manifest["algorithm"] == "td3bc-lag" and manifest["cost_limits"] == [5.0, 5.0]
    assert "limit-joint-velocity-gain-push" in manifest["constraints"]
    # The contract is the limits' one holder: saved on its own, taken back as saved.
    assert "cost_limits" not in manifest["hyperparameters"]
    assert "cost_limits" not in manifest["task"] and manifest["limit_sources"] == ["run", "run"]
    loaded = Agent.load(path)
    assert (loaded.cost_limits, loaded.safety.limit_sources) == ([5.0, 5.0], ("run", "run"))
    observations = np.asarray(ib_data.observations[:16])
    previous = np.zeros((16, 3), np.float32)
    np.testing.assert_array_equal(
        loaded.predict(observations, previous), fitted.predict(observations, previous)
    )
    before = fitted.evaluate(3, horizon=30)
    after = loaded.evaluate(3, horizon=30)
    assert [r["return"] for r in after["runs"]] == [r["return"] for r in before["runs"]]
    assert before["summary"]["return"]["n"] == 2

    with pytest.raises(AgentError, match="already exists"):
        fitted.save(path)
    assert json.loads((path / "agent.json").read_text()) == manifest
    (path / "policies.msgpack").write_bytes(b"\x00garbage")
    with pytest.raises(AgentError, match=r"policies\.msgpack"):
        Agent.load(path)
    with pytest.raises(AgentError, match="not a saved agent"):
        Agent.load(tmp_path / "nothing")
    (path / "agent.json").write_text(json.dumps({**manifest, "cost_limits": [5.0]}))
    with pytest.raises(AgentError, match=r"agent\.json: cost_limits: 1 limits for the 2 cost"):
        Agent.load(path)


def test_export_serves_the_same_shielded_actions(fitted, tmp_path, ib_data):
    path = fitted.export(tmp_path / "policy")
    artifact = PolicyArtifact.load(path)
    assert artifact.metadata["algorithm"] == "td3bc-lag"
    observations = np.asarray(ib_data.observations[:6])
    previous = np.full((6, 3), -0.5, np.float32)
    decision = artifact.predict(observations, previous)
    np.testing.assert_allclose(decision.action, fitted.predict(observations, previous), atol=1e-5)


def test_data_that_does_not_fit_is_refused_by_name(ib_data):
    agent = Agent("td3bc", "IB-v0", hidden=(8,))
    narrow = ib_data.replace(observations=ib_data.observations[:, :6])
    with pytest.raises(AgentError, match="6 features; IB-v0 has 180"):
        agent.fit(narrow, updates=10, chunk=10)
    lag = Agent("iql-lag", "IB-v0", hidden=(8,), cost_limits=[5.0, 5.0])
    with pytest.raises(AgentError, match="1 cost channels"):
        lag.fit(ib_data.replace(costs=ib_data.costs[:, :1]), updates=10, chunk=10)
    with pytest.raises(AgentError, match="unknown 'td3-bc'"):
        Agent("td3-bc")
    with pytest.raises(AgentError, match=r"env: .*unknown environment"):
        Agent("bc", "IB-v9")
    with pytest.raises(AgentError, match="discrete actions"):
        Agent("discrete-bc", "IB-v0")
    with pytest.raises(AgentError, match="cost_limits: expected one"):
        Agent("td3bc-lag", cost_limits=[1.0])
    with pytest.raises(AgentError, match="hiden"):
        Agent("bc", hiden=(8,))
    with pytest.raises(AgentError, match="fit or load"):
        Agent("bc").predict(np.zeros(180))
    fitted_bc = Agent("bc", hidden=(8,))
    fitted_bc.fit(ib_data, updates=10, chunk=10, evaluate=False)
    with pytest.raises(AgentError, match=r"observation: expected shape \[180\]"):
        fitted_bc.predict(np.zeros(7))
    with pytest.raises(AgentError, match="finite"):
        fitted_bc.predict(np.full(180, np.nan))
    with pytest.raises(AgentError, match="reward_scaling: Input should be 'none', 'std'"):
        fitted_bc.fit(ib_data, updates=10, chunk=10, evaluate=False, reward_scaling="max")


def test_rewards_are_scaled_as_each_algorithm_s_paper_and_recorded(ib_data):
    """IQL trains on rewards times 1000 / the range of episode returns (its paper's
    scaling), the others on rewards divided by their spread; a run may choose."""
    rewards = np.asarray(ib_data.rewards, np.float64)
    returns = np.asarray(ib_data.episode_returns(), np.float64)
    iql = Agent("iql", hidden=(8,))
    iql.fit(ib_data, updates=10, chunk=10, evaluate=False)
    assert iql.result.reward_scaling == "return_range"
    np.testing.assert_allclose(
        iql.result.reward_scale["scale"], 1000.0 / np.ptp(returns), rtol=1e-6
    )
    td3bc = Agent("td3bc", hidden=(8,))
    td3bc.fit(ib_data, updates=10, chunk=10, evaluate=False)
    assert td3bc.result.reward_scale == {
        "kind": "std",
        "shift": 0.0,
        "scale": pytest.approx(1.0 / rewards.std()),
    }
    td3bc.fit(ib_data, updates=10, chunk=10, evaluate=False, reward_scaling="standardize")
    assert td3bc.result.reward_scale["shift"] == pytest.approx(-rewards.mean())


def test_bc_safe_learns_only_from_episodes_within_the_limits():
    data = ib_shaped_dataset(episodes=6, steps=20, seed=3)
    costs = np.zeros((120, 2), np.float32)
    costs[:40, 0] = 1.0  # the first two episodes cost 20 each
    data = data.replace(costs=jax.numpy.asarray(costs))
    agent = Agent("bc-safe", hidden=(8,), cost_limits=[10.0, 10.0])
    agent.fit(data, updates=10, chunk=10, evaluate=False)
    assert agent.result.dataset["used_episodes"] == 4
    with pytest.raises(AgentError, match="bc-safe"):
        Agent("bc-safe", hidden=(8,), cost_limits=[1.0, 1.0]).fit(
            data.replace(costs=jax.numpy.ones((120, 2))), updates=10, chunk=10
        )


def test_a_plant_log_trains_risk_averse_quantile_critics_in_plant_units():
    """The shipped mixing-tank log (no simulator): IQL-Lag with IQN critics whose CVaR the
    value (and, for the cost, the multiplier) reads; the paper's reward scaling is fitted
    on the log's episodes and the actions come back in the plant's percent."""
    from pathlib import Path

    from neorl_industrial.integration.datasets import load_plant_log

    example = Path(__file__).resolve().parents[3] / "examples" / "mixing-tank"
    dataset, card = load_plant_log(example / "mixing_tank.csv", example / "schema.yaml")
    iqn = {"kind": "iqn", "risk": "cvar", "n_quantiles": 4, "n_policy_quantiles": 4}
    agent = Agent("iql-lag", task=card.task(), hidden=(8,), critic=iqn, cost_critic=iqn)
    agent.fit(dataset, updates=10, chunk=10, evaluate=False, card=card)
    returns = np.asarray(dataset.episode_returns(), np.float64)
    assert agent.result.reward_scale["kind"] == "return_range"
    np.testing.assert_allclose(
        agent.result.reward_scale["scale"], 1000.0 / np.ptp(returns), rtol=1e-6
    )
    assert agent.hyperparameters["critic"]["risk"] == "cvar"
    actions = np.asarray(agent.predict(np.asarray(dataset.observations[:4])))
    assert actions.shape == (4, 2) and np.all(np.isfinite(actions))
    assert np.all((actions >= 0.0) & (actions <= 100.0))


def test_a_sweep_on_a_plant_log_chooses_a_configuration_without_the_plant(tmp_path):
    """The mixing-tank log has no simulator: a grid of TD3+BC's alpha × two seeds trains
    as one program, every run is estimated by FQE on held-out episodes, and the agent ends
    with the chosen configuration, acting in the plant's percent and saving as any."""
    from pathlib import Path

    from neorl_industrial.integration.datasets import load_plant_log
    from neorl_industrial.wrappers.agents import OPESettings

    example = Path(__file__).resolve().parents[3] / "examples" / "mixing-tank"
    dataset, card = load_plant_log(example / "mixing_tank.csv", example / "schema.yaml")
    agent = Agent("td3bc", task=card.task(), hidden=(8,))
    ope = OPESettings(updates=20, seeds=(0, 1), hidden=(8,))
    table = agent.sweep(
        dataset,
        {"alpha": [1.0, 4.0]},
        seeds=(0, 1),
        updates=20,
        chunk=10,
        batch_size=32,
        ope=ope,
        card=card,
    )
    assert table["fields"] == ["alpha"] and table["estimate"] == "fqe"
    assert [c["values"] for c in table["configurations"]] == [{"alpha": 1.0}, {"alpha": 4.0}]
    for configuration in table["configurations"]:
        assert [run["seed"] for run in configuration["runs"]] == [0, 1]
        assert np.isfinite(configuration["summary"]["return"]["mean"])
    chosen = table["configurations"][table["selected"]]
    means = [c["summary"]["return"]["mean"] for c in table["configurations"]]
    assert chosen["summary"]["return"]["mean"] == max(means)  # all within the limits: by return
    assert "the best mean return" in table["reason"]
    other = table["configurations"][1 - table["selected"]]["summary"]["return"]
    ours = chosen["summary"]["return"]
    overlap = ours["mean"] - ours["ci"] <= other["mean"] + other["ci"]
    assert ("cannot tell them apart" in table["reason"]) == overlap
    assert agent.hyperparameters["alpha"] == chosen["values"]["alpha"]
    assert agent.result.sweep is table and agent.seeds == [0, 1]
    actions = np.asarray(agent.predict(np.asarray(dataset.observations[:4])))
    assert actions.shape == (4, 2) and np.all((actions >= 0.0) & (actions <= 100.0))
    loaded = Agent.load(agent.save(tmp_path / "swept"))
    np.testing.assert_allclose(
        loaded.predict(np.asarray(dataset.observations[:4])), actions, rtol=1e-6
    )


def test_a_bad_sweep_is_refused_by_name(ib_data):
    agent = Agent("td3bc", hidden=(8,))
    with pytest.raises(AgentError, match="did you mean 'alpha'"):
        agent.sweep(ib_data, {"alfa": [1.0]}, updates=10, chunk=10)
    with pytest.raises(AgentError, match=r"grid configuration 1 \{'actor_lr': -1.0\}"):
        agent.sweep(ib_data, {"actor_lr": [1e-3, -1.0]}, updates=10, chunk=10)
    with pytest.raises(AgentError, match=r"grid\.alpha: expected at least one value"):
        agent.sweep(ib_data, {"hidden": [[8], [16]], "alpha": []}, updates=10, chunk=10)
    assert not agent.fitted


@pytest.mark.slow
def test_a_sweep_chooses_offline_and_the_simulator_says_how_well(ib_data):
    """With ``ope.always`` every run is estimated by FQE on held-out episodes and the
    configuration is chosen on those estimates, safety first, as on a plant; the
    simulator's numbers of the same policies give the choice's regret and the rank
    correlation of estimated and true returns."""
    from scipy.stats import spearmanr

    from neorl_industrial.wrappers.agents import OPESettings
    from neorl_industrial.wrappers.training.evaluation import selection_key

    agent = Agent("td3bc-lag", "IB-v0", hidden=(16, 16), cost_limits=[5.0, 5.0])
    table = agent.sweep(
        ib_data,
        {"alpha": [1.0, 2.5, 5.0]},
        seeds=(0, 1),
        updates=50,
        chunk=50,
        batch_size=32,
        eval_episodes=2,
        eval_horizon=20,
        ope=OPESettings(always=True, updates=20, seeds=(0, 1), hidden=(8,)),
    )
    assert table["estimate"] == "fqe" and len(table["configurations"]) == 3
    keys = [
        selection_key({k: v["mean"] for k, v in c["summary"].items()})
        for c in table["configurations"]
    ]
    assert keys[table["selected"]] == max(keys)
    chosen = table["configurations"][table["selected"]]
    assert chosen["within_limits"] == (keys[table["selected"]][0] == 1.0)
    assert agent.hyperparameters["alpha"] == chosen["values"]["alpha"]
    truth = [c["simulated"]["return"]["mean"] for c in table["configurations"]]
    hindsight = table["hindsight"]
    assert hindsight["best_in_hindsight"] == int(np.argmax(truth))
    assert hindsight["regret"] == pytest.approx(max(truth) - truth[table["selected"]])
    assert hindsight["regret"] >= 0.0
    estimated = [c["summary"]["return"]["mean"] for c in table["configurations"]]
    expected = spearmanr(estimated, truth).statistic
    if np.isnan(expected):  # a constant side has no ranking
        assert hindsight["rank_correlation"] is None
    else:
        assert hindsight["rank_correlation"] == pytest.approx(expected)


def test_a_sweep_over_network_sizes_trains_one_program_per_size(tmp_path):
    """Hidden sizes set shapes, so each size is a program of its own (its alphas traced
    in it); the table keeps the grid's order and the agent ends with the chosen size."""
    from pathlib import Path

    from neorl_industrial.integration.datasets import load_plant_log
    from neorl_industrial.wrappers.agents import OPESettings

    example = Path(__file__).resolve().parents[3] / "examples" / "mixing-tank"
    dataset, card = load_plant_log(example / "mixing_tank.csv", example / "schema.yaml")
    # Built with a size the grid does not hold, so it ends with the chosen one only if the
    # sweep sets it. The [8] program (with its FQE and settings) is the sweep's above: it
    # compiles once for both.
    agent = Agent("td3bc", task=card.task(), hidden=(16,))
    table = agent.sweep(
        dataset,
        {"hidden": [[8], [6, 6]], "alpha": [1.0, 4.0]},
        seeds=(0, 1),
        updates=20,
        chunk=10,
        batch_size=32,
        ope=OPESettings(updates=20, seeds=(0, 1), hidden=(8,)),
        card=card,
    )
    assert table["programs"] == 2 and table["fields"] == ["hidden", "alpha"]
    assert [c["values"] for c in table["configurations"]] == [
        {"hidden": [8], "alpha": 1.0},
        {"hidden": [8], "alpha": 4.0},
        {"hidden": [6, 6], "alpha": 1.0},
        {"hidden": [6, 6], "alpha": 4.0},
    ]
    chosen = table["configurations"][table["selected"]]
    assert list(agent.hyperparameters["hidden"]) == chosen["values"]["hidden"]
    assert tuple(agent.config.hidden) == tuple(chosen["values"]["hidden"])
    first_layer = jax.tree.leaves(agent.policies)[0]
    assert first_layer.shape[0] == 2  # the chosen configuration's two seeds
    observations = np.asarray(dataset.initial_observations()[:3])
    actions = np.asarray(agent.predict(observations))
    loaded = Agent.load(agent.save(tmp_path / "swept"))
    np.testing.assert_allclose(loaded.predict(observations), actions, rtol=1e-6)

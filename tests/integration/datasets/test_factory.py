"""The dataset factory: behaviour-policy artifacts and graded datasets."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from neorl_industrial.core.agents.sac import SACConfig, make_sac
from neorl_industrial.integration.datasets import load_native, save_native
from neorl_industrial.integration.datasets.factory import (
    QUALITIES,
    BehaviourPolicies,
    generate_dataset,
)
from neorl_industrial.integration.datasets.native import STALE_STAGING_AGE


@pytest.fixture(scope="module")
def policies():
    """Untrained (randomly initialized) behaviour policies: the factory's plumbing does
    not depend on how good they are."""
    # Scaled-down observations keep the untrained actor's actions off the tanh bounds.
    config = SACConfig(hidden=(16, 16), obs_mean=(50.0,) * 180, obs_std=(500.0,) * 180)
    algorithm = make_sac(config, 180, 3)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    return BehaviourPolicies(
        env_id="IB-v0",
        version="test",
        sac_config=config,
        returns_per_step={
            "random": -316.0,
            "low": -290.0,
            "medium": -260.0,
            "high": -230.0,
            "expert": -200.0,
        },
        policies={
            quality: algorithm.init(key).policy
            for quality, key in zip(("low", "medium", "high", "expert"), keys, strict=True)
        },
    )


def test_artifacts_round_trip(tmp_path, policies):
    path = policies.save(tmp_path)
    assert (path / "manifest.json").is_file()
    loaded = BehaviourPolicies.load("IB-v0", root=tmp_path)
    assert loaded.version == "test" and loaded.sac_config == policies.sac_config
    for quality in ("low", "expert"):
        for a, b in zip(
            jax.tree.leaves(policies.policies[quality]),
            jax.tree.leaves(loaded.policies[quality]),
            strict=True,
        ):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="version"):
        BehaviourPolicies.load("IB-v0", version="v9", root=tmp_path)
    with pytest.raises(ValueError, match="IB-classic-v0"):
        BehaviourPolicies.load("IB-classic-v0", root=tmp_path)


def test_saving_policies_removes_what_killed_saves_left(tmp_path, policies):
    versions = tmp_path / "IB-v0"
    stale, fresh = versions / ".test.k1ll3d.tmp", versions / ".v2.4l1ve.tmp"
    for staging in (stale, fresh):
        staging.mkdir(parents=True)
    old = stale.stat().st_mtime - 2 * STALE_STAGING_AGE
    os.utime(stale, (old, old))
    with pytest.warns(UserWarning, match="removed 1 staging entry"):
        path = policies.save(tmp_path)
    assert not stale.exists() and fresh.is_dir() and (path / "manifest.json").is_file()


def test_generation_is_reproducible_and_carded(tmp_path, policies):
    dataset, card = generate_dataset("IB-v0", "medium", 3, seed=7, policies=policies, chunk=2)
    again, _ = generate_dataset("IB-v0", "medium", 3, seed=7, policies=policies, chunk=2)
    other, _ = generate_dataset("IB-v0", "medium", 3, seed=8, policies=policies, chunk=2)
    assert dataset.n_episodes == 3 and dataset.n_transitions == 3000
    np.testing.assert_array_equal(dataset.observations, again.observations)
    np.testing.assert_array_equal(dataset.actions, again.actions)
    assert not np.array_equal(dataset.actions, other.actions)
    assert card.behaviour_policy.name == "medium" and card.behaviour_policy.version == "test"
    np.testing.assert_allclose(
        card.behaviour_policy.mean_return, float(dataset.episode_returns().mean()), rtol=1e-6
    )
    assert card.random_return == pytest.approx(-316_000.0)
    assert card.expert_return == pytest.approx(-200_000.0)
    assert card.cost_names == ["fatigue", "consumption"]
    assert card.sizes.n_transitions == 3000 and card.seed == 7
    assert card.env_params["setpoint"] == 70.0
    saved = save_native(dataset, tmp_path / "medium", card)
    loaded, loaded_card = load_native(tmp_path / "medium")
    np.testing.assert_array_equal(loaded.rewards, dataset.rewards)
    assert loaded_card.checksums == saved.checksums


def test_behaviour_mixes_mean_and_sampled_actions(policies):
    dataset, _ = generate_dataset("IB-v0", "expert", 2, seed=0, policies=policies)
    algorithm = make_sac(policies.sac_config, 180, 3)
    observations = dataset.transition_observations()
    mean = jax.vmap(lambda o: algorithm.act(policies.policies["expert"], o, deterministic=True))(
        observations
    )
    is_mean = np.all(np.isclose(dataset.actions, mean, atol=1e-5), axis=1)
    assert 0.75 < is_mean.mean() < 0.85


def test_random_quality_needs_no_policies_and_bad_input_is_named():
    dataset, card = generate_dataset("IB-classic-v0", "random", 2, seed=0)
    assert dataset.observation_size == 6
    assert card.random_return is None and card.behaviour_policy.name == "random"
    assert np.all(np.abs(np.asarray(dataset.actions)) <= 1.0)
    with pytest.raises(ValueError, match="quality"):
        generate_dataset("IB-v0", "superb", 2)
    with pytest.raises(ValueError, match="n_trajectories"):
        generate_dataset("IB-v0", "random", 0)
    assert QUALITIES == ("random", "low", "medium", "high", "expert")


def test_discrete_environments_use_discretized_continuous_policies(policies):
    from neorl_industrial.integration.datasets.factory import _discretize

    np.testing.assert_array_equal(_discretize(jax.numpy.array([-1.0, 0.0, 1.0])), 5)
    np.testing.assert_array_equal(_discretize(jax.numpy.array([0.2, -0.7, 0.9])), 9 + 0 + 2)
    dataset, card = generate_dataset("IB-discrete-v0", "high", 2, seed=0, policies=policies)
    actions = np.asarray(dataset.actions)
    assert dataset.discrete and actions.min() >= 0 and actions.max() <= 26
    assert card.behaviour_policy.name == "high"


@pytest.mark.parametrize("env_id", ["IB-v0", "IB-classic-v0", "IB-nonstationary-v0"])
def test_shipped_behaviour_policies_are_graded(env_id):
    shipped = BehaviourPolicies.load(env_id)
    returns = shipped.returns_per_step
    ordered = [returns[quality] for quality in QUALITIES]
    assert ordered == sorted(ordered), returns
    span = returns["expert"] - returns["random"]
    # The trained qualities sit near 25 / 50 / 75 % of the way from random to expert.
    for quality, fraction in (("low", 0.25), ("medium", 0.5), ("high", 0.75)):
        assert abs((returns[quality] - returns["random"]) / span - fraction) < 0.15, returns
    # And the expert clearly beats holding the initial setting (about -209 per step).
    assert returns["expert"] > -200.0


def test_shipped_expert_generates_better_data_than_random():
    expert, card = generate_dataset("IB-v0", "expert", 2, seed=0)
    random, _ = generate_dataset("IB-v0", "random", 2, seed=0)
    assert card.behaviour_policy.version == "v1"
    assert float(expert.episode_returns().mean()) > float(random.episode_returns().mean()) + 50_000
    scores = card.normalized_score(np.asarray(expert.episode_returns()))
    assert np.all(scores > 60.0)

"""The optimizer built from a network's settings and the one gradient step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from neorl_industrial.core.optimizers import apply_gradients, make_optimizer


def _objective(params):
    return jnp.sum(jnp.square(params - 3.0)), params * 2.0


def test_apply_gradients_steps_on_the_objectives_gradient():
    params = jnp.asarray([1.0, 5.0])
    optimizer = optax.sgd(0.25)
    new, _, loss, aux = apply_gradients(_objective, params, optimizer, optimizer.init(params))
    # Gradient 2 (p - 3) = [-4, 4]; the loss and aux are those before the step.
    np.testing.assert_allclose(new, [2.0, 4.0])
    np.testing.assert_allclose(loss, 8.0)
    np.testing.assert_allclose(aux, [2.0, 10.0])


def test_the_optimizer_clips_the_gradients_norm():
    params = jnp.asarray([1.0, 5.0])
    clipped = make_optimizer(1.0, max_grad_norm=1e-3)
    plain = make_optimizer(1.0)
    # Adam's first step is lr * sign(g) whatever the clipping: compare the moments.
    _, state, _, _ = apply_gradients(_objective, params, clipped, clipped.init(params))
    _, plain_state, _, _ = apply_gradients(_objective, params, plain, plain.init(params))
    clipped_mu = np.asarray(state[1][0].mu)
    plain_mu = np.asarray(plain_state[0].mu)
    np.testing.assert_allclose(np.linalg.norm(clipped_mu), 0.1 * 1e-3, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(plain_mu), 0.1 * np.sqrt(32.0), rtol=1e-5)


def test_weight_decay_pulls_the_parameters_towards_zero():
    params = jnp.asarray([3.0, 3.0])  # the objective's minimum: its gradient is 0
    decayed = make_optimizer(0.1, weight_decay=0.5)
    new, _, _, _ = apply_gradients(_objective, params, decayed, decayed.init(params))
    np.testing.assert_allclose(new, 3.0 - 0.1 * 0.5 * 3.0, rtol=1e-6)
    plain = make_optimizer(0.1)
    same, _, _, _ = apply_gradients(_objective, params, plain, plain.init(params))
    np.testing.assert_allclose(same, params)


def test_settings_errors_name_the_field():
    with pytest.raises(ValueError, match="max_grad_norm"):
        make_optimizer(1e-3, max_grad_norm=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        make_optimizer(1e-3, weight_decay=-1.0)


def test_every_setting_may_be_traced():
    # A sweep traces the settings (ADR-0009): the traced chain steps as the concrete one.
    params = jnp.asarray([1.0, 5.0])

    def step(learning_rate, max_grad_norm, weight_decay):
        optimizer = make_optimizer(learning_rate, max_grad_norm, weight_decay)
        return apply_gradients(_objective, params, optimizer, optimizer.init(params))[0]

    traced = jax.jit(step)(0.1, 1.0, 0.5)
    np.testing.assert_allclose(traced, step(0.1, 1.0, 0.5), rtol=1e-6)
    assert not np.allclose(traced, step(0.1, 1.0, 0.0))

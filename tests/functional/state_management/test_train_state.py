"""Fresh training states, the copies a donating program takes and restored arrays placed
as a computation places them."""

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.functional.state_management import donatable, uncommitted


def test_donatable_gives_every_leaf_a_buffer_of_its_own_without_compiling():
    # Shapes no other test uses: a per-leaf copy program would be compiled here.
    online = jnp.arange(7 * 13, dtype=jnp.float32).reshape(7, 13)
    state = {"online": online, "target": online, "step": jnp.zeros((3,), jnp.int16)}
    compiled = []

    def listen(event, duration, **_):
        if event.endswith("backend_compile_duration"):
            compiled.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        copied = donatable(state)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert not compiled  # the runtime copies the buffers
    pointers = {leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(copied)}
    assert len(pointers) == 3 and online.unsafe_buffer_pointer() not in pointers
    # A program that donates the copy leaves the caller's state whole.
    jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)(copied)
    np.testing.assert_array_equal(state["target"], np.arange(7 * 13).reshape(7, 13))


def test_uncommitted_arrays_run_the_program_of_computed_ones():
    device = jax.devices()[0]
    computed = {"w": jnp.arange(6.0).reshape(2, 3), "key": jax.random.key(3), "n": 4}
    restored = jax.tree.map(
        lambda x: jax.device_put(x, device) if isinstance(x, jax.Array) else x, computed
    )  # committed, as orbax restores them
    program = jax.jit(lambda t: (t["w"] * 2.0, jax.random.uniform(t["key"])))
    assert restored["w"].committed and restored["key"].committed
    program(computed)
    program(restored)
    assert program._cache_size() == 2  # committed arguments: another program
    fresh = uncommitted(restored)
    assert not fresh["w"].committed and not fresh["key"].committed and fresh["n"] == 4
    np.testing.assert_array_equal(fresh["w"], computed["w"])
    np.testing.assert_array_equal(
        jax.random.key_data(fresh["key"]), jax.random.key_data(computed["key"])
    )
    program(fresh)
    assert program._cache_size() == 2  # the computed arrays' program

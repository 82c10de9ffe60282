"""Other libraries' agents, run beside ours by the peer-parity benchmark
(``benchmarks/peer_parity.py``).

* :mod:`benchmarks.peers.evaluation` - the one evaluation both libraries' policies go
  through: the project's JAX environment stepped from the host, the same episodes for
  every policy.
* :mod:`benchmarks.peers.d3rlpy_worker` - trains and evaluates d3rlpy 2.8's agents from a
  JSON job, in d3rlpy's own environment (``make peer-env``), as a child process.

Both import only numpy, JAX and this package at module level, so they load in either
environment.
"""

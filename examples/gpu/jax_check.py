"""Real-GPU validation with JAX (docs/validation.md): XLA reaches the driver through dlsym and
cuGetProcAddress. Prints JAX's own memory statistics for comparison with the trace."""
import json
import time

import jax
import jax.numpy as jnp


def main():
    d = jax.devices()[0]
    xs = [jnp.ones((1024, 1024 * (i + 1)), dtype=jnp.float32) for i in range(4)]
    y = sum(x.sum() for x in xs)
    y.block_until_ready()
    stats = d.memory_stats() or {}
    print("TRUTH " + json.dumps({"t_ns": time.monotonic_ns(), "device": str(d), "stats": stats}), flush=True)


if __name__ == "__main__":
    main()

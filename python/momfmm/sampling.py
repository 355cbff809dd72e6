"""The sampler of `momfmm generate` (src/commands/cmd_generate.c, docs/cli.md §5) and the counter-based
random numbers it draws (src/base/rng.h), in Python, step for step: momfmm.pt.generate
picks its ids with these, so that the same logits, seed and settings give the ids the C command
prints. numpy and the standard library only.
"""
import math

import numpy as np

# The counter-based generator of src/base/rng.h, in 64-bit arithmetic.
MASK64 = (1 << 64) - 1
GENERATE_STREAM = 0x6E4  # rng_key(seed, 0x6E4, 0, 0): src/commands/cmd_generate.c


def _rng_mix(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def rng_key(a, b, c, d):
    """rng_key of rng.h: the key of a stream of draws."""
    return _rng_mix(_rng_mix(_rng_mix(_rng_mix(a & MASK64) ^ b) ^ c) ^ d)


def rng_uniform(key, counter):
    """rng_uniform of rng.h: draw `counter` of the stream `key`, uniform in [0, 1) with 53 bits."""
    z = _rng_mix(key ^ _rng_mix((counter + 0x632BE59BD9B4E019) & MASK64))
    return (z >> 11) * (1.0 / 9007199254740992.0)


def sample_next(logits, temperature=0.0, top_k=0, top_p=1.0, key=0, counter=0):
    """The next id from one position's logits as sample_next of src/commands/cmd_generate.c computes it
    (docs/cli.md §5, generate), step for step: greedy (the first largest logit) at temperature
    0 or top_k 1; else the ids sorted by logit (float32, ties by id), the first top_k kept, cut
    to the fewest whose weights exp((z_v − z_max)/T) reach top_p of their sum, then one uniform
    draw (key, counter) walked down the kept weights. Differences z_v − z_max are float32 as in
    C, weights and sums float64 in the same order with the same libm exp, so equal logits give
    the same id."""
    z = np.asarray(logits, dtype=np.float32).ravel()
    V = len(z)
    best = int(np.argmax(z))
    if temperature <= 0 or top_k == 1:
        return best
    values = z.tolist()   # each exactly its float32
    ranked = sorted(range(V), key=lambda v: (-values[v], v))
    kept = top_k if 0 < top_k < V else V
    top = z[ranked[0]]

    def weight(i):
        return math.exp(float(z[ranked[i]] - top) / temperature)   # float32 difference, then double

    total = 0.0
    for i in range(kept):
        total += weight(i)
    mass, cut, within = 0.0, top_p * total, 0
    while within < kept and (within == 0 or mass < cut):
        mass += weight(within)
        within += 1
    u = rng_uniform(key, counter) * mass
    for i in range(within):
        w = weight(i)
        if u < w:
            return ranked[i]
        u -= w
    return ranked[within - 1]

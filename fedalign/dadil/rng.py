"""A DeFed-GMM-DaDiL client's random streams and their serialisation in its state file.

Every client draws its peers with its own generator :func:`client_rng` (PCG64 on the
federation seed and a hash of its id) and its initial atoms from :func:`client_init_seed` (a
distinct stream of the same seed); the peer generator's state travels in the client's state
file as 6 unsigned 64-bit words (:func:`rng_to_array`, :func:`rng_from_array`), checked on
reading (:func:`check_rng_words`).
"""

from __future__ import annotations

import zlib

import numpy as np

from fedalign.errors import FedalignError


def client_rng(seed: int, client: str) -> np.random.Generator:
    """The client's own generator: PCG64 on ``SeedSequence(seed, spawn_key=(crc32(client),))``."""
    ss = np.random.SeedSequence(int(seed), spawn_key=(zlib.crc32(client.encode()),))
    return np.random.Generator(np.random.PCG64(ss))


def rng_to_array(rng: np.random.Generator) -> np.ndarray:
    """PCG64 state as 6 uint64 words: state (hi, lo), inc (hi, lo), has_uint32, uinteger."""
    s = rng.bit_generator.state
    if s["bit_generator"] != "PCG64":
        raise ValueError("only PCG64 generators are serialisable")
    m = (1 << 64) - 1
    st, inc = s["state"]["state"], s["state"]["inc"]
    return np.array([st >> 64, st & m, inc >> 64, inc & m, s["has_uint32"], s["uinteger"]],
                    dtype=np.uint64)


def check_rng_words(words, path) -> None:
    """Refuse ``rng_state`` words that :func:`rng_to_array` cannot have written: not 6
    unsigned 64-bit words, an even increment (numpy's PCG64 always has an odd one; an all-zero
    state made the peer draws loop forever), ``has_uint32`` not 0/1, or a cached 32-bit
    ``uinteger`` of more than 32 bits."""
    w = np.asarray(words)
    if w.shape != (6,) or w.dtype.kind not in "ui" or (w.dtype.kind == "i" and w.min() < 0):
        raise FedalignError(f"{path}: rng_state must be the 6 words of a PCG64 state")
    w = [int(x) for x in w]
    if w[3] % 2 == 0:
        raise FedalignError(f"{path}: rng_state is not a PCG64 state (even increment)")
    if w[4] not in (0, 1) or w[5] >= 1 << 32:
        raise FedalignError(f"{path}: rng_state is not a PCG64 state (bad cached 32-bit word)")


def rng_from_array(a) -> np.random.Generator:
    """Inverse of :func:`rng_to_array`."""
    a = [int(x) for x in np.asarray(a, dtype=np.uint64)]
    bg = np.random.PCG64()
    bg.state = {"bit_generator": "PCG64", "state": {"state": (a[0] << 64) | a[1],
                                                     "inc": (a[2] << 64) | a[3]},
                "has_uint32": a[4], "uinteger": a[5]}
    return np.random.Generator(bg)


def client_init_seed(seed: int, client: str) -> np.random.SeedSequence:
    """The client's own initialisation seed: ``SeedSequence(seed, spawn_key=(crc32(client), 1))``
    (a stream distinct from its peer-choice generator :func:`client_rng`)."""
    return np.random.SeedSequence(int(seed), spawn_key=(zlib.crc32(client.encode()), 1))

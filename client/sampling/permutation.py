"""A keyed pseudo-random bijection of ``[0, n)``, evaluated per position in O(1).

An (unbalanced) Feistel network permutes ``[0, 2**b)`` with ``2**b`` the smallest
power of two not below ``n`` (at least 4); cycle-walking (apply again while the value
is ``>= n``) restricts it to ``[0, n)`` and stays a bijection. The domain is below
``2n``, so a position needs two evaluations on average. Everything is vectorised over
numpy arrays so many positions are permuted at once; no array of ``n`` entries is built.

The two halves have ``hi = b - b // 2`` and ``lo = b // 2`` bits; a round maps
``(L, R) -> (R, L ^ F_k(R))``, so the widths swap every round and an even number of
rounds brings them back.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["derive_key", "feistel_permute", "ROUNDS"]

ROUNDS = 6
_MASK64 = (1 << 64) - 1
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S29 = np.uint64(29)
_S32 = np.uint64(32)


def _mix_int(x: int) -> int:
    """splitmix64 finaliser on a Python int (keys are derived once, in plain integers)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_key(*parts: int) -> int:
    """A 64-bit key from integers (seed, epoch, window…); any change of any part changes it."""
    key = 0x6A09E667F3BCC908
    for p in parts:
        key = _mix_int(key ^ (int(p) & _MASK64))
    return key


@lru_cache(maxsize=4096)
def _round_keys(key: int) -> tuple[np.uint64, ...]:
    return tuple(np.uint64(derive_key(key, r)) for r in range(ROUNDS))


def _feistel(x: np.ndarray, bits: int, keys: tuple[np.uint64, ...]) -> np.ndarray:
    lo = bits // 2
    widths = (bits - lo, lo)  # (width of L, width of R) before round 0
    left = x >> np.uint64(widths[1])
    right = x & np.uint64((1 << widths[1]) - 1)
    for r, k in enumerate(keys):
        wl = widths[r % 2]  # L has this many bits in round r
        # F: multiply-xorshift of (R ^ k); array arithmetic on uint64 wraps silently
        t = (right ^ k) * _M1
        t ^= t >> _S29
        t *= _M2
        t ^= t >> _S32
        left, right = right, left ^ (t & np.uint64((1 << wl) - 1))
    return (left << np.uint64(widths[1])) | right


def feistel_permute(positions: np.ndarray | int, n: int, key: int) -> np.ndarray:
    """The images of ``positions`` (each in ``[0, n)``) under the bijection of ``[0, n)`` keyed by ``key``."""
    pos = np.asarray(positions, dtype=np.int64)
    if n < 1:
        raise ValueError(f"cannot permute an empty range (n={n})")
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n):
        raise ValueError(f"positions must lie in [0, {n})")
    if n == 1:
        return np.zeros_like(pos)
    bits = max(2, (n - 1).bit_length())
    keys = _round_keys(key)
    x = _feistel(np.atleast_1d(pos).astype(np.uint64), bits, keys)
    limit = np.uint64(n)
    todo = np.nonzero(x >= limit)[0]
    while todo.size:  # cycle-walking: each cycle of the permutation re-enters [0, n)
        y = _feistel(x[todo], bits, keys)
        x[todo] = y
        todo = todo[y >= limit]
    return x.astype(np.int64).reshape(pos.shape)

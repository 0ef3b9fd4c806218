"""Keyed pseudorandom permutations of ``range(n)`` without tables (THEORY.md section 2).

A balanced Feistel network on ``2h`` bits (``4**h >= n``) is a bijection of ``range(4**h)``
for any round function; cycle-walking (re-applying it until the value lands below ``n``) restricts
it to a bijection of ``range(n)``. Everything is vectorised integer arithmetic on int64 tensors:
memory is O(number of queried values), independent of ``n``, so ``n`` can be ``10**9`` or more.

The round function is a 32-bit integer mixer whose multiplications stay below ``2**63`` (a
32-bit value times a 31-bit constant), so int64 never overflows.
"""

from __future__ import annotations

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # the odd 28-bit multiplier of the classic 32-bit integer hash
_SALT_SHARED = 0x2545F491
_SALT_ANCHOR = 0x1B873593
#: Feistel rounds: Luby-Rackoff needs 4 for a pseudorandom permutation; 6 leaves a margin.
ROUNDS = 6
#: The largest supported domain (``h <= 31`` keeps every intermediate below ``2**63``).
MAX_N = 2**62


def hash32(x: Tensor) -> Tensor:
    """A 32-bit integer mixer applied elementwise to an int64 tensor of values in ``[0, 2**32)``."""
    x = x & _M32
    x = (((x >> 16) ^ x) * _MIX) & _M32
    x = (((x >> 16) ^ x) * _MIX) & _M32
    return (x >> 16) ^ x


def round_keys(seed: int, anchors: Tensor | None = None) -> Tensor:
    """Per-round keys derived from ``seed`` and, for per-anchor permutations, the anchor index.

    Args:
        seed: Non-negative integer (folded to 64 bits).
        anchors: Optional int64 ``(B,)`` anchor indices; None for one key set shared by everyone.

    Returns:
        int64 ``(ROUNDS,)`` without anchors, ``(B, ROUNDS)`` with them; values in ``[0, 2**32)``.
    """
    seed = int(seed) % 2**64
    lo, hi = seed & _M32, seed >> 32
    base = torch.tensor([(r * 0x9E3779B9) & _M32 for r in range(ROUNDS)], dtype=torch.int64)
    keys = hash32(hash32(base ^ lo) ^ hi)  # (R,)
    if anchors is None:
        return hash32(keys ^ _SALT_SHARED)
    anchors = anchors.to(torch.int64).reshape(-1, 1)  # (B, 1)
    keys = keys.to(anchors.device).unsqueeze(0)  # (1, R)
    keys = hash32(hash32(keys ^ _SALT_ANCHOR ^ (anchors & _M32)) ^ (anchors >> 32))
    return keys  # (B, R)


def half_bits(n: int) -> int:
    """Bits per Feistel half: the smallest ``h >= 1`` with ``4**h >= n``."""
    h = 1
    while 4**h < n:
        h += 1
    return h


def _feistel(x: Tensor, keys: Tensor, h: int, inverse: bool) -> Tensor:
    """One pass of the Feistel network on ``2h``-bit values ``x (L,)`` with keys ``(L, R)``."""
    mask = (1 << h) - 1
    left, right = x >> h, x & mask
    order = range(ROUNDS - 1, -1, -1) if inverse else range(ROUNDS)
    for r in order:
        k = keys[:, r]
        if inverse:
            left, right = right ^ (hash32(left ^ k) & mask), left
        else:
            left, right = right, left ^ (hash32(right ^ k) & mask)
    return (left << h) | right


def permute(x: Tensor, n: int, keys: Tensor, *, inverse: bool = False) -> Tensor:
    """Apply the keyed permutation of ``range(n)`` (or its inverse) elementwise.

    Args:
        x: int64 tensor of values in ``[0, n)``, any shape.
        n: Domain size, ``1 <= n <= 2**62``.
        keys: ``(ROUNDS,)`` (one permutation for all of ``x``) or ``x.shape + (ROUNDS,)`` (one
            permutation per element, e.g. per anchor).
        inverse: Apply the inverse permutation.

    Returns:
        int64 tensor of the same shape as ``x``: the images, in ``[0, n)``.

    Example:
        >>> keys = round_keys(seed=0)
        >>> y = permute(torch.arange(10), 10, keys)
        >>> sorted(y.tolist()) == list(range(10))
        True
        >>> torch.equal(permute(y, 10, keys, inverse=True), torch.arange(10))
        True
    """
    shape = x.shape
    flat = x.reshape(-1).to(torch.int64)  # (L,)
    if keys.dim() == 1:
        per_element = keys.to(flat.device).unsqueeze(0).expand(flat.numel(), -1)  # (L, R)
    else:
        per_element = keys.to(flat.device).reshape(flat.numel(), keys.shape[-1])  # (L, R)
    h = half_bits(n)
    out = _feistel(flat, per_element, h, inverse)
    # Cycle-walking: every value out of range is walked along its cycle until it returns to
    # range(n); it must, since the network is a bijection of range(4**h) ⊇ range(n). The domain
    # is under 4n, so the expected number of extra passes is below 4.
    outside = out >= n
    while bool(outside.any()):
        idx = outside.nonzero().squeeze(1)
        out[idx] = _feistel(out[idx], per_element[idx], h, inverse)
        outside = out >= n
    return out.reshape(shape)


__all__ = ["MAX_N", "ROUNDS", "half_bits", "hash32", "permute", "round_keys"]

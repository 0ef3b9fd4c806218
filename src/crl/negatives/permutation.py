"""Keyed pseudorandom permutations of ``range(n)`` without tables (docs/theory.md §9).

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
#: Values per slice of :func:`permute` (512 KiB of int64: a few buffers stay in cache).
CHUNK = 1 << 16
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


def _mix_(x: Tensor, tmp: Tensor) -> Tensor:
    """:func:`hash32` in place on values already in ``[0, 2**32)``; ``tmp`` is scratch."""
    for _ in range(2):
        x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=tmp)).mul_(_MIX).bitwise_and_(_M32)
    return x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=tmp))


def _feistel(x: Tensor, keys: Tensor, h: int, inverse: bool) -> Tensor:
    """One pass of the Feistel network on ``2h``-bit values ``x`` (any shape) with per-round keys
    ``keys (..., R)`` broadcastable to ``x.shape + (R,)`` (expanded views cost nothing).

    Works in a few buffers of ``x``'s size: the round function is computed in place, so no
    temporary per operation and no ``x.numel() x R`` copy of the keys.
    """
    mask = (1 << h) - 1
    left = torch.bitwise_right_shift(x, h)
    right = torch.bitwise_and(x, mask)
    f, tmp = torch.empty_like(x), torch.empty_like(x)
    order = range(ROUNDS - 1, -1, -1) if inverse else range(ROUNDS)
    for r in order:
        k = keys[..., r]
        # forward: (L, R) <- (R, L ^ F(R)); inverse: (L, R) <- (R ^ F(L), L); F(v) = hash(v ^ k)
        source, other = (left, right) if inverse else (right, left)
        torch.bitwise_xor(source, k, out=f)
        _mix_(f, tmp).bitwise_and_(mask).bitwise_xor_(other)
        if inverse:
            left, right, f = f, left, right
        else:
            left, right, f = right, f, left
    return left.bitwise_left_shift_(h).bitwise_or_(right)


def permute(x: Tensor, n: int, keys: Tensor, *, inverse: bool = False) -> Tensor:
    """Apply the keyed permutation of ``range(n)`` (or its inverse) elementwise.

    Args:
        x: int64 tensor of values in ``[0, n)``, any shape.
        n: Domain size, ``1 <= n <= 2**62``.
        keys: ``(ROUNDS,)`` (one permutation for all of ``x``) or a tensor broadcastable to
            ``x.shape + (ROUNDS,)`` (one permutation per element, e.g. per anchor: ``(B, 1, R)``
            for ``x`` of shape ``(B, K)``; an expanded view is not copied).
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
    x = x.to(torch.int64)
    keys = keys.to(x.device)
    if keys.dim() > 1:
        keys = keys.expand(*x.shape, keys.shape[-1])  # a view
    h = half_bits(n)
    out = _feistel_sliced(x, keys, h, inverse)
    # Cycle-walking: every value out of range is walked along its cycle until it returns to
    # range(n); it must, since the network is a bijection of range(4**h) ⊇ range(n). The domain
    # is under 4n, so the expected number of extra passes is below 4 (the slowest of L values
    # needs about log L of them: each pass walks the values still outside, all at once).
    outside = out >= n
    if not bool(outside.any()):
        return out
    where = outside.nonzero(as_tuple=True)
    walked = out[where]  # (L,) the values still outside, compacted as they come back in
    position = outside.reshape(-1).nonzero().squeeze(1)  # (L,) their flat positions in out
    walked_keys = keys if keys.dim() == 1 else keys[where]  # (R,) or (L, R)
    out = out.contiguous()
    flat = out.view(-1)
    while walked.numel():
        walked = _feistel_sliced(walked, walked_keys, h, inverse)
        back = walked < n
        flat[position[back]] = walked[back]
        stay = ~back
        walked, position = walked[stay], position[stay]
        if walked_keys.dim() > 1:
            walked_keys = walked_keys[stay]
    return out


def _feistel_sliced(x: Tensor, keys: Tensor, h: int, inverse: bool) -> Tensor:
    """:func:`_feistel` in slices along dim 0 of about :data:`CHUNK` values: its ~80 integer
    passes then run in cache instead of streaming the whole tensor through memory each time."""
    if x.dim() == 0 or x.numel() <= CHUNK:
        return _feistel(x, keys, h, inverse)
    out = torch.empty_like(x)
    step = max(1, CHUNK // max(1, x[0].numel()))
    for start in range(0, x.shape[0], step):
        part = slice(start, start + step)
        out[part] = _feistel(x[part], keys if keys.dim() == 1 else keys[part], h, inverse)
    return out


__all__ = ["MAX_N", "ROUNDS", "half_bits", "hash32", "permute", "round_keys"]

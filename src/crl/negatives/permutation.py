"""Keyed pseudorandom permutations of ``range(n)`` without a table of them (docs/theory.md §9).

A balanced Feistel network on ``2h`` bits (``4**h >= n``) is a bijection of ``range(4**h)``
for any round function; cycle-walking (re-applying it until the value lands below ``n``) restricts
it to a bijection of ``range(n)``. Everything is vectorised integer arithmetic on int64 tensors:
memory is O(number of queried values), independent of ``n``, so ``n`` can be ``10**9`` or more.

The round function is a 32-bit integer mixer whose multiplications stay below ``2**63`` (a
32-bit value times a 31-bit constant), so int64 never overflows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

#: The per-value state :func:`_cycle_walk` compacts with the walked values (keys, table rows).
_State = TypeVar("_State", Tensor, Tensor | None)

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
    return _cycle_walk(
        _feistel_sliced(x, keys, h, inverse), n,
        lambda where: None if keys.dim() == 1 else keys[where],  # (L, R): the walked ones'
        lambda walked, own: _feistel_sliced(walked, keys if own is None else own, h, inverse))


def permute_rows(x: Tensor, n: int, keys: Tensor, *, inverse: bool = False) -> Tensor:
    """:func:`permute` with one key set per row: ``permute(x, n, keys.unsqueeze(1))``, the same
    values, faster when a row holds at least ``2**h`` values (``4**h >= n``).

    Each round function of a row then takes only ``2**h`` inputs, so it is tabulated once per
    call (``R x B x 2**h`` hashes) and every round of every pass is a lookup: three integer
    passes (index, look up, xor) instead of thirteen, most of all in the cycle-walking passes.

    Args:
        x: int64 ``(B, K)`` values in ``[0, n)``.
        n: Domain size, ``1 <= n <= 2**62``.
        keys: ``(B, R)`` per-row keys (:func:`round_keys` of the rows' anchors).
        inverse: Apply the inverse permutations.

    Returns:
        int64 ``(B, K)``: row ``b`` of ``x`` under the permutation keyed by ``keys[b]``.

    Example:
        >>> keys = round_keys(seed=0, anchors=torch.arange(3))
        >>> x = torch.arange(40).expand(3, 40)
        >>> torch.equal(permute_rows(x, 40, keys), permute(x, 40, keys.unsqueeze(1)))
        True
    """
    x = x.to(torch.int64)
    h = half_bits(n)
    if x.dim() != 2 or x.shape[1] < 1 << h:
        return permute(x, n, keys.unsqueeze(1), inverse=inverse)
    keys = keys.to(x.device)
    inputs = torch.arange(1 << h, device=x.device)
    tables = torch.empty(ROUNDS, x.shape[0], 1 << h, dtype=torch.int64, device=x.device)
    tmp = torch.empty_like(tables[0])
    for r, table in enumerate(tables):  # round by round: (B, 2**h) stays in cache
        torch.bitwise_xor(keys[:, r:r + 1], inputs, out=table)  # below 2**32
        _mix_(table, tmp).bitwise_and_((1 << h) - 1)
    tables = tables.reshape(ROUNDS, -1)  # tables[r][(b << h) | v] = F_r(v) of row b
    base = (torch.arange(x.shape[0], device=x.device) << h).unsqueeze(1)  # (B, 1)
    return _cycle_walk(_feistel_tabled(x, base, tables, h, inverse), n,
                       lambda where: where[0] << h,  # (L,) the walked values' row bases
                       lambda walked, own: _feistel_tabled(walked, own, tables, h, inverse))


def _feistel_tabled(x: Tensor, base: Tensor, tables: Tensor, h: int, inverse: bool) -> Tensor:
    """:func:`_feistel` with tabulated round functions: ``tables[r][base | v]`` is round ``r``'s
    ``F(v)`` for the row whose table starts at ``base`` (broadcastable to ``x``)."""
    mask = (1 << h) - 1
    left = torch.bitwise_right_shift(x, h)
    right = torch.bitwise_and(x, mask)
    f, at = torch.empty_like(left), torch.empty_like(left)  # contiguous, like left
    for r in (range(ROUNDS - 1, -1, -1) if inverse else range(ROUNDS)):
        source, other = (left, right) if inverse else (right, left)
        torch.bitwise_or(source, base, out=at)
        torch.index_select(tables[r], 0, at.view(-1), out=f.view(-1))  # F(source)
        f.bitwise_xor_(other)
        if inverse:
            left, right, f = f, left, right
        else:
            left, right, f = right, f, left
    return left.bitwise_left_shift_(h).bitwise_or_(right)


def _cycle_walk(out: Tensor, n: int, own: Callable[[tuple[Tensor, ...]], _State],
                again: Callable[[Tensor, _State], Tensor]) -> Tensor:
    """Cycle-walking of ``out``, one pass of the network done: every value out of range is
    walked along its cycle until it returns to range(n); it must, since the network is a
    bijection of range(4**h) ⊇ range(n). The domain is under 4n, so the expected number of
    extra passes is below 4 (the slowest of L values needs about log L of them: each pass walks
    the values still outside, all at once).

    ``own(where)`` is the per-value state (keys, table rows) of the values at ``where`` (an
    ``out.nonzero`` tuple), or None; ``again(values, state)`` is one more pass on them.
    """
    outside = out >= n
    if not bool(outside.any()):
        return out
    where = outside.nonzero(as_tuple=True)
    walked = out[where]  # (L,) the values still outside, compacted as they come back in
    position = outside.reshape(-1).nonzero().squeeze(1)  # (L,) their flat positions in out
    state = own(where)
    out = out.contiguous()
    flat = out.view(-1)
    while walked.numel():
        walked = again(walked, state)
        # every value is written back; the ones still outside are overwritten by a later pass
        flat.index_copy_(0, position, walked)
        stay = (walked >= n).nonzero().squeeze(1)  # one nonzero for the three compactions
        walked, position = walked.index_select(0, stay), position.index_select(0, stay)
        if isinstance(state, Tensor):
            state = state.index_select(0, stay)
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


__all__ = ["MAX_N", "ROUNDS", "half_bits", "hash32", "permute", "permute_rows", "round_keys"]

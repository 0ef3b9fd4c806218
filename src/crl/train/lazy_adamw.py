"""Lazy AdamW: AdamW whose update of a sparse gradient touches only the gradient's rows.

A bag-of-tokens batch touches a few thousand rows of a 30,522-row embedding table; torch's
AdamW decays and moves every row at every step, which costs more than the rest of the step
(benchmarks/README.md). :class:`LazyAdamW` updates a parameter whose gradient is sparse (an
``nn.EmbeddingBag(sparse=True)`` table) at the rows present in the gradient only, and every
parameter whose gradient is dense with torch's own AdamW kernel (``torch.optim.adamw.adamw``).

For a sparse gradient with unique rows ``R`` (the coalesced indices) and values ``g_R``, at the
global step ``t`` of the parameter (every step it has a gradient, whatever its rows):

.. math::

    \\theta_R &\\leftarrow \\theta_R (1 - \\eta \\lambda) \\\\
    m_R &\\leftarrow \\beta_1 m_R + (1 - \\beta_1) g_R \\\\
    v_R &\\leftarrow \\beta_2 v_R + (1 - \\beta_2) g_R^2 \\\\
    \\theta_R &\\leftarrow \\theta_R - \\frac{\\eta}{1 - \\beta_1^t}
        \\frac{m_R}{\\sqrt{v_R} / \\sqrt{1 - \\beta_2^t} + \\epsilon}

and the other rows of ``theta``, ``m`` and ``v`` are left as they are, bit for bit: they are
not decayed, and their moments do not decay either, so a rarely seen row's next update uses
moments from the last step it was seen, bias-corrected with the global ``t`` (as TensorFlow
Addons' ``LazyAdam``). When every row is in every gradient this is AdamW exactly. What that
changes and when crl uses it: docs/training.md, section "Sparse embedding gradients".

It is also crl's AdamW for models without sparse gradients (``optim.name: adamw``): every
parameter then takes torch's multi-tensor AdamW, in runs of at most
:data:`FOREACH_MAX_ELEMENTS` values per call, bit for bit one call's values, so the update's
``sqrt(v)`` temporaries never add a copy of the whole model to the step's peak memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.adamw import adamw

from crl.errors import CrlValueError


def adamw_rows(param: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, grad: Tensor, *, step: float,
               lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """One AdamW update of ``param`` and its moments, in place, in the order of operations of
    torch's AdamW (so that a full set of rows gives its values bit for bit).

    Args:
        param: The rows to update, ``(K, ...)``.
        exp_avg: Their first moments, ``(K, ...)``.
        exp_avg_sq: Their second moments, ``(K, ...)``.
        grad: Their gradient, ``(K, ...)``.
        step: The global step ``t``, counted from 1 (the bias correction's).
        lr: Learning rate ``eta``.
        beta1: First-moment decay.
        beta2: Second-moment decay.
        eps: Added to the denominator.
        weight_decay: Decoupled weight decay ``lambda``.
    """
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denom = exp_avg_sq.sqrt().div_((1 - beta2**step) ** 0.5).add_(eps)  # AdamW's, in place
    param.addcdiv_(exp_avg, denom, value=-step_size)


class LazyAdamW(Optimizer):
    """AdamW for models with sparse embedding gradients (module docstring): row-wise lazy
    updates where a gradient is sparse, torch's AdamW where it is dense.

    The state of each parameter is AdamW's (``step``, ``exp_avg``, ``exp_avg_sq``), so
    ``state_dict`` and ``load_state_dict`` work as for :class:`torch.optim.AdamW`.

    Args:
        params: Parameters or parameter groups.
        lr: Learning rate.
        betas: ``(beta1, beta2)``.
        eps: Added to the denominator.
        weight_decay: Decoupled weight decay (applied only to the rows a sparse gradient has).

    Example:
        >>> table = torch.nn.EmbeddingBag(10, 4, mode="mean", sparse=True)
        >>> before = table.weight.detach().clone()
        >>> opt = LazyAdamW(table.parameters(), lr=0.1)
        >>> table(torch.tensor([[1, 2]])).sum().backward()
        >>> opt.step()
        >>> changed = (table.weight != before).any(dim=1)
        >>> changed.nonzero().flatten().tolist()
        [1, 2]
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise CrlValueError(f"LazyAdamW: needs lr, eps, weight_decay >= 0 and betas in "
                                f"[0, 1); got lr={lr}, betas={betas}, eps={eps}, "
                                f"weight_decay={weight_decay}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})
        #: Set by :func:`step_together` when it has updated the dense parameters of this step
        #: already; the next :meth:`step` then does the sparse rows only.
        self.dense_done = False

    # torch wraps these four in ``torch._disable_dynamo``, whose first call imports
    # ``torch._dynamo`` (about 1.5 s of CPU in every fresh process: each study worker); the
    # wrapper matters only under ``torch.compile``, which never traces this optimiser.
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """:meth:`torch.optim.Optimizer.add_param_group`."""
        _undecorated(Optimizer.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """:meth:`torch.optim.Optimizer.zero_grad`."""
        _undecorated(Optimizer.zero_grad)(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """:meth:`torch.optim.Optimizer.state_dict` (AdamW's keys: the joined moments of a
        sparse parameter appear as its ``exp_avg`` and ``exp_avg_sq``, views of one storage)."""
        out: dict[str, Any] = _undecorated(Optimizer.state_dict)(self)
        out["state"] = {k: {name: v for name, v in state.items() if name != _JOINED}
                        for k, state in out["state"].items()}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """:meth:`torch.optim.Optimizer.load_state_dict`."""
        _undecorated(Optimizer.load_state_dict)(self, state_dict)

    def _state(self, p: Tensor) -> dict[str, Any]:
        """AdamW's state of ``p``, created at its first step as AdamW creates it."""
        state: dict[str, Any] = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One update of every parameter with a gradient.

        Args:
            closure: Re-evaluates the model and returns the loss (optional).

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            dense = [p for p in group["params"] if p.grad is not None and not p.grad.is_sparse]
            sparse = [p for p in group["params"] if p.grad is not None and p.grad.is_sparse]
            if not self.dense_done:
                self._dense_step(group, dense)
            for p in sparse:
                self._sparse_step(group, p)
        self.dense_done = False
        return loss

    def _dense_step(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """torch's AdamW (multi-tensor) on the parameters with dense gradients
        (:func:`_dense_adamw`)."""
        _dense_adamw(group, params, [self._state(p) for p in params])

    def _sparse_step(self, group: dict[str, Any], p: Tensor) -> None:
        """The lazy update of ``p`` at the rows of its sparse gradient (module docstring)."""
        assert p.grad is not None
        grad = coalesced(p.grad)  # unique rows: repeated ones summed
        if grad.sparse_dim() != 1:
            raise CrlValueError(f"LazyAdamW: a sparse gradient must be sparse in its first "
                                f"dimension only (an embedding table's); got sparse_dim="
                                f"{grad.sparse_dim()} for a parameter of shape {tuple(p.shape)}")
        state = self._state(p)
        state["step"] += 1
        moments = _joined_moments(state)  # (2, V, d): exp_avg, exp_avg_sq
        rows = grad.indices()[0]  # (K,)
        param = p.index_select(0, rows)  # (K, d): copies, written back below
        picked = moments.index_select(1, rows)  # (2, K, d): both moments' rows in one copy
        beta1, beta2 = group["betas"]
        adamw_rows(param, picked[0], picked[1], grad.values(), step=float(state["step"]),
                   lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                   weight_decay=group["weight_decay"])
        p.index_copy_(0, rows, param)
        moments.index_copy_(1, rows, picked)


def _joined_moments(state: dict[str, Any]) -> Tensor:
    """The two moments of a sparse parameter's ``state`` as one ``(2, *shape)`` tensor whose
    ``[0]`` and ``[1]`` are ``state["exp_avg"]`` and ``state["exp_avg_sq"]`` (views), so that a
    step gathers and scatters both moments' rows in one call each. Joined on first use and again
    whenever the state's tensors were replaced (``load_state_dict``); the values never change,
    and ``state_dict`` holds the same two tensors as AdamW's (views of one storage)."""
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    joined = state.get(_JOINED)
    if joined is None or joined[0].data_ptr() != exp_avg.data_ptr() \
            or joined[1].data_ptr() != exp_avg_sq.data_ptr() or joined.shape[1:] != exp_avg.shape:
        joined = torch.stack([exp_avg, exp_avg_sq])
        state["exp_avg"], state["exp_avg_sq"] = joined[0], joined[1]
        state[_JOINED] = joined
    return joined


#: The state key of :func:`_joined_moments`' tensor (left out of :meth:`LazyAdamW.state_dict`).
_JOINED = "_moments"


def _dense_adamw(group: dict[str, Any], params: list[Tensor],
                 states: list[dict[str, Any]]) -> None:
    """torch's AdamW (multi-tensor) on ``params`` with dense gradients and their ``states``, at
    the hyperparameters of ``group``, in runs of parameters of at most
    :data:`FOREACH_MAX_ELEMENTS` values together (a parameter larger than that alone): the
    multi-tensor update's ``sqrt(v)`` temporaries then span one run, not the whole model, and
    every value is the one-call update's bit for bit (each tensor's arithmetic is its own)."""
    beta1, beta2 = group["betas"]
    state_of = {id(p): state for p, state in zip(params, states, strict=True)}
    for run in foreach_runs(params, FOREACH_MAX_ELEMENTS):
        own = [state_of[id(p)] for p in run]
        adamw(run, [p.grad for p in run], [s["exp_avg"] for s in own],  # type: ignore[misc]
              [s["exp_avg_sq"] for s in own], [], [s["step"] for s in own],
              foreach=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
              weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)


def step_together(optimizers: Sequence[Optimizer]) -> None:
    """``opt.step()`` of every optimiser, the dense parameters of all the :class:`LazyAdamW`
    among them that share hyperparameters (the runs of a group: one config, step and schedule)
    in one multi-tensor AdamW call (:func:`_dense_adamw`) instead of one per optimiser; each
    ``opt.step()`` then does its sparse rows only (:attr:`LazyAdamW.dense_done`). Each
    tensor's arithmetic is its own, so every value is what each ``opt.step()`` alone gives, bit
    for bit; other optimisers step as they are."""
    batches: dict[tuple[Any, ...], tuple[dict[str, Any], list[Tensor], list[dict[str, Any]]]] = {}
    lazy = [o for o in optimizers if isinstance(o, LazyAdamW)]
    for one in lazy:
        for group in one.param_groups:
            key = (group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"])
            _, params, states = batches.setdefault(key, (group, [], []))
            for p in group["params"]:
                if p.grad is not None and not p.grad.is_sparse:
                    params.append(p)
                    states.append(one._state(p))
    with torch.no_grad():
        for group, params, states in batches.values():
            _dense_adamw(group, params, states)
    for lazy_opt in lazy:
        lazy_opt.dense_done = True
    for opt in optimizers:
        opt.step()


#: The most parameter values one multi-tensor AdamW call updates together (16 MiB of float32
#: temporaries): a 22.7M-parameter MiniLM in one call held 91 MiB of ``sqrt(v)`` at once.
FOREACH_MAX_ELEMENTS = 1 << 22


def foreach_runs(params: list[Tensor], max_elements: int) -> list[list[Tensor]]:
    """``params`` cut, in order, into runs of at most ``max_elements`` values (a larger
    parameter alone).

    Example:
        >>> sizes = [len(r) for r in foreach_runs([torch.zeros(3), torch.zeros(2),
        ...                                         torch.zeros(9), torch.zeros(1)], 5)]
        >>> sizes
        [2, 1, 1]
    """
    runs: list[list[Tensor]] = []
    total = 0
    for p in params:
        if runs and total + p.numel() <= max_elements:
            runs[-1].append(p)
            total += p.numel()
        else:
            runs.append([p])
            total = p.numel()
    return runs


def _undecorated(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` without torch's ``_disable_dynamo`` wrapper (``functools.wraps`` keeps the
    function it wraps as ``__wrapped__``); the method itself where there is none."""
    inner: Callable[..., Any] = getattr(method, "__wrapped__", method)
    return inner


def coalesced(grad: Tensor) -> Tensor:
    """A sparse gradient with unique, sorted rows: ``grad`` itself when it has them already
    (as :mod:`crl.models.bag_rows` makes it: autograd's accumulation only drops the flag), else
    ``grad.coalesce()`` (a sort, repeated rows summed).

    Example:
        >>> g = torch.sparse_coo_tensor(torch.tensor([[1, 4]]), torch.ones(2, 3), (5, 3),
        ...                             check_invariants=False)
        >>> g.is_coalesced(), coalesced(g).is_coalesced(), torch.equal(coalesced(g).to_dense(),
        ...                                                            g.to_dense())
        (False, True, True)
    """
    if grad.is_coalesced() or grad.sparse_dim() != 1:
        return grad if grad.is_coalesced() else grad.coalesce()
    rows = grad._indices()[0]  # (K,)
    if rows.numel() < 2 or bool((rows[1:] > rows[:-1]).all()):
        return torch.sparse_coo_tensor(grad._indices(), grad._values(), grad.shape,
                                       is_coalesced=True, check_invariants=False)
    return grad.coalesce()


__all__ = ["LazyAdamW", "adamw_rows", "coalesced", "step_together"]

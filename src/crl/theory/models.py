"""Contrastive models whose population quantities are known exactly (docs/theory.md §1 and §2).

A model fixes the anchor law ``p(x)``, the positive law ``p+_x`` and the negative law ``p-_x``.
It samples anchors, positives and negatives (independent per anchor, SCRL, or one shared set,
SSCRL), gives the log density ratio ``log p+_x(y) / p-_x(y)`` (so the optimal score is
``s* = tau * log_density_ratio``), the optimal risk ``L*`` and optimal AUC ``E*``, and the exact
risk ``L(s)`` and AUC ``E(s)`` of the scorers for which they are computable.

This module holds the base class and the finite :class:`TabularModel`; the latent-class model is
in :mod:`crl.theory.latent` and the Gaussian models are in :mod:`crl.theory.gaussian`.

A *scorer* is a callable ``scorer(x, y) -> (N,)`` on batched float64 tensors (``x``, ``y`` with
``N`` rows). For the finite models ``x`` and ``y`` are int64 index tensors of shape ``(N,)`` and a
score table ``(|X|, |Y|)`` (numpy array, tensor or :class:`TableScorer`) is also a scorer.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from crl._validation import check_int_range, check_positive, describe
from crl.errors import CrlTypeError, CrlValueError

Scorer = Callable[[Tensor, Tensor], Tensor]
FloatArray = NDArray[np.float64]


class ExactModel(abc.ABC):
    """A data model ``(p, p+, p-)`` with exact answers; see the module docstring.

    Subclasses set :attr:`negatives_depend_on_anchor` (True when ``p-_x`` varies with ``x``, in
    which case shared negatives are not defined).
    """

    negatives_depend_on_anchor: bool = False

    @abc.abstractmethod
    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``n`` anchors ``x ~ p`` and their positives ``y ~ p+_x`` (row ``i`` pairs with ``i``)."""

    @abc.abstractmethod
    def sample_negatives(self, x: Tensor, m: int, generator: torch.Generator | None = None, *,
                         shared: bool = False) -> Tensor:
        """Negatives for anchors ``x``: ``(N, m, ...)`` independent ones or ``(m, ...)`` shared."""

    @abc.abstractmethod
    def log_density_ratio(self, x: Tensor, y: Tensor) -> Tensor:
        """``log p+_x(y) - log p-_x(y)`` for paired rows, shape ``(N,)``."""

    @abc.abstractmethod
    def optimal_risk(self, tau: float) -> float:
        """``L* = -tau E_x KL(p+_x || p-_x)`` (docs/theory.md §1)."""

    @abc.abstractmethod
    def optimal_auc(self) -> float:
        """``E*``, the AUC criterion of ``s*`` (docs/theory.md §1)."""

    def optimal_score(self, x: Tensor, y: Tensor, tau: float) -> Tensor:
        """``s*(x, y) = tau * log(p+_x(y) / p-_x(y))``, shape ``(N,)``."""
        check_positive(type(self).__name__ + ".optimal_score", "tau", tau)
        return tau * self.log_density_ratio(x, y)

    def optimal_scorer(self, tau: float) -> Scorer:
        """The optimal score as a scorer callable."""
        check_positive(type(self).__name__ + ".optimal_scorer", "tau", tau)
        return lambda x, y: self.optimal_score(x, y, tau)

    def anchor_risk(self, scorer: Any, x: Tensor, y: Tensor, tau: float) -> Tensor:
        """Exact ``tau log E_{y'~p-_x} exp((s(x,y') - s(x,y))/tau)`` per pair, shape ``(N,)``.

        The population risk conditional on the pair: the limit ``m -> infinity`` of the
        per-anchor empirical risk. Available where :meth:`risk` is.
        """
        raise CrlTypeError(
            f"{type(self).__name__}.anchor_risk: no exact inner expectation for a scorer of "
            f"type {type(scorer).__name__}; use crl.theory.estimators.mc_risk"
        )

    def risk(self, scorer: Any, tau: float) -> float:
        """Exact population risk ``L(s)`` (docs/theory.md §1), where computable."""
        raise CrlTypeError(
            f"{type(self).__name__}.risk: no exact risk for a scorer of type "
            f"{type(scorer).__name__}; use crl.theory.estimators.mc_risk"
        )

    def auc(self, scorer: Any) -> float:
        """Exact AUC criterion ``E(s)`` (docs/theory.md §1), where computable."""
        raise CrlTypeError(
            f"{type(self).__name__}.auc: no exact AUC for a scorer of type "
            f"{type(scorer).__name__}; use crl.theory.estimators.mc_auc"
        )


def _probabilities(where: str, name: str, value: Any, ndim: int) -> FloatArray:
    try:
        arr = np.asarray(value.detach().cpu() if isinstance(value, Tensor) else value,
                         dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise CrlTypeError(f"{where}: `{name}` must be an array of probabilities; "
                           f"got {describe(value)}") from exc
    if arr.ndim != ndim or arr.shape[-1] < 1:
        raise CrlValueError(f"{where}: `{name}` must be a {ndim}-D array of probabilities; "
                            f"got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise CrlValueError(f"{where}: `{name}` must be finite and >= 0; got {arr.tolist()!r:.80}")
    sums = arr.sum(axis=-1)
    if not np.allclose(sums, 1.0, atol=1e-9):
        raise CrlValueError(f"{where}: every row of `{name}` must sum to 1; got sums "
                            f"{np.atleast_1d(sums).tolist()!r:.80}")
    return arr


def _check_generator(where: str, generator: Any) -> torch.Generator | None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise CrlTypeError(f"{where}: `generator` must be a torch.Generator or None; "
                           f"got {describe(generator)}")
    return generator


class TableScorer:
    """A score table ``S (|X|, |Y|)`` used as a scorer on index tensors: ``s(x, y) = S[x, y]``.

    Example:
        >>> s = TableScorer([[0.0, 1.0], [2.0, 3.0]])
        >>> s(torch.tensor([1, 0]), torch.tensor([0, 1])).tolist()
        [2.0, 1.0]
    """

    def __init__(self, table: Any) -> None:
        arr = np.asarray(table.detach().cpu() if isinstance(table, Tensor) else table,
                         dtype=np.float64)
        if arr.ndim != 2 or np.any(np.isnan(arr) | (arr == np.inf)):
            raise CrlValueError(f"TableScorer: `table` must be a 2-D array without NaN or +inf "
                                f"(-inf marks impossible pairs); got {describe(table)}")
        self.table: FloatArray = arr
        self._tensor = torch.from_numpy(arr)

    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        return self._tensor[x.long(), y.long()]


class TabularModel(ExactModel):
    """Finite anchors and candidates (docs/theory.md §2, ``TabularModel``).

    Args:
        p_x: ``(X,)`` anchor probabilities.
        p_pos: ``(X, Y)`` positive laws, row ``x`` is ``p+_x``.
        p_neg: ``(Y,)`` negative law shared by all anchors, or ``(X, Y)`` one per anchor. Must be
            positive wherever ``p+_x`` is (so ``L*`` is finite). Default: the y-marginal
            ``sum_x p(x) p+_x``.

    Samples are int64 index tensors: ``sample`` gives ``x (n,)``, ``y (n,)``.

    Example:
        >>> model = TabularModel([0.5, 0.5], [[0.9, 0.1], [0.1, 0.9]])
        >>> round(model.optimal_risk(1.0), 6)  # -KL(0.9,0.1 || 0.5,0.5)
        -0.368064
        >>> round(model.optimal_auc(), 6)  # 0.9 * 0.5 + (0.9 * 0.5 + 0.1 * 0.5) / 2
        0.7
    """

    def __init__(self, p_x: Any, p_pos: Any, p_neg: Any = None) -> None:
        where = "TabularModel"
        self.p_x = _probabilities(where, "p_x", p_x, 1)
        self.p_pos = _probabilities(where, "p_pos", p_pos, 2)
        if self.p_pos.shape[0] != self.p_x.shape[0]:
            raise CrlValueError(f"{where}: `p_pos` must have one row per anchor, shape "
                                f"({self.p_x.shape[0]}, Y); got {self.p_pos.shape}")
        if p_neg is None:
            p_neg = self.p_x @ self.p_pos
            p_neg = p_neg / p_neg.sum()
        arr = np.asarray(p_neg.detach().cpu() if isinstance(p_neg, Tensor) else p_neg,
                         dtype=np.float64)
        self.p_neg_matrix = _probabilities(where, "p_neg", arr, arr.ndim if arr.ndim in (1, 2)
                                           else 1)
        if self.p_neg_matrix.shape[-1] != self.p_pos.shape[1] or (
                self.p_neg_matrix.ndim == 2 and self.p_neg_matrix.shape != self.p_pos.shape):
            raise CrlValueError(f"{where}: `p_neg` must have shape (Y,) = ({self.p_pos.shape[1]},)"
                                f" or {self.p_pos.shape}; got {arr.shape}")
        if self.p_neg_matrix.ndim == 1:
            self.negatives_depend_on_anchor = False
            self.p_neg_matrix = np.broadcast_to(self.p_neg_matrix, self.p_pos.shape).copy()
        else:
            self.negatives_depend_on_anchor = True
        if np.any((self.p_pos > 0) & (self.p_neg_matrix == 0)):
            raise CrlValueError(f"{where}: `p_neg` must be > 0 wherever `p_pos` is (else "
                                "KL(p+ || p-) and L* are infinite)")
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.log(self.p_pos) - np.log(self.p_neg_matrix)
        # Cells with p+ = p- = 0 never occur; give them a finite, irrelevant value.
        self.log_ratio: FloatArray = np.where(np.isnan(ratio), 0.0, ratio)

    @property
    def num_anchors(self) -> int:
        """``|X|``."""
        return int(self.p_x.shape[0])

    @property
    def num_candidates(self) -> int:
        """``|Y|``."""
        return int(self.p_pos.shape[1])

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``x (n,)`` and ``y (n,)`` int64 indices, ``x ~ p_x``, ``y ~ p+_x``."""
        where = "TabularModel.sample"
        check_int_range(where, "n", n, 1, None)
        generator = _check_generator(where, generator)
        x = torch.multinomial(torch.from_numpy(self.p_x), n, replacement=True,
                              generator=generator)
        y = _rows_multinomial(torch.from_numpy(self.p_pos)[x], 1, generator)[:, 0]
        return x, y

    def sample_negatives(self, x: Tensor, m: int, generator: torch.Generator | None = None, *,
                         shared: bool = False) -> Tensor:
        """Independent ``(N, m)`` negatives ``y' ~ p-_x`` per anchor, or shared ``(m,)``.

        Raises:
            CrlValueError: for ``shared=True`` when ``p-`` depends on the anchor.
        """
        where = "TabularModel.sample_negatives"
        check_int_range(where, "m", m, 1, None)
        generator = _check_generator(where, generator)
        if shared:
            if self.negatives_depend_on_anchor:
                raise CrlValueError(f"{where}: shared negatives need one negative law for all "
                                    "anchors; this model's `p_neg` has one row per anchor")
            return torch.multinomial(torch.from_numpy(self.p_neg_matrix[0]), m, replacement=True,
                                     generator=generator)
        return _rows_multinomial(torch.from_numpy(self.p_neg_matrix)[x.long()], m, generator)

    def log_density_ratio(self, x: Tensor, y: Tensor) -> Tensor:
        """``log p+_x(y) / p-_x(y)`` looked up in the table, shape ``(N,)``."""
        return torch.from_numpy(self.log_ratio)[x.long(), y.long()]

    def optimal_table(self, tau: float) -> FloatArray:
        """``s* = tau log(p+/p-)`` as a ``(X, Y)`` table (``-inf`` where ``p+ = 0``)."""
        check_positive("TabularModel.optimal_table", "tau", tau, allow_tensor=False)
        return tau * self.log_ratio

    def kl(self) -> FloatArray:
        """``KL(p+_x || p-_x)`` per anchor, shape ``(X,)``."""
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(self.p_pos > 0, self.p_pos * self.log_ratio, 0.0)
        return np.asarray(terms.sum(axis=1), dtype=np.float64)

    def optimal_risk(self, tau: float) -> float:
        check_positive("TabularModel.optimal_risk", "tau", tau, allow_tensor=False)
        return float(-tau * self.p_x @ self.kl())

    def optimal_auc(self) -> float:
        return self.auc(self.log_ratio)

    def table_of(self, scorer: Any) -> FloatArray:
        """The ``(X, Y)`` score table of ``scorer`` (a table, a TableScorer or a callable).

        Entries may be ``-inf`` (a pair the scorer rules out, as ``s*`` does where ``p+ = 0``)
        but not NaN or ``+inf``.
        """
        where = "TabularModel"
        if isinstance(scorer, TableScorer):
            table = scorer.table
        elif isinstance(scorer, (np.ndarray, Tensor, list)):
            table = np.asarray(scorer.detach().cpu() if isinstance(scorer, Tensor) else scorer,
                               dtype=np.float64)
        elif callable(scorer):
            xs, ys = torch.meshgrid(torch.arange(self.num_anchors),
                                    torch.arange(self.num_candidates), indexing="ij")
            out = scorer(xs.reshape(-1), ys.reshape(-1))
            table = np.asarray(torch.as_tensor(out).detach().cpu(), dtype=np.float64)
            table = table.reshape(self.num_anchors, self.num_candidates)
        else:
            raise CrlTypeError(f"{where}: `scorer` must be a score table or a callable; "
                               f"got {describe(scorer)}")
        if table.shape != self.p_pos.shape:
            raise CrlValueError(f"{where}: the score table must have shape {self.p_pos.shape}; "
                                f"got {table.shape}")
        bad = np.isnan(table) | (table == np.inf)
        if np.any(bad):
            raise CrlValueError(f"{where}: the score table must have no NaN or +inf entries; got "
                                f"{int(bad.sum())}")
        return table

    def risk_tensor(self, table: Tensor, tau: float | Tensor) -> Tensor:
        """Differentiable exact risk of a ``(X, Y)`` score table (docs/theory.md §2):

        ``L(S) = sum_x p(x) [ tau log sum_y p-_x(y) e^{S_xy/tau} - sum_y p+_x(y) S_xy ]``.
        """
        p_x = torch.from_numpy(self.p_x).to(table)
        p_pos = torch.from_numpy(self.p_pos).to(table)
        with np.errstate(divide="ignore"):
            log_neg = torch.from_numpy(np.log(self.p_neg_matrix)).to(table)
        inner = tau * torch.logsumexp(log_neg + table / tau, dim=1)  # (X,)
        positive = torch.where(p_pos > 0, p_pos * table, torch.zeros_like(table)).sum(dim=1)
        return (p_x * (inner - positive)).sum()

    def risk(self, scorer: Any, tau: float) -> float:
        check_positive("TabularModel.risk", "tau", tau, allow_tensor=False)
        table = torch.from_numpy(self.table_of(scorer))
        return float(self.risk_tensor(table, tau))

    def anchor_risk(self, scorer: Any, x: Tensor, y: Tensor, tau: float) -> Tensor:
        check_positive("TabularModel.anchor_risk", "tau", tau, allow_tensor=False)
        table = torch.from_numpy(self.table_of(scorer))
        with np.errstate(divide="ignore"):
            log_neg = torch.from_numpy(np.log(self.p_neg_matrix))
        inner = tau * torch.logsumexp(log_neg + table / tau, dim=1)  # (X,)
        return inner[x.long()] - table[x.long(), y.long()]

    def auc(self, scorer: Any) -> float:
        """Exact ``E(s) = sum_x p(x) sum_{y,y'} p+(y) p-(y') [1{s(y)>s(y')} + 1{=}/2]``."""
        table = self.table_of(scorer)
        return float(self.p_x @ _row_auc(table, self.p_pos, self.p_neg_matrix))

    def tilted_kl(self, scorer: Any, tau: float) -> FloatArray:
        """``KL(p+_x || q_{s,x})`` per anchor, ``q_{s,x} ∝ p-_x e^{s/tau}`` (docs/theory.md §1)."""
        check_positive("TabularModel.tilted_kl", "tau", tau, allow_tensor=False)
        table = self.table_of(scorer)
        with np.errstate(divide="ignore"):
            log_q = np.log(self.p_neg_matrix) + table / tau
        log_q = log_q - np.logaddexp.reduce(log_q, axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(self.p_pos > 0, self.p_pos * (np.log(self.p_pos) - log_q), 0.0)
        return np.asarray(terms.sum(axis=1), dtype=np.float64)

    def pairwise_risk(self, scorer: Any, loss: str) -> float:
        """Exact pairwise surrogate risk ``E l(s(x, y) - s(x, y'))`` (docs/theory.md §8)."""
        table = self.table_of(scorer)
        t = table[:, :, None] - table[:, None, :]  # (X, Y, Y'): s(y) - s(y')
        values = _pairwise_loss(t, loss)
        weights = self.p_pos[:, :, None] * self.p_neg_matrix[:, None, :]
        return float(self.p_x @ (weights * values).sum(axis=(1, 2)))


PAIRWISE = ("logistic", "exponential", "squared_hinge", "hinge")


def _pairwise_loss(t: FloatArray, loss: str) -> FloatArray:
    if loss == "logistic":
        return np.asarray(np.logaddexp(0.0, -t), dtype=np.float64)
    if loss == "exponential":
        return np.asarray(np.exp(-t), dtype=np.float64)
    if loss == "squared_hinge":
        return np.asarray(np.maximum(0.0, 1.0 - t) ** 2, dtype=np.float64)
    if loss == "hinge":
        return np.asarray(np.maximum(0.0, 1.0 - t), dtype=np.float64)
    raise CrlValueError(f"pairwise_risk: unknown loss {loss!r}; valid values are "
                        + ", ".join(repr(p) for p in PAIRWISE))


def _row_auc(table: FloatArray, p_pos: FloatArray, p_neg: FloatArray) -> FloatArray:
    """Per-row AUC ``(X,)`` of a score table."""
    above = (table[:, :, None] > table[:, None, :]).astype(np.float64)
    ties = (table[:, :, None] == table[:, None, :]).astype(np.float64)
    weights = p_pos[:, :, None] * p_neg[:, None, :]
    return np.asarray((weights * (above + 0.5 * ties)).sum(axis=(1, 2)), dtype=np.float64)


def _rows_multinomial(probs: Tensor, m: int, generator: torch.Generator | None) -> Tensor:
    """``m`` draws per row of ``probs (N, Y)`` by inverse CDF -> ``(N, m)`` int64."""
    cdf = torch.cumsum(probs, dim=1)
    cdf[:, -1] = 1.0
    u = torch.rand(probs.shape[0], m, generator=generator, dtype=probs.dtype)
    idx = torch.searchsorted(cdf, u, right=True)
    return idx.clamp_(max=probs.shape[1] - 1)

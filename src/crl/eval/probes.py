"""Downstream probes on frozen features: linear probe, weighted kNN and zero-shot.

Each returns a :class:`ProbeResult` with accuracy and balanced accuracy (the mean of per-class
recalls, which does not reward predicting the majority class under class imbalance).

Ties count against the true class, as in :mod:`crl.eval.retrieval` (docs/theory.md §11):
an item of zero-shot or of the kNN vote is correct only when its class scores strictly above
every other class, so a collapsed encoder (all classes scored alike) is right for no item,
instead of for every item of class 0 as ``argmax`` would have it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from crl._validation import check_int_range, check_positive, check_tensor, describe
from crl.errors import CrlTypeError, CrlValueError


@dataclass(frozen=True)
class ProbeResult:
    """Accuracy and balanced accuracy of a probe on held-out data."""

    accuracy: float
    balanced_accuracy: float


def _check_labels(where: str, name: str, labels: Tensor, n: int) -> Tensor:
    if not isinstance(labels, Tensor):
        raise CrlTypeError(f"{where}: `{name}` must be a torch.Tensor; got {describe(labels)}")
    if labels.dim() != 1 or labels.shape[0] != n:
        raise CrlValueError(
            f"{where}: `{name}` must have shape ({n},) to match the features; "
            f"got {tuple(labels.shape)}"
        )
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise CrlTypeError(f"{where}: `{name}` must be integers; got dtype {labels.dtype}")
    if n > 0 and int(labels.min()) < 0:
        raise CrlValueError(f"{where}: `{name}` must be >= 0 (no unlabelled items); got "
                            f"{int(labels.min())}")
    return labels.detach().cpu().long()


def _check_split(where: str, train_x: Tensor, train_y: Tensor, test_x: Tensor,
                 test_y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    train_x = check_tensor(where, "train_x", train_x, ndim=2).detach().cpu()
    test_x = check_tensor(where, "test_x", test_x, ndim=2).detach().cpu()
    if train_x.shape[1] != test_x.shape[1]:
        raise CrlValueError(
            f"{where}: `train_x` and `test_x` must have the same feature dimension; "
            f"got {train_x.shape[1]} and {test_x.shape[1]}"
        )
    if train_x.shape[0] == 0 or test_x.shape[0] == 0:
        raise CrlValueError(f"{where}: need non-empty train and test sets; got "
                            f"{train_x.shape[0]} and {test_x.shape[0]} rows")
    train_y = _check_labels(where, "train_y", train_y, train_x.shape[0])
    test_y = _check_labels(where, "test_y", test_y, test_x.shape[0])
    return train_x, train_y, test_x, test_y


def accuracy_scores(predicted: Tensor, target: Tensor) -> ProbeResult:
    """Accuracy and balanced accuracy (mean recall over the classes present in ``target``).

    Example:
        >>> accuracy_scores(torch.tensor([0, 0, 0, 1]), torch.tensor([0, 0, 0, 0]))
        ProbeResult(accuracy=0.75, balanced_accuracy=0.75)
        >>> accuracy_scores(torch.tensor([0, 0, 0, 0]), torch.tensor([0, 0, 0, 1]))
        ProbeResult(accuracy=0.75, balanced_accuracy=0.5)
    """
    predicted, target = predicted.long().cpu(), target.long().cpu()
    correct = (predicted == target).double()
    recalls = [float(correct[target == c].mean()) for c in torch.unique(target).tolist()]
    return ProbeResult(float(correct.mean()), float(np.mean(recalls)))


def pessimistic_predictions(scores: Tensor, target: Tensor) -> Tensor:
    """Each row's predicted class, with ties counted against the true class.

    The prediction is ``target[i]`` when its score is strictly the largest of row ``i``;
    otherwise it is the best-scoring other class (the first one, by index, among equals), so
    an exact tie with another class is a miss.

    Args:
        scores: ``(M, C)`` class scores.
        target: ``(M,)`` true classes in ``[0, C)``.

    Returns:
        ``(M,)`` int64 predicted classes.

    Example:
        >>> pessimistic_predictions(torch.tensor([[1.0, 1.0], [2.0, 1.0]]), torch.tensor([0, 0]))
        tensor([1, 0])
    """
    target = target.long()
    own = scores.gather(1, target[:, None])  # (M, 1)
    others = scores.scatter(1, target[:, None], float("-inf"))  # (M, C), the true class masked
    best_other, other_class = others.max(dim=1)
    return torch.where(own[:, 0] > best_other, target, other_class)


def linear_probe(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, *,
                 c: float = 1.0, max_iter: int = 2000) -> ProbeResult:
    """Multinomial logistic regression (scikit-learn, L-BFGS) on standardised frozen features.

    The features are standardised with the training split's mean and standard deviation; the
    solver is deterministic.

    Args:
        train_x: ``(N, D)`` training features.
        train_y: ``(N,)`` integer labels.
        test_x: ``(M, D)`` held-out features.
        test_y: ``(M,)`` integer labels.
        c: Inverse L2 regularisation strength (scikit-learn's ``C``).
        max_iter: L-BFGS iterations.

    Returns:
        Held-out accuracy and balanced accuracy.

    Example:
        >>> x = torch.tensor([[0.0], [1.0], [4.0], [5.0]])
        >>> linear_probe(x, torch.tensor([0, 0, 1, 1]), x, torch.tensor([0, 0, 1, 1]))
        ProbeResult(accuracy=1.0, balanced_accuracy=1.0)
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    where = "linear_probe"
    train_x, train_y, test_x, test_y = _check_split(where, train_x, train_y, test_x, test_y)
    check_positive(where, "c", c, allow_tensor=False)
    check_int_range(where, "max_iter", max_iter, 1, None)
    if torch.unique(train_y).numel() < 2:
        raise CrlValueError(f"{where}: `train_y` needs at least 2 classes; got "
                            f"{torch.unique(train_y).tolist()}")
    scaler = StandardScaler().fit(train_x.double().numpy())
    classifier = LogisticRegression(C=c, max_iter=max_iter)
    classifier.fit(scaler.transform(train_x.double().numpy()), train_y.numpy())
    predicted = classifier.predict(scaler.transform(test_x.double().numpy()))
    return accuracy_scores(torch.from_numpy(np.asarray(predicted)), test_y)


def knn_probe(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, *,
              k: int = 20, temperature: float = 0.07, block_size: int = 1024) -> ProbeResult:
    """Weighted k-nearest-neighbour classifier on cosine similarity (Wu et al. 2018).

    Each of the ``k`` most similar training items votes for its class with weight
    ``exp(cos / temperature)``; a tie in the vote counts against the true class
    (:func:`pessimistic_predictions`). Test items are processed in blocks of ``block_size`` rows.

    Args:
        train_x: ``(N, D)`` training features.
        train_y: ``(N,)`` integer labels.
        test_x: ``(M, D)`` held-out features.
        test_y: ``(M,)`` integer labels.
        k: Neighbours (capped at ``N``).
        temperature: Vote temperature ``> 0``.
        block_size: Test rows scored at once.

    Returns:
        Held-out accuracy and balanced accuracy.

    Example:
        >>> x = torch.tensor([[1.0, 0.1], [1.0, -0.1], [-1.0, 0.1], [-1.0, -0.1]])
        >>> y = torch.tensor([0, 0, 1, 1])
        >>> knn_probe(x, y, x, y, k=3)
        ProbeResult(accuracy=1.0, balanced_accuracy=1.0)
    """
    where = "knn_probe"
    train_x, train_y, test_x, test_y = _check_split(where, train_x, train_y, test_x, test_y)
    check_int_range(where, "k", k, 1, None)
    check_positive(where, "temperature", temperature, allow_tensor=False)
    check_int_range(where, "block_size", block_size, 1, None)
    train = F.normalize(train_x.double(), dim=1)
    test = F.normalize(test_x.double(), dim=1)
    num_classes = int(max(int(train_y.max()), int(test_y.max()))) + 1
    k = min(k, train.shape[0])
    predicted = torch.empty(test.shape[0], dtype=torch.long)
    for start in range(0, test.shape[0], block_size):
        sims = test[start:start + block_size] @ train.T  # (Q, N)
        top, idx = sims.topk(k, dim=1)  # (Q, k)
        votes = torch.zeros(sims.shape[0], num_classes, dtype=torch.float64)
        votes.scatter_add_(1, train_y[idx], torch.exp((top - 1.0) / temperature))
        predicted[start:start + block_size] = pessimistic_predictions(
            votes, test_y[start:start + block_size])
    return accuracy_scores(predicted, test_y)


def zero_shot(features: Tensor, class_embeddings: Tensor, labels: Tensor) -> ProbeResult:
    """Zero-shot classification: each item takes the class whose prompt embedding is the most
    cosine-similar (CLIP; the class embeddings come from the text tower on prompts such as
    ``"a photo of a {class}"``); a tie with the true class counts as a miss
    (:func:`pessimistic_predictions`).

    Args:
        features: ``(M, D)`` item embeddings.
        class_embeddings: ``(C, D)`` one embedding per class (row c is class c).
        labels: ``(M,)`` integer labels in ``[0, C)``.

    Returns:
        Accuracy and balanced accuracy.

    Example:
        >>> f = torch.tensor([[1.0, 0.2], [0.1, 1.0]])
        >>> zero_shot(f, torch.eye(2), torch.tensor([0, 1]))
        ProbeResult(accuracy=1.0, balanced_accuracy=1.0)
        >>> zero_shot(f, torch.ones(2, 2), torch.tensor([0, 1]))  # all classes alike: no credit
        ProbeResult(accuracy=0.0, balanced_accuracy=0.0)
    """
    where = "zero_shot"
    features = check_tensor(where, "features", features, ndim=2).detach().cpu()
    classes = check_tensor(where, "class_embeddings", class_embeddings, ndim=2).detach().cpu()
    if classes.shape[1] != features.shape[1]:
        raise CrlValueError(
            f"{where}: `class_embeddings` must have dimension {features.shape[1]} like "
            f"`features`; got {classes.shape[1]}"
        )
    labels = _check_labels(where, "labels", labels, features.shape[0])
    if features.shape[0] > 0 and int(labels.max()) >= classes.shape[0]:
        raise CrlValueError(f"{where}: `labels` must be < {classes.shape[0]} (one class "
                            f"embedding per class); got {int(labels.max())}")
    sims = F.normalize(features.double(), dim=1) @ F.normalize(classes.double(), dim=1).T
    return accuracy_scores(pessimistic_predictions(sims, labels), labels)


__all__ = ["ProbeResult", "accuracy_scores", "knn_probe", "linear_probe",
           "pessimistic_predictions", "zero_shot"]

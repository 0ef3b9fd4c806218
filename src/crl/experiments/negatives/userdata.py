"""The user's data as the negatives study sees it: the training pairs their ``crl train`` uses
(the default ``--target-n``) and a preset's n span fitted to a file with fewer pairs than it
needs (docs/negatives.md, "The study")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crl.errors import CrlValueError


def user_training(run_config: dict[str, Any], base: dict[str, Any] | None, kind: str,
                  train_size: int) -> dict[str, Any]:
    """The training pairs the user's own ``crl train`` uses, the default target n:
    ``{"user_train_size": N, "target_source": words}``.

    - ``--config``: the config's training split as given (its split, and ``data.num_train``
      when it caps it); the study's runs keep that split, so it is ``train_size`` capped.
    - ``--data FILE`` without a config: the training split ``crl train`` draws from that file
      with :class:`~crl.data.DataConfig`'s default fractions (the study's own runs hold out no
      validation split, so theirs is larger).
    - a built-in data set: the study's whole training split.

    Args:
        run_config: A grid run's config (its ``data`` section is the study's).
        base: The user's resolved config (None without ``--config``).
        kind: ``files`` for a user's file, else the data set's name.
        train_size: Pairs in the study's training split.
    """
    if base is not None:
        cap = base["data"].get("num_train")
        if cap is not None and cap < train_size:
            return {"user_train_size": int(cap), "target_source":
                    f"the {int(cap):,} training pairs of your config (its data.num_train)"}
        return {"user_train_size": train_size, "target_source":
                f"the {train_size:,} pairs of your config's training split"}
    if kind == "files":
        from crl.data import DataConfig, load_data

        defaults = DataConfig()
        data = DataConfig.model_validate({**run_config["data"], "num_train": None,
                                          "val_fraction": defaults.val_fraction,
                                          "test_fraction": defaults.test_fraction})
        size = len(load_data(data, progress=False).train)
        return {"user_train_size": size, "target_source":
                f"the {size:,} training pairs crl train draws from this file with its default "
                f"split ({100 * defaults.val_fraction:g}% validation, "
                f"{100 * defaults.test_fraction:g}% test)"}
    return {"user_train_size": train_size, "target_source":
            f"the whole training split ({train_size:,} pairs)"}


def fit_span(ns: Sequence[int], train_size: int) -> tuple[int, ...] | None:
    """A preset's ``ns`` scaled to a file whose training split holds fewer pairs than its
    largest n: the same ratios, the largest n the whole split; None when they fit.

    Raises:
        CrlValueError: when the scaled span collapses to fewer than two n.

    Example:
        >>> fit_span((250, 500, 1000, 2000), 1500)
        (188, 375, 750, 1500)
        >>> fit_span((250, 500, 1000, 2000), 5000) is None
        True
    """
    top = max(ns)
    if top <= train_size:
        return None
    scaled = tuple(sorted({max(2, round(n * train_size / top)) for n in ns}))
    if len(scaled) < 2:
        raise CrlValueError(f"study negatives: the file's {train_size:,} training pairs are too "
                            f"few for a span of n (the preset's {list(ns)} scaled to them "
                            f"collapse to {list(scaled)}); give a larger file")
    return scaled


def span_text(preset: str, preset_ns: Sequence[int], fitted: Sequence[int],
              train_size: int) -> str:
    """Why the grid's n are not the preset's, with the numbers."""
    return (f"The {preset} preset's n ({', '.join(f'{n:,}' for n in preset_ns)}) need "
            f"{max(preset_ns):,} training pairs; this file's training split holds "
            f"{train_size:,}, so n is scaled to {', '.join(f'{n:,}' for n in fitted)} (the same "
            "ratios, the largest n the whole split).")

"""``model.kind: custom``: towers built by the user's own function, named in the config as
``"package.module:function"`` (docs/data.md, "Your own towers").

Importing the module the config names is the point of this option: the user's code runs in
crl's process, as it would in their own training script. crl then trains, checkpoints and
evaluates the towers like its own.

It is code to run, so it runs only when the user names it: in the config they pass themselves
(``crl train CONFIG``, a study's ``--config``), or, for a config crl reads back from a run
directory someone may have sent (``crl eval``/``encode``/``export``), on the command line
(``--trust-factory MODULE:FN``). :func:`check_trusted` is that decision, taken once where such
a config is read (:func:`crl.train.trained.read_run_config`); docs/errors.md, "Files run no code".
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
from typing import Any

from torch import nn

from crl.data.base import DataInfo
from crl.errors import CrlValueError
from crl.models.config import ModelConfig
from crl.models.dual import TextFeaturizer


def check_trusted(cfg: ModelConfig, trusted: Collection[str], *, origin: str) -> None:
    """Refuse a model config read from a file crl did not get from the user (a run directory's
    ``config.json``) when it names a factory the user did not name in ``trusted``.

    Args:
        cfg: The model section of the config read back.
        trusted: The factories (``"package.module:function"``) the user named themselves, e.g.
            with ``--trust-factory``.
        origin: The file the config came from (for the message).

    Raises:
        CrlValueError: naming the factory and how to opt in; nothing is imported.

    Example:
        >>> check_trusted(ModelConfig(kind="custom", factory="towers:build"), {"towers:build"},
        ...               origin="runs/x/config.json")
        >>> check_trusted(ModelConfig(kind="mlp"), set(), origin="runs/x/config.json")
    """
    if cfg.kind != "custom" or cfg.factory is None or cfg.factory in trusted:
        return
    raise CrlValueError(
        f"{origin} names code to run (model.factory {cfg.factory!r}); crl imports a run "
        f"directory's factory only when you name it: pass --trust-factory {cfg.factory} "
        "if you trust that module"
    )


def load_factory(spec: str) -> Any:
    """The function ``spec`` (``"package.module:function"``) names.

    Raises:
        CrlValueError: if the module cannot be imported or has no such callable.
    """
    module_name, _, function_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CrlValueError(
            f"model.factory: cannot import module {module_name!r} ({exc}); it must be "
            "importable from where crl runs (e.g. on PYTHONPATH)"
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise CrlValueError(
            f"model.factory: module {module_name!r} ({getattr(module, '__file__', '?')}) has no "
            f"function {function_name!r}"
        )
    return function


def custom_towers(cfg: ModelConfig,
                  info: DataInfo) -> tuple[nn.Module, nn.Module, TextFeaturizer | None]:
    """Call ``cfg.factory(cfg, info)`` and check what it returns.

    Returns:
        ``(tower_a, tower_b, featurizer)``: ``tower_b is tower_a`` when the factory returned
        one module; ``featurizer`` is ``tower_a.featurize`` for text data, else None.

    Raises:
        CrlValueError: if ``factory`` is unset, cannot be loaded, does not return a module or
            a pair of modules, or (text data) the first tower has no ``featurize`` method.
    """
    if cfg.factory is None:
        raise CrlValueError("model.factory: kind 'custom' needs factory: "
                            "'package.module:function'")
    factory = load_factory(cfg.factory)
    try:
        out = factory(cfg, info)
    except Exception as exc:  # the user's code: one line here, the traceback under --debug
        raise CrlValueError(f"model.factory: {cfg.factory}(model, info) raised "
                            f"{type(exc).__name__}: {exc}") from exc
    if isinstance(out, nn.Module):
        tower_a = tower_b = out
    elif (isinstance(out, tuple) and len(out) == 2
          and all(isinstance(t, nn.Module) for t in out)):
        tower_a, tower_b = out
    else:
        raise CrlValueError(
            f"model.factory: {cfg.factory} must return an nn.Module (one shared tower) or a "
            f"pair (tower_a, tower_b) of nn.Modules; got {type(out).__name__}"
        )
    featurizer: TextFeaturizer | None = None
    if info.kind == "text":
        featurize = getattr(tower_a, "featurize", None)
        if not callable(featurize):
            raise CrlValueError(
                f"model.factory: the data is text, so the first tower {cfg.factory} returns "
                "needs a method featurize(texts) -> Tensor (N, ...) that turns texts into its "
                "inputs"
            )
        featurizer = featurize
    return tower_a, tower_b, featurizer

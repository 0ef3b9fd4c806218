"""YAML with limits: crl's one way to read a YAML document a user gives it.

``yaml.safe_load`` builds no objects but plain values, yet it has two ways to exhaust a machine:
aliases (``*name``) that nest, so a document of a few hundred bytes stands for billions of values
(the "billion laughs"; PyYAML shares the aliased objects, and the first code that walks them, a
validator or an error message, expands them), and deep nesting, which its recursive composer
turns into a ``RecursionError``. :func:`load_yaml` first counts, from the parser's events and
without building anything, how many values the document stands for once every alias is expanded
and how deep it nests, and refuses one beyond :data:`MAX_VALUES` or :data:`MAX_DEPTH` with one
line. Error messages quote at most :data:`QUOTE_LIMIT` characters of the document.

Example:
    >>> load_yaml("train: {steps: 3}\\nks: &k [1, 5]\\nagain: *k", "run.yaml")
    {'train': {'steps': 3}, 'ks': [1, 5], 'again': [1, 5]}
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml import events

from crl._validation import clip_text
from crl.errors import CrlValueError

#: The most values (scalars and collections, each alias counted as what it stands for) a
#: document may expand to. A run config has about a hundred.
MAX_VALUES = 100_000
#: The deepest nesting of mappings and sequences a document may have (a run config has 3).
MAX_DEPTH = 64
#: The most characters of a document quoted in an error message.
QUOTE_LIMIT = 200


class YamlLimitError(CrlValueError):
    """A document beyond :data:`MAX_VALUES` values or :data:`MAX_DEPTH` levels."""


def _line(event: events.Event) -> str:
    mark = event.start_mark
    return f"line {mark.line + 1}" if mark is not None else "an unknown line"


def _check_expansion(text: str, origin: str) -> None:
    """Refuse a document that expands beyond :data:`MAX_VALUES` values or nests deeper than
    :data:`MAX_DEPTH`; the size of each anchored node is known when its alias is met."""
    total = 0
    sizes = [0]  # the values counted so far in each open collection (innermost last)
    anchors: list[str | None] = [None]
    anchored: dict[str, int] = {}  # anchor -> the number of values its node stands for
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (events.MappingStartEvent, events.SequenceStartEvent)):
            if len(sizes) > MAX_DEPTH:
                raise YamlLimitError(
                    f"{origin}: the YAML nests deeper than {MAX_DEPTH} levels ({_line(event)}); "
                    f"crl reads configs of at most {MAX_DEPTH} levels of mappings and lists")
            total += 1
            sizes.append(1)
            anchors.append(event.anchor)
        elif isinstance(event, (events.MappingEndEvent, events.SequenceEndEvent)):
            size, anchor = sizes.pop(), anchors.pop()
            if anchor is not None:
                anchored[anchor] = size
            sizes[-1] += size
        elif isinstance(event, (events.ScalarEvent, events.AliasEvent)):
            size = (1 if isinstance(event, events.ScalarEvent) or event.anchor is None
                    else anchored.get(event.anchor, 1))
            if isinstance(event, events.ScalarEvent) and event.anchor is not None:
                anchored[event.anchor] = 1
            total += size
            sizes[-1] += size
        if total > MAX_VALUES:
            raise YamlLimitError(
                f"{origin}: the YAML holds more than {MAX_VALUES:,} values once its aliases "
                f"(*name) are expanded, near {_line(event)}; crl refuses documents that large "
                "(nested aliases: a 'billion laughs'); write the values out instead")


def load_yaml(text: str, origin: str) -> Any:
    """Parse one YAML document into plain values (``yaml.safe_load``), within the limits.

    Args:
        text: The document.
        origin: How messages name it (``"run.yaml"``, ``"--set train.steps=3"``).

    Returns:
        The document's value (a dict, list, scalar or None).

    Raises:
        CrlValueError: for malformed YAML, a tag other than YAML's own (``!!python/...``) or
            a number too long to convert; :class:`YamlLimitError` (a CrlValueError) for more
            than :data:`MAX_VALUES` values once aliases are expanded, or nesting deeper than
            :data:`MAX_DEPTH`. The message quotes at most :data:`QUOTE_LIMIT` characters of the
            document.
    """
    try:
        _check_expansion(text, origin)
        return yaml.load(text, Loader=yaml.SafeLoader)
    except CrlValueError:
        raise
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: int("1" * 5000), too many digits
        reason = clip_text(str(exc), QUOTE_LIMIT)
        raise CrlValueError(f"{origin}: not valid YAML: {reason}") from None


__all__ = ["MAX_DEPTH", "MAX_VALUES", "QUOTE_LIMIT", "YamlLimitError", "load_yaml"]

"""Short against long descriptions from what a Debian-like machine has installed: a text-pair
file of a user's kind (a one-line summary as the query, its long description as the document)
for tests, benchmarks and the README's walk-through, built without a network.

- :func:`debian_descriptions`: the installed packages of ``/var/lib/dpkg/status``: a package's
  ``Description:`` line (the synopsis) against its extended description (a few hundred pairs
  on a slim image);
- :func:`man_descriptions`: manual pages (``/usr/share/man/man{1,8,5,7,3}``): the NAME line's
  summary (``ls \\- list directory contents``) against the first paragraphs of DESCRIPTION
  (thousands on a machine with its manual pages);
- :func:`write_description_pairs`: both, de-duplicated, as a ``.jsonl`` of ``{"short",
  "long"}`` rows (``data.files.columns: {a: short, b: long}``).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from crl.errors import CrlValueError

DPKG_STATUS = Path("/var/lib/dpkg/status")
MAN_ROOT = Path("/usr/share/man")
#: Characters of a long description kept (a transformer reads its first tokens only).
LONG_CHARS = 1200
#: Words a manual page's description needs (shorter ones mostly restate the summary).
MIN_WORDS = 20
#: Manual pages kept per family of names (``git-*``: one tool's sub-commands).
PER_FAMILY = 40
#: Manual sections read, in order: commands, administration, file formats, overviews, library
#: calls.
SECTIONS = ("1", "8", "5", "7", "3")
_ESCAPES: list[tuple[re.Pattern[str], str]] = [
            (re.compile(r"\\f(\(..|\[[^]]*]|.)"), ""), (re.compile(r"\\\((aq|cq)"), "'"),
            (re.compile(r"\\\((lq|rq|dq)"), '"'), (re.compile(r"\\\(em|\\\(en"), "-"),
            (re.compile(r"\\\(..|\\\*(\(..|\[[^]]*]|.)|\\[&|^%]|\\s[-+]?\d"), ""),
            (re.compile(r"\\-"), "-"), (re.compile(r"\\e"), r"\\")]
_TEXT_MACROS = re.compile(r"^\.(B|I|BR|RB|IR|RI|BI|IB|SM|SB)\s+(.*)$")


def _words(text: str) -> str:
    return " ".join(text.split())


def debian_descriptions(status: Path = DPKG_STATUS) -> list[tuple[str, str]]:
    """``(synopsis, extended description)`` of every package in a dpkg ``status`` (or
    ``Packages``) file that has both, in file order; the extended description's paragraphs
    (`` .`` lines) joined by blank-free spaces.

    Raises:
        CrlValueError: when ``status`` cannot be read.
    """
    try:
        text = status.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CrlValueError(f"debian_descriptions: cannot read `status` {status} "
                            f"({exc.strerror})") from None
    pairs = []
    for stanza in text.split("\n\n"):
        short, body, inside = "", [], False
        for line in stanza.splitlines():
            if line.startswith("Description:"):
                short, inside = line[len("Description:"):].strip(), True
            elif inside and line.startswith(" "):
                body.append("" if line.strip() == "." else line.strip())
            else:
                inside = False
        long = _words(" ".join(body))
        if short and long:
            pairs.append((short, long[:LONG_CHARS]))
    return pairs


def _roff_text(lines: Iterable[str]) -> str:
    """The running text of roff ``lines``: font and character escapes removed, the text of
    font macros (``.B word``) kept, other requests dropped."""
    out = []
    for line in lines:
        found = _TEXT_MACROS.match(line)
        if found:
            line = found.group(2).replace('"', "")
        elif line.startswith((".", "'")):
            continue
        for pattern, repl in _ESCAPES:
            line = pattern.sub(repl, line)
        out.append(line)
    return _words(" ".join(out))


def _sections(lines: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith(".SH"):
            name = line[3:].strip().strip('"').upper()
            current = found.setdefault(name, [])
        elif current is not None:
            current.append(line)
    return found


def man_page_pair(path: Path) -> tuple[str, str] | None:
    """``(summary, description)`` of one (gzipped) manual page: the NAME line after its
    ``\\-``, and DESCRIPTION's first :data:`LONG_CHARS` characters; None for a page that is
    an alias (``.so``), unreadable, or lacks either."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    lines = raw.decode("utf-8", errors="replace").splitlines()
    if not lines or lines[0].startswith(".so"):
        return None
    sections = _sections(lines)
    name, body = _roff_text(sections.get("NAME", [])), _roff_text(
        sections.get("DESCRIPTION", []))
    if " - " not in name or len(body.split()) < MIN_WORDS:
        return None
    return name.split(" - ", 1)[1].strip(), body[:LONG_CHARS]


def man_descriptions(root: Path = MAN_ROOT, sections: tuple[str, ...] = SECTIONS, *,
                     per_family: int = PER_FAMILY) -> Iterator[tuple[str, str]]:
    """:func:`man_page_pair` of the pages of ``root/man<section>``, in name order, at most
    ``per_family`` of one family (the name up to its first ``-``, ``_`` or ``.``: ``git-*``,
    ``gcloud_*``), so that one tool's hundreds of sub-commands do not make the file."""
    families: dict[str, int] = {}
    for section in sections:
        folder = root / f"man{section}"
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            family = re.split(r"[-_.]", path.name, maxsplit=1)[0]
            if families.get(family, 0) >= per_family or not path.is_file() \
                    or path.is_symlink():
                continue
            pair = man_page_pair(path)
            if pair is not None:
                families[family] = families.get(family, 0) + 1
                yield pair


def write_description_pairs(out: Path, *, limit: int | None = None,
                            status: Path = DPKG_STATUS, man_root: Path = MAN_ROOT,
                            per_family: int = PER_FAMILY) -> int:
    """Write the machine's short/long description pairs to ``out`` (``.jsonl``, rows
    ``{"short": ..., "long": ...}``): the dpkg packages first, then the manual pages, each
    summary and each description once, at most ``limit`` rows (``per_family``: pages of one
    family of names, :func:`man_descriptions`); returns the number written.

    Raises:
        CrlValueError: for a ``limit`` below 2, or when fewer than 2 pairs are found.
    """
    if limit is not None and limit < 2:
        raise CrlValueError(f"write_description_pairs: `limit` must be >= 2; got {limit}")
    seen: set[str] = set()
    rows = []
    sources = [debian_descriptions(status) if status.is_file() else [],
               man_descriptions(man_root, per_family=per_family)]
    for source in sources:
        for short, long in source:
            if short.lower() in seen or long.lower() in seen:
                continue
            seen.update((short.lower(), long.lower()))
            rows.append({"short": short, "long": long})
            if limit is not None and len(rows) >= limit:
                break
        if limit is not None and len(rows) >= limit:
            break
    if len(rows) < 2:
        raise CrlValueError(f"write_description_pairs: found {len(rows)} description pairs in "
                            f"{status} and {man_root}; expected at least 2")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                   encoding="utf-8")
    return len(rows)


__all__ = ["debian_descriptions", "man_descriptions", "man_page_pair",
           "write_description_pairs"]

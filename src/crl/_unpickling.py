"""What torch's weights-only unpickler refused, in crl's words.

``torch.load(weights_only=True)`` builds tensors and plain values only; a file that asks for a
function or a class (pickled code) fails with an ``UnpicklingError`` whose text advises loading it
with ``weights_only=False``. crl never gives that advice: these helpers pull out what the file
asked for, or the unpickler's own reason when the bytes are merely damaged.
"""

from __future__ import annotations

import pickletools
import re
import zipfile
from pathlib import Path

from crl._validation import clip_text


def unpickler_reason(exc: BaseException) -> str:
    """The line of an error that says what went wrong: for torch's weights-only unpickler, its
    own reason (``Unsupported operand 7``, ``Unsupported global: GLOBAL io.open ...``), without
    torch's advice around it (which suggests ``weights_only=False``: never crl's advice)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    own = [line.split("WeightsUnpickler error:", 1)[1].strip() for line in lines
           if "WeightsUnpickler error:" in line]
    own += [line for line in lines if "weights_only" not in line
            and not line.startswith(("Weights only load failed", "Check the documentation"))]
    own = [line for line in own if line]
    return clip_text(own[0] if own else "", 200)


def refused_request(exc: BaseException) -> str | None:
    """What a refused pickle asked for (``Unsupported global: GLOBAL posix.system``), or None
    when the unpickler failed on damaged bytes instead."""
    reason = unpickler_reason(exc)
    name = re.search(r"GLOBAL (\S+)", reason)
    if name is not None:
        return f"Unsupported global: GLOBAL {name.group(1)}"
    if reason.startswith(("Can only build", "Can only create", "Only persistent_load",
                          "persistent_load id")):
        return reason.split(" via `add_safe_globals`")[0]
    return None


#: What a pickle written by ``torch.save`` names: torch's rebuild functions and storages.
_TORCH_GLOBALS = ("torch.", "collections.OrderedDict")


def pickled_globals(path: Path, limit: int = 1 << 24) -> str | None:
    """The functions or classes a pickle the weights-only unpickler cannot read asks for (a
    bare ``pickle.dump`` of protocol 4 or 5, which that unpickler does not parse), found by
    reading its opcodes with :mod:`pickletools`, which runs nothing; None if it names none
    but torch's own (a damaged file) or cannot be read."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
                data = archive.read(name)[:limit]
        else:
            with path.open("rb") as f:
                data = f.read(limit)
        strings: list[str] = []
        found: list[str] = []
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name == "GLOBAL":
                found.append(str(arg).replace(" ", "."))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(".".join(strings[-2:]))
            elif isinstance(arg, str):
                strings.append(arg)
    except (StopIteration, ValueError, OSError, zipfile.BadZipFile, EOFError):
        return None
    foreign = [g for g in dict.fromkeys(found) if not g.startswith(_TORCH_GLOBALS)]
    return f"Unsupported global: GLOBAL {', '.join(foreign[:3])}" if foreign else None


__all__ = ["pickled_globals", "refused_request", "unpickler_reason"]

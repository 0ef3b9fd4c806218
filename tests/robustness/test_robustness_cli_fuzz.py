"""Bad command lines, generated from the CLI itself: every sub-command's numeric options given a
word, an unknown option, a missing argument. Each is exit code 2 and one line ``error: ...``
naming the command and the option (never click's boxed usage text, never a traceback); nothing
runs, since every case fails while the command line is parsed."""

from __future__ import annotations

import string

import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from crl.cli import app


def _commands() -> dict[tuple[str, ...], typer.core.TyperCommand]:
    found: dict[tuple[str, ...], typer.core.TyperCommand] = {}

    def walk(command: object, path: tuple[str, ...]) -> None:
        children = getattr(command, "commands", None)
        if children is None:
            found[path] = command  # type: ignore[assignment]
            return
        for name, child in children.items():
            walk(child, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


COMMANDS = _commands()


def _required(command: typer.core.TyperCommand) -> list[str]:
    """Placeholder values for the command's required arguments and options."""
    args: list[str] = []
    for param in command.params:
        if not param.required:
            continue
        if isinstance(param, typer.core.TyperArgument):
            args.append("placeholder")
        else:
            args += [param.opts[0], "placeholder"]
    return args


def _numeric_options() -> list[tuple[tuple[str, ...], str]]:
    out = []
    for path, command in COMMANDS.items():
        for param in command.params:
            runtime = param.get_runtime_param()  # type: ignore[attr-defined]
            if isinstance(param, typer.core.TyperOption) and not param.is_flag \
                    and getattr(runtime, "annotation", None) in (int, float):
                out.append((path, param.opts[0]))
    return out


NUMERIC = _numeric_options()


def _not_a_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return True
    return False


WORDS = st.text(string.ascii_letters, min_size=1, max_size=8).filter(_not_a_number)


def _one_line(args: list[str], *needles: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (args, result.output)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.output)
    for needle in needles:
        assert needle in lines[0], (args, lines[0])


def test_the_cli_is_walked() -> None:
    assert ("train",) in COMMANDS and ("bench", "loss") in COMMANDS
    assert (("train",), "--nproc") in NUMERIC and len(NUMERIC) > 10


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(NUMERIC), WORDS)
def test_a_word_for_a_number_is_one_line(option: tuple[tuple[str, ...], str], word: str) -> None:
    path, name = option
    args = [*path, *_required(COMMANDS[path]), name, word]
    _one_line(args, f"crl {' '.join(path)}:", f"'{name}'")


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(COMMANDS)), WORDS)
def test_an_unknown_option_is_one_line(path: tuple[str, ...], word: str) -> None:
    option = f"--zz-{word.lower()}"
    _one_line([*path, *_required(COMMANDS[path]), option], "No such option", option)


def test_a_missing_argument_is_one_line() -> None:
    for path, command in COMMANDS.items():
        if any(p.required for p in command.params):
            _one_line(list(path), f"crl {' '.join(path)}:", "Missing")


def test_an_unknown_command_is_one_line() -> None:
    _one_line(["trian"], "No such command 'trian'")
    _one_line(["bench", "losss"], "No such command 'losss'")

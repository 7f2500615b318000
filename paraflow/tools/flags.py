"""Renamed command-line flags: an old spelling still runs, for one release, with a note naming the new one.

The command line uses one word per idea across subcommands (``--backend``, ``--launcher``,
``-n/--nprocs`` for total processes, timeouts named for what they bound, ``--nodes`` for a count of
hosts). A flag renamed to fit keeps its old spelling as an alias of the new one::

    renamed(parser, "--timeout", use="--job-timeout")
    renamed(check, "--backend", use="paraflow check comm --backend")    # moved into a subcommand
    renamed(bench, "--project-only", use="paraflow bench project RUN")  # became a mode

``paraflow run --timeout 5`` then runs as ``paraflow run --job-timeout 5`` and prints
``paraflow run: note: --timeout was renamed: use --job-timeout (the old spelling goes in the next
release)`` on stderr. The new spelling is read when the old one is met: an option of the same
parser, or of a subcommand (the words after the parser's own name; taking it selects that
subcommand, with its defaults), or a subcommand's positional arguments (the upper-case words),
which then take the old flag's values. Its values are converted as the new spelling converts them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

__all__ = ["renamed", "RenamedFlag"]


class RenamedFlag(argparse.Action):
    """Apply the new spelling `use` to this flag's values, after a one-line note on stderr."""

    def __init__(self, option_strings: list, dest: str, use: str, convert: bool = False, **kwargs: Any) -> None:
        self.use = use
        self.convert = convert  # values come raw: the option `use` names, in a subcommand, converts them
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: Optional[str] = None,
    ) -> None:
        print(
            f"{parser.prog}: note: {option_string} was renamed: use {self.use} (the old spelling goes in the "
            "next release)",
            file=sys.stderr,
        )
        target, words = _resolve(parser, self.use, namespace)
        if words and words[0].startswith("-"):
            action = target._option_string_actions[words[0]]
            if self.convert:
                values = _converted(target, action, values, option_string)
            action(target, namespace, values, words[0])
            return
        positionals = [a for a in target._actions if not a.option_strings and a.dest != argparse.SUPPRESS]
        values = values if isinstance(values, list) else [values]
        for action in positionals:
            count = action.nargs if isinstance(action.nargs, int) else (len(values) if action.nargs else 1)
            taken, values = values[:count], values[count:]
            setattr(namespace, action.dest, taken if isinstance(action.nargs, int) or action.nargs else taken[0])


def _resolve(parser: argparse.ArgumentParser, use: str, namespace: argparse.Namespace) -> tuple:
    """The parser the new spelling `use` belongs to, and its words after the subcommands; each
    subcommand on the way is selected in `namespace`, with its defaults."""
    words = use.split()
    own = parser.prog.split()
    if words[: len(own)] == own:
        words = words[len(own) :]
    target = parser
    while words and not words[0].startswith("-"):
        chosen = _subcommand(target, words[0])
        if chosen is None:
            break
        subcommands, target = chosen
        setattr(namespace, subcommands.dest, words.pop(0))
        for action in target._actions:  # what parsing the subcommand with none of its arguments gives
            if action.dest != argparse.SUPPRESS and action.default != argparse.SUPPRESS:
                if not hasattr(namespace, action.dest):
                    setattr(namespace, action.dest, action.default)
        for key, value in target._defaults.items():
            setattr(namespace, key, value)
    return target, words


def _converted(parser: argparse.ArgumentParser, action: argparse.Action, raw: list, option_string: str) -> Any:
    """`raw` as `action` would have taken it: its count of values, each through its type and choices."""
    if action.nargs == 0:
        if raw:
            parser.error(f"{option_string} takes no value, as {action.option_strings[0]} takes none")
        return []
    if action.nargs in (None, "?") and len(raw) != 1:
        parser.error(f"{option_string} takes one value, as {action.option_strings[0]} does")
    values = [parser._get_value(action, text) for text in raw]
    for value in values:
        parser._check_value(action, value)
    return values[0] if action.nargs in (None, "?") else values


def _subcommand(parser: argparse.ArgumentParser, name: str) -> Optional[tuple]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action, action.choices[name]
    return None


def renamed(parser: argparse.ArgumentParser, *old: str, use: str) -> argparse.Action:
    """Keep the option strings `old` as the spelling `use` (see the module docstring). An option of
    `parser` itself must exist before this call: the old spelling then takes values as it does."""
    words = use.split()
    own = parser.prog.split()
    words = words[len(own) :] if words[: len(own)] == own else words
    how: dict
    if len(words) == 1 and words[0] in parser._option_string_actions:
        target = parser._option_string_actions[words[0]]
        how = (
            {"nargs": 0}
            if target.nargs == 0
            else {"nargs": target.nargs, "type": target.type, "choices": target.choices}
        )
    elif words and words[-1].startswith("-"):  # an option of a subcommand, defined later: convert when met
        how = {"nargs": "*", "convert": True}
    else:  # a subcommand, with as many values as its upper-case placeholders
        how = {"nargs": sum(w.isupper() for w in words)}
    return parser.add_argument(*old, action=RenamedFlag, use=use, dest=f"renamed_{old[-1].lstrip('-')}", **how)

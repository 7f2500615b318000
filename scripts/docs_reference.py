"""Generate the docs' reference pages: the Python API from ``paraflow.__all__``, the CLI from its parsers.

``python scripts/docs_reference.py docs`` writes ``docs/reference/api.md`` and
``docs/reference/cli.md``. The pages are committed, so their links work where the docs are read
as files, and ``tests/docs/test_docs_reference.py`` fails when they differ from what this script
generates: a name added to ``__all__`` or a flag added to a parser needs the command above.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import sys
from pathlib import Path
from typing import Iterator, Optional

API_PAGE = "reference/api.md"
CLI_PAGE = "reference/cli.md"


def api_page() -> str:
    """One section per name in ``paraflow.__all__``, its docstring rendered by mkdocstrings."""
    import paraflow

    lines = [
        "# Python API",
        "",
        "Everything `import paraflow` makes public (`paraflow.__all__`), generated from the docstrings"
        " by `scripts/docs_reference.py`; the site renders each entry in full. `paraflow.Backend` lists"
        " every method a backend offers, those it inherits included.",
        "",
    ]
    for name in paraflow.__all__:
        obj = getattr(paraflow, name)
        target = f"{obj.__module__}.{obj.__qualname__}"
        lines += [
            f"## `paraflow.{name}`",
            "",
            f"::: {target}",
            "    options:",
            "      show_root_heading: false",
            "      show_root_toc_entry: false",
        ]
        if obj is paraflow.Backend:  # what scripts call lives in its bases: TrainingFeatures, Collectives
            lines += ["      inherited_members: true", "      members_order: source"]
        lines.append("")
    return "\n".join(lines)


def _markdown_text(text: str) -> str:
    """Help text safe inside a Markdown table cell: code spans kept, everything else escaped."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: treat it as plain text
        parts = [text.replace("`", "'")]
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"`{part.replace('|', '&#124;')}`")
        else:
            escaped = html.escape(part, quote=False)
            out.append(re.sub(r"([\\*_\[\]|])", r"\\\1", escaped))
    return "".join(out).replace("\n", " ")


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple]:
    """(name, aliases, help, subparser) for each subcommand of `parser`, in the order they were added."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        seen: dict = {}
        for name, sub in action._name_parser_map.items():
            if id(sub) in seen:
                seen[id(sub)][1].append(name)
            else:
                seen[id(sub)] = (name, [], helps.get(name, ""), sub)
        yield from seen.values()


def walk(parser: argparse.ArgumentParser, path: Optional[list] = None) -> Iterator[tuple]:
    """(command words, parser) for `parser` and every subcommand below it, aliases left out."""
    path = path or [parser.prog]
    yield path, parser
    for name, _, _, sub in _subcommands(parser):
        yield from walk(sub, path + [name])


def _flag_rows(parser: argparse.ArgumentParser) -> Iterator[tuple]:
    """(group title, flag column, help) for every argument of `parser`, by argument group."""
    from paraflow.tools.flags import RenamedFlag

    formatter = parser._get_formatter()
    for group in parser._action_groups:
        for action in group._group_actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if isinstance(action, RenamedFlag):  # an old spelling: it still runs, as the new one
                yield (
                    "renamed (the old spellings still run, with a note; they go in the next release)",
                    ", ".join(action.option_strings),
                    f"`{action.use}`",
                )
                continue
            if action.help == argparse.SUPPRESS:
                continue
            if action.option_strings:
                flag = ", ".join(action.option_strings)
                if action.nargs != 0:
                    flag += " " + formatter._format_args(action, action.dest.upper())
            else:
                flag = action.metavar or action.dest
            text = "" if action.help is None else formatter._expand_help(action)
            yield group.title or "", flag, text


def _parser_section(path: list, aliases: list, summary: Optional[str], parser: argparse.ArgumentParser) -> list:
    level = "#" * min(len(path) + 1, 4)
    lines = [f"{level} `{' '.join(path)}`", ""]
    if summary:
        lines += [_markdown_text(summary), ""]
    if aliases:
        lines += ["Also spelled: " + ", ".join(f"`{' '.join(path[:-1] + [a])}`" for a in aliases), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    current = None
    for group, flag, text in sorted(_flag_rows(parser), key=lambda row: row[0].startswith("renamed")):
        if group != current:
            current = group
            lines += ["", f"**{_markdown_text(group)}**", "", "| argument | what it does |", "|---|---|"]
        lines.append(f"| `{flag}` | {_markdown_text(text)} |")
    lines.append("")
    for name, sub_aliases, sub_help, sub in _subcommands(parser):
        lines += _parser_section(path + [name], sub_aliases, sub_help, sub)
    return lines


def cli_page(parser: Optional[argparse.ArgumentParser] = None) -> str:
    """Every subcommand of `paraflow` and every flag with its help, read from the parsers."""
    if parser is None:
        from paraflow.cli import build_parser

        parser = build_parser()
    lines = [
        "# Command line",
        "",
        "Every subcommand of `paraflow` and every flag, generated from the argparse parsers"
        " (`paraflow SUBCOMMAND --help` prints the same).",
        "",
    ]
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal: the page must not depend on it
    try:
        lines += _parser_section([parser.prog], [], None, parser)
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python scripts/docs_reference.py OUTPUT_DIR (docs: the committed pages)", file=sys.stderr)
        return 2
    out = Path(argv[0])
    for page, text in ((API_PAGE, api_page()), (CLI_PAGE, cli_page())):
        (out / page).parent.mkdir(parents=True, exist_ok=True)
        (out / page).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

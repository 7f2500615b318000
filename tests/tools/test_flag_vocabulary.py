"""One word per idea across the command line: every `paraflow` subcommand and train.py.

The vocabulary: ``--backend`` and ``--launcher`` (repeatable or a comma list where several are
allowed), ``-n/--nprocs`` for the total number of processes, ``--hosts`` for a host list
(``h1:4,h2:4``) and ``--nodes`` for a count of hosts, timeouts named for what they bound
(``--job-timeout``, ``--wait-timeout``; never a bare ``--timeout``), ``--max-steps`` for
"stop after", and help on every flag. Renamed old spellings are errors naming the new one;
they are left out here.
"""

import argparse
import importlib.util
from pathlib import Path

import pytest

from paraflow.cli import build_parser
from paraflow.tools.flags import RenamedFlag, renamed

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docs_reference = _load("docs_reference", ROOT / "scripts" / "docs_reference.py")

#: Spellings of an idea that has another name elsewhere, and that name.
OTHER_SPELLINGS = {
    "--backends": "--backend (repeatable, or a comma list)",
    "--launchers": "--launcher (repeatable, or a comma list)",
    "--timeout": "a timeout named for what it bounds (--job-timeout, --wait-timeout, ...)",
    "--steps": "--max-steps for 'stop after'; a timed window needs a name of its own",
    "--cluster": "--nodes N for a count of hosts",
    "--np": "-n/--nprocs",
    "--num-processes": "-n/--nprocs",
}


def all_parsers() -> dict:
    """Every command line: 'paraflow SUB ...' for each subcommand, and 'train.py'."""
    parsers = {" ".join(path): parser for path, parser in docs_reference.walk(build_parser())}
    parsers["train.py"] = _load("train_script", ROOT / "train.py").build_parser()
    return parsers


PARSERS = all_parsers()


def is_renamed(action: argparse.Action) -> bool:
    """An old spelling that now only names the new one."""
    return isinstance(action, RenamedFlag)


def live_options(parser: argparse.ArgumentParser) -> list:
    """The parser's options, renamed spellings and help left out."""
    return [
        action
        for action in parser._actions
        if action.option_strings
        and not is_renamed(action)
        and not isinstance(action, (argparse._HelpAction, argparse._VersionAction))
    ]


def vocabulary_problems(parser: argparse.ArgumentParser) -> list:
    problems = []
    for action in live_options(parser):
        for flag in action.option_strings:
            if flag in OTHER_SPELLINGS:
                problems.append(f"{flag}: use {OTHER_SPELLINGS[flag]}")
            if "timeout" in flag and not flag.endswith("-timeout"):
                problems.append(f"{flag}: name the timeout for what it bounds (--job-timeout, --wait-timeout)")
        flags = set(action.option_strings)
        if "-n" in flags and flags != {"-n", "--nprocs"}:
            problems.append(f"{'/'.join(action.option_strings)}: -n is -n/--nprocs, total processes")
        if "--nprocs" in flags and "-n" not in flags:
            problems.append("--nprocs: spell it -n/--nprocs")
        if "--hosts" in flags and action.type is int:
            problems.append("--hosts: a host list (h1:4,h2:4); a count of hosts is --nodes")
        if "--nodes" in flags and action.type is not int:
            problems.append("--nodes: a count of hosts")
        if not action.help or action.help == argparse.SUPPRESS:
            problems.append(f"{'/'.join(action.option_strings)}: no help")
    return problems


@pytest.mark.parametrize("name", list(PARSERS))
def test_each_command_line_speaks_the_shared_vocabulary(name):
    assert vocabulary_problems(PARSERS[name]) == []


def test_the_commands_that_take_a_backend_all_call_it_backend():
    takers = {name for name, parser in PARSERS.items() if "--backend" in parser._option_string_actions}
    assert {"paraflow run", "paraflow check comm", "train.py"} <= takers


def test_the_vocabulary_check_can_fail():
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--backends", help="b")
    parser.add_argument("--timeout", type=float, help="t")
    parser.add_argument("-n", type=int, help="n")  # without --nprocs
    parser.add_argument("--hosts", type=int, help="h")
    parser.add_argument("--seed", type=int)
    assert len(vocabulary_problems(parser)) == 5


def test_a_renamed_flag_is_left_out_of_the_vocabulary_and_runs_as_the_new_spelling_with_a_note(capsys):
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--job-timeout", type=float, help="t")
    parser.add_argument("--fast", action="store_true", help="f")
    parser.add_argument("--tags", action="extend", type=lambda s: s.split(","), default=None, help="g")
    renamed(parser, "--timeout", use="--job-timeout")
    renamed(parser, "--quick", use="--fast")
    renamed(parser, "--tag", use="--tags")
    assert vocabulary_problems(parser) == []
    for old, new in (
        (["--timeout", "3"], ["--job-timeout", "3"]),
        (["--timeout=3"], ["--job-timeout", "3"]),
        (["--quick"], ["--fast"]),
        (["--tag", "a,b", "--tags", "c"], ["--tags", "a,b,c"]),
    ):
        assert vars(parser.parse_args(old)) == vars(parser.parse_args(new))
        assert f"x: note: {old[0].split('=')[0]} was renamed: use {new[0]}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ended:
        parser.parse_args(["--timeout", "soon"])
    assert ended.value.code == 2 and "invalid float value: 'soon'" in capsys.readouterr().err


def test_paraflow_version(capsys):
    from paraflow import __version__
    from paraflow.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"paraflow {__version__}"

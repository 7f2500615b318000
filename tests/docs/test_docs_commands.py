"""Every command of README.md and docs/*.md that starts a job runs as printed, and runs the backend its
page claims (the convention is in docs/contributing.md, "Commands in the docs").

A page's shell blocks (```bash) are read line by line; a line whose command is python, torchrun,
mpirun, horovodrun, srun or `paraflow run` starts a job. Each block runs in a scratch directory
that shows the repository's files, its commands in order (one may read what the one before wrote),
with only what this machine needs added through the environment (Open MPI as root, more ranks than
cores). Identical commands that write nothing run once for the whole module.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
from conftest import _HOROVOD_MISSING, RANK_ENV, ROOT

import paraflow
from paraflow.tools.launch import run_launch

pytestmark = [pytest.mark.xdist_group("docs-commands"), pytest.mark.timeout(1800)]

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```$", flags=re.M | re.S)
#: The output of a shell block's commands: the next fenced block, when it is ```text starting with `$ `.
OUTPUT_BLOCK = re.compile(r"```text\n(\$ .*?)^```$", flags=re.M | re.S)
LAUNCHERS = ("python", "python3", "torchrun", "mpirun", "mpiexec", "horovodrun", "srun")
#: `paraflow: NAME over ..., N processes, ...`, rank 0's start-up line, after the prefix some launchers
#: put on each line (`[rank0] ` of paraflow.launch, `[0]<stderr>:` of horovodrun).
BANNER = re.compile(r"^(?:\[[\d,]+\]<\w+>:|\[rank\d+\] )?paraflow: ([\w.-]+)(?: over |, )", flags=re.M)
#: Flags that make a command write files: a command with one is never shared between blocks.
WRITES = ("--checkpoint", "--export", "--json-out", "--json-dir", "--out")
#: What this machine needs that a page does not print: root and more ranks than cores for Open MPI.
MACHINE_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}
COMMAND_TIMEOUT_S = 300


@dataclass(frozen=True)
class PageCommand:
    """One job-starting line of a page: the command as printed, its trailing comment, where it runs."""

    page: str
    command: str
    comment: str
    cwd: str  # relative to the repository: a `cd DIR` earlier in the block moves it

    @property
    def words(self) -> list:
        return shlex.split(self.command)

    def settings(self) -> dict:
        """The VAR=value words before the program."""
        out = {}
        for word in self.words:
            if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", word):
                break
            key, _, value = word.partition("=")
            out[key] = value
        return out

    @property
    def program(self) -> list:
        return self.words[len(self.settings()) :]

    def claims(self) -> set:
        """The backends the line names: `--backend NAME`, `PARAFLOW_BACKEND=NAME`, a comment `# NAME ...`."""
        words = self.words
        named = {words[i + 1] for i, w in enumerate(words[:-1]) if w == "--backend"}
        named |= {w.split("=", 1)[1] for w in words if w.startswith("--backend=")}
        if "PARAFLOW_BACKEND" in self.settings():
            named.add(self.settings()["PARAFLOW_BACKEND"])
        first = re.match(r"[\w-]+", self.comment)
        if first and first.group(0) in paraflow.registered_names():
            named.add(first.group(0))
        return named

    def script(self) -> Optional[Path]:
        """The Python file the job runs, if the page names one."""
        for word in self.program:
            if word.endswith(".py"):
                return ROOT / self.cwd / word
        return None

    def processes(self) -> int:
        """How many processes the command starts (what paraflow.init's default depends on)."""
        words = self.program
        for flag in ("-n", "-np", "--nproc_per_node", "--nprocs", "--spawn"):
            if flag in words:
                return int(words[words.index(flag) + 1])
        return 1

    def expected_backend(self) -> Optional[str]:
        """The backend the banner must name; None for a script that does not use paraflow."""
        script = self.script()
        if script is None:
            return None
        horovod_api = "--horovod-api" in self.program or "import paraflow.compat.horovod" in script.read_text()
        if not horovod_api and not re.search(r"paraflow\.(init|launch)\(", script.read_text()):
            return None
        if "--dry-run" in self.program:  # paraflow run prints the command and starts nothing
            return None
        claims = self.claims()
        assert len(claims) <= 1, f"{self.page}: `{self.command}` names several backends: {sorted(claims)}"
        if claims:
            return claims.pop()
        return "ddp" if self.processes() > 1 and os.path.basename(self.program[0]) != "python" else "single"

    def cluster_only(self) -> Optional[str]:
        """Why this command cannot run on one machine, or None."""
        words = self.program
        if os.path.basename(words[0]) == "srun":
            return "needs a Slurm allocation (the emulated cluster runs srun: make test-cluster)"
        if words[:2] == ["paraflow", "cluster"]:
            return "needs the emulated cluster (root, ip netns: make test-cluster)"
        for flag in ("--hosts", "-H"):
            if flag in words:
                hosts = [h.split(":")[0] for h in words[words.index(flag) + 1].split(",")]
                if any(h not in ("localhost", "127.0.0.1") for h in hosts):
                    return f"runs on the hosts {', '.join(hosts)}"
        return None

    def missing_program(self) -> Optional[str]:
        """A program the page names by a path that does not exist in this checkout (`.venv/bin/mpiexec`)."""
        program = self.program[0]
        if "/" in program and not (ROOT / self.cwd / program).exists():
            return f"{program} is not in this checkout (it comes with make install's choices)"
        return None

    def needs_horovod(self) -> bool:
        script = self.script()
        uses = script is not None and "import horovod" in script.read_text() and "--horovod-api" not in self.program
        return uses or self.program[0] == "horovodrun" or self.expected_backend() == "horovod"


def _logical_lines(block: str) -> list:
    lines, pending = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].rstrip() + " "
            continue
        lines.append(pending + line.strip())
        pending = ""
    return lines


def _split_comment(line: str) -> tuple:
    match = re.search(r"(?:^|\s)#\s?(.*)$", line)
    return (line[: match.start()].strip(), match.group(1).strip()) if match else (line.strip(), "")


def starts_a_job(command: str) -> bool:
    words = PageCommand("", command, "", ".").program
    if words[1:2] == ["-m"] and words[2:3] in (["pytest"], ["venv"], ["pip"]):  # the tests, or setting up: no job
        return False
    return bool(words) and (
        os.path.basename(words[0]) in LAUNCHERS
        or words[:2] == ["paraflow", "run"]
        or words[:3] == ["paraflow", "cluster", "exec"]
    )


def page_blocks(path: Path) -> list:
    """(block number, [PageCommand], the ```text block right after it or None) for each shell block
    of `path` that starts a job."""
    text = path.read_text()
    page = path.relative_to(ROOT).as_posix()
    blocks = []
    for number, match in enumerate(SHELL_BLOCK.finditer(text)):
        cwd, commands = ".", []
        for line in _logical_lines(match.group(1)):
            command, comment = _split_comment(line)
            if command.startswith("cd "):
                cwd = os.path.normpath(os.path.join(cwd, command[3:].strip()))
            elif command and starts_a_job(command):
                commands.append(PageCommand(page, command, comment, cwd))
        output = OUTPUT_BLOCK.match(text, text.find("```", match.end()))
        if commands:
            blocks.append((number, commands, output.group(1) if output else None))
    return blocks


def _is_quick(commands: list) -> bool:
    """Getting started's quick start (one process, then two under ddp-gloo, with their output): the
    first commands a newcomer runs, part of `make test`; every other block is `long`."""
    return all(
        c.page == "docs/getting-started.md" and c.script() is not None and c.script().name == "quickstart.py"
        for c in commands
    )


def _cases() -> list:
    cases = []
    for path in PAGES:
        for number, commands, output in page_blocks(path):
            marks = [] if _is_quick(commands) else [pytest.mark.long]
            case_id = f"{path.name}-block{number}"
            cases.append(pytest.param(commands, output, id=case_id, marks=marks))
    return cases


_SHARED: dict = {}  # (cwd, command) -> result, for commands that write nothing


@pytest.fixture(scope="module")
def machine_env() -> dict:
    bin_dir = os.path.dirname(sys.executable)  # python, paraflow, torchrun, horovodrun of this environment
    return {**RANK_ENV, **MACHINE_ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _scratch_view(directory: Path) -> Path:
    """`directory` with a link to every top-level entry of the repository: files the commands write land here."""
    for entry in ROOT.iterdir():
        if entry.name not in (".git",) and not (directory / entry.name).exists():
            (directory / entry.name).symlink_to(entry)
    return directory


def _run(command: PageCommand, scratch: Path, env: dict):
    key = (command.cwd, command.command)
    shared = not any(flag in command.words for flag in WRITES)
    if shared and key in _SHARED:
        return _SHARED[key]
    cwd = scratch / command.cwd
    result = run_launch(["bash", "-c", command.command], timeout=COMMAND_TIMEOUT_S, env=env, cwd=str(cwd))
    if shared:
        _SHARED[key] = result
    return result


def check_command(command: PageCommand, result) -> list:
    """What is wrong with one run of `command`: its exit, its banner against the page's claim."""
    where = f"{command.page}: `{command.command}`"
    if result.timed_out:
        return [f"{where} ran past {COMMAND_TIMEOUT_S} s\n{result.stderr[-2000:]}"]
    if result.returncode != 0:
        return [f"{where} exited {result.returncode}\n{result.stdout[-1500:]}\n{result.stderr[-3000:]}"]
    banners = set(BANNER.findall(result.stdout + result.stderr))
    expected = command.expected_backend()
    if expected is None and banners:
        return [f"{where} runs no paraflow script, but printed banners for {sorted(banners)}"]
    if expected is not None and banners != {expected}:
        return [f"{where}: the page says {expected}, the banner says {sorted(banners) or 'nothing'}"]
    return []


def _output_pattern(line: str) -> str:
    """A line of an output block as a pattern: `...` stands for any text, the rest must match."""
    return ".*".join(re.escape(part) for part in line.strip().split("..."))


def check_output(commands: list, results: list, output: str) -> list:
    """An output block after a shell block: each `$ COMMAND` line is followed by lines its run prints
    (each printed whole, in any order among the rest of its output)."""
    problems, current = [], None
    by_command = {c.command: r for c, r in zip(commands, results)}
    for line in output.splitlines():
        if line.startswith("$ "):
            current = line[2:].strip()
            assert current in by_command, f"the output block names `{current}`, which its shell block does not run"
        elif line.strip() and current:
            printed = by_command[current].stdout + by_command[current].stderr
            if not re.search(r"^" + _output_pattern(line) + r"$", printed, flags=re.M):
                problems.append(f"`{current}` did not print a line like {line!r}:\n{printed[-2000:]}")
    return problems


@pytest.mark.parametrize("commands, output", _cases())
def test_every_command_runs_as_printed_and_runs_the_backend_its_page_claims(
    commands, output, machine_env, tmp_path, no_leftovers
):
    scratch = _scratch_view(tmp_path)
    problems, results, skipped = [], [], []
    for command in commands:
        reason = command.cluster_only() or command.missing_program()
        if reason is None and command.needs_horovod() and _HOROVOD_MISSING:
            reason = f"needs horovod: {_HOROVOD_MISSING}"
        if reason:
            skipped.append(f"`{command.command}`: {reason}")
            results.append(None)
            continue
        results.append(_run(command, scratch, machine_env))
        problems += check_command(command, results[-1])
    if output is not None and not problems and None not in results:
        problems += check_output(commands, results, output)
    assert problems == [], "\n\n".join(problems)
    if skipped:  # the others passed
        pytest.skip(f"{len(commands) - len(skipped)} of {len(commands)} ran; not run here: " + "; ".join(skipped))


# ---------------------------------------------------------------- the convention itself
def test_the_pages_start_jobs_and_every_command_has_one_backend_to_check():
    commands = [c for path in PAGES for _, block, _ in page_blocks(path) for c in block]
    assert len(commands) > 30
    for command in commands:
        command.expected_backend()  # raises on a line that names two backends


@pytest.mark.parametrize(
    "line, expected",
    [
        ("python train.py --backend horovod", "horovod"),
        ("mpirun -np 2 python docs/examples/porting_ddp_after.py", "ddp"),
        ("python docs/examples/quickstart.py", "single"),
        ("PARAFLOW_BACKEND=horovod mpirun -np 2 -x PARAFLOW_BACKEND python docs/examples/quickstart.py", "horovod"),
        ("python docs/examples/porting_ddp_before.py", None),
    ],
)
def test_the_claim_is_the_backend_flag_the_variable_or_paraflows_default(line, expected):
    assert PageCommand("x.md", line, "", ".").expected_backend() == expected


def test_a_comment_naming_another_backend_than_the_command_is_caught():
    wrong = PageCommand("x.md", "mpirun -np 2 python docs/examples/porting_ddp_after.py", "horovod", ".")
    with pytest.raises(AssertionError, match="several backends"):
        PageCommand("x.md", wrong.command + " --backend ddp-gloo", "horovod", ".").expected_backend()
    assert wrong.expected_backend() == "horovod"  # the comment is the claim; the banner (ddp) then fails the run


def test_a_banner_for_another_backend_fails_the_command():
    command = PageCommand("x.md", "mpirun -np 2 python docs/examples/quickstart.py", "horovod", ".")

    class Result:
        timed_out, returncode, stdout = False, 0, ""
        stderr = "paraflow: ddp over gloo, 2 processes, launcher mpirun (Open MPI), cpu, 1 thread each\n"

    (problem,) = check_command(command, Result())
    assert "the page says horovod, the banner says ['ddp']" in problem


def test_commands_for_a_cluster_are_told_apart_from_those_that_run_here():
    assert PageCommand("x.md", "srun -N2 python train.py", "", ".").cluster_only()
    assert PageCommand("x.md", "paraflow run --hosts node1:4,node2:4 train.py", "", ".").cluster_only()
    assert PageCommand("x.md", "horovodrun -np 4 -H localhost:4 python train.py", "", ".").cluster_only() is None


def test_an_output_block_line_the_command_did_not_print_fails_and_dots_match_anything():
    command = PageCommand("x.md", "python docs/examples/quickstart.py", "", ".")

    class Result:
        stdout, stderr = "epoch 0: loss 0.524 on 1 process(es)\n", "paraflow: single, 1 process, cpu, 2 threads each\n"

    lines = ["$ python docs/examples/quickstart.py", "paraflow: single, 1 process, ..."]
    shown = "\n".join([*lines, "epoch 0: loss 0.524 on 1 process(es)"])
    assert check_output([command], [Result()], shown) == []
    (problem,) = check_output([command], [Result()], shown.replace("0.524", "0.525"))
    assert "did not print a line like 'epoch 0: loss 0.525 on 1 process(es)'" in problem

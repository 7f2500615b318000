"""The README: short, its quick start runnable as written, its diff true, no run log in it or the docs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, launch_ok

README = ROOT / "README.md"
EXAMPLES = ROOT / "docs" / "examples"
RUN_LOG_PHRASES = ("slower day", "sitting", "load average", "RUN_PAIRS", "agreement_odds")


def fenced_blocks(text: str, language: str) -> list:
    """The bodies of the ```language blocks of a Markdown text, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.M | re.S)


def readme_quick_start() -> str:
    blocks = [b for b in fenced_blocks(README.read_text(), "python") if "paraflow.init()" in b]
    assert blocks, "the README has no ```python block with paraflow.init()"
    return blocks[0]


def test_the_readme_is_at_most_250_lines():
    assert len(README.read_text().splitlines()) <= 250


def test_the_quick_start_is_at_most_40_lines_and_is_the_example_file():
    code = readme_quick_start()
    assert len(code.splitlines()) <= 40
    assert code == (EXAMPLES / "quickstart.py").read_text()


@pytest.fixture(scope="module")
def quick_start_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("readme") / "quickstart.py"
    path.write_text(readme_quick_start())
    return path


def _run(cmd: list, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_the_readme_quick_start_runs_with_python(no_leftovers, quick_start_file):
    done = _run([sys.executable, quick_start_file], no_leftovers)
    assert re.findall(r"^epoch (\d): loss [\d.]+ on 1 process\(es\)$", done.stdout, flags=re.M) == ["0", "1", "2"]


def test_the_readme_quick_start_runs_under_paraflow_run_on_two_ddp_gloo_processes(no_leftovers, quick_start_file):
    cmd = [sys.executable, "-m", "paraflow.cli", "run", "-n", "2", "--backend", "ddp-gloo", quick_start_file]
    done = _run(cmd, no_leftovers)
    assert re.findall(r"^epoch (\d): loss [\d.]+ on 2 process\(es\)$", done.stdout, flags=re.M) == ["0", "1", "2"]
    assert "paraflow: ddp-gloo over gloo, 2 processes" in done.stderr  # the banner: the backend came through


def test_the_plain_pytorch_version_runs_under_torchrun(no_leftovers):
    done = launch_ok("torchrun", 2, [EXAMPLES / "plain_pytorch.py"], timeout=240)
    assert re.findall(r"^epoch (\d): loss [\d.]+ on 2 process\(es\)$", done.stdout, flags=re.M) == ["0", "1", "2"]


def test_the_readme_diff_is_the_diff_between_the_two_example_files():
    (diff,) = fenced_blocks(README.read_text(), "diff")
    plain = (EXAMPLES / "plain_pytorch.py").read_text().splitlines()
    paraflow = (EXAMPLES / "quickstart.py").read_text().splitlines()
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and line[1:].strip()]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+") and line[1:].strip()]
    assert removed and all(line in plain and line not in paraflow for line in removed)
    assert added and all(line in paraflow and line not in plain for line in added)
    # every line that differs, apart from the docstring, is in the diff
    body = slice(1, None)
    assert sorted(set(plain[body]) - set(paraflow[body])) == sorted(set(removed))
    assert sorted(set(paraflow[body]) - set(plain[body])) == sorted(set(added))


def test_the_readme_names_the_commands_ci_runs_and_links_only_to_files_that_exist():
    text = README.read_text()
    for command in re.findall(r"^make [\w-]+$", (ROOT / ".ci" / "run").read_text(), flags=re.M):
        assert f"`{command}`" in text or f"\n{command} " in text, command
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), target


@pytest.mark.parametrize("path", [README, *sorted((ROOT / "docs").rglob("*.md"))], ids=lambda p: p.name)
def test_no_run_log_in_the_readme_or_the_docs(path):
    text = path.read_text().lower()
    assert [phrase for phrase in RUN_LOG_PHRASES if phrase.lower() in text] == []


def test_the_package_metadata_names_fsdp_ships_the_license_and_a_short_description():
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    meta = config["metadata"]
    assert "FSDP" in meta["description"] and meta["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    long_description = ROOT / meta["long_description"].removeprefix("file:").strip()
    assert long_description != README and len(long_description.read_text().splitlines()) <= 40

"""The README: short, its quick start the example file, its diff true; no run log or test id in the pages.

The quick start's commands run as printed, with their output, in test_docs_commands.py."""

import inspect
import re

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


#: What only the contributors' pages may name: a test file or test id, the fault campaign's seed.
INTERNALS = re.compile(r"\btests/[\w./-]+|\btest_\w+|CAMPAIGN_SEED|campaign(?:'s)? seed")
CONTRIBUTOR_PAGES = ("architecture.md", "contributing.md")


@pytest.mark.parametrize(
    "path",
    [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in CONTRIBUTOR_PAGES)],
    ids=lambda p: p.name,
)
def test_no_user_page_names_a_test_or_the_campaign_seed(path):
    assert INTERNALS.findall(path.read_text()) == []


def test_the_internals_pattern_finds_test_ids_and_the_seed():
    text = "see `tests/docs/test_x.py::test_y`, PARAFLOW_CAMPAIGN_SEED=7, test_fault_campaign[007]"
    assert len(INTERNALS.findall(text)) == 4
    assert INTERNALS.findall("make test-long; the seed of the sampler; pytest tests") == []


def test_the_package_metadata_names_fsdp_ships_the_license_and_a_short_description():
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    meta = config["metadata"]
    assert "FSDP" in meta["description"] and meta["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    long_description = ROOT / meta["long_description"].removeprefix("file:").strip()
    assert long_description != README and len(long_description.read_text().splitlines()) <= 40


def test_the_torch_floors_agree_between_setup_cfg_the_fsdp_backend_and_the_version_table():
    import configparser

    from paraflow.backends.fsdp.backend import FSDPBackend

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    (base,) = re.findall(r"^torch\S*", config["options"]["install_requires"], flags=re.M)
    (fsdp,) = re.findall(r"^torch\S*", config["options.extras_require"]["fsdp"], flags=re.M)
    assert (base, fsdp) == ("torch>=2.1", "torch>=2.6")
    assert "pip install 'torch>=2.6'" in inspect.getsource(FSDPBackend.unavailable_reason)
    table = (ROOT / "docs" / "getting-started.md").read_text()
    assert "| torch | ≥ 2.1; `fsdp`: ≥ 2.6" in table
    assert "torch ≥ 2.6" in (ROOT / "docs" / "backends.md").read_text()

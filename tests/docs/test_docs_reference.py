"""The reference pages are generated from the code: every public name, every flag; the site builds strictly."""

import argparse
import importlib
import importlib.util
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

import paraflow
from paraflow.cli import build_parser

_SPEC = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
docs_reference = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(docs_reference)


def test_the_api_page_documents_every_name_in_paraflow_all():
    page = docs_reference.api_page()
    for name in paraflow.__all__:
        assert f"## `paraflow.{name}`" in page, name
    targets = [line[4:] for line in page.splitlines() if line.startswith("::: ")]
    assert len(targets) == len(paraflow.__all__)
    for name, target in zip(paraflow.__all__, targets):
        module, _, qualname = target.rpartition(".")
        assert getattr(importlib.import_module(module), qualname) is getattr(paraflow, name), target


def every_flag(parser: argparse.ArgumentParser) -> list:
    return [
        (" ".join(path), flag)
        for path, sub in docs_reference.walk(parser)
        for action in sub._actions
        for flag in action.option_strings
    ]


def test_the_cli_page_lists_every_subcommand_and_every_flag_with_its_help():
    parser = build_parser()
    page = docs_reference.cli_page(parser)
    flags = every_flag(parser)
    assert len(flags) > 40
    sections = page.split("\n#")
    for command, flag in flags:
        (section,) = [s for s in sections if s.lstrip("#").startswith(f" `{command}`")]
        assert f"`{flag}" in section or f", {flag}" in section, (command, flag)
    assert "| `--job-timeout SECONDS` | seconds the whole job may run" in page


def test_a_flag_added_to_a_parser_appears_on_the_cli_page():
    parser = build_parser()
    run = next(sub for path, sub in docs_reference.walk(parser) if path == ["paraflow", "run"])
    run.add_argument("--brand-new-flag", metavar="X", help="a flag no one has written docs for")
    page = docs_reference.cli_page(parser)
    assert "| `--brand-new-flag X` | a flag no one has written docs for |" in page
    assert "--brand-new-flag" not in docs_reference.cli_page()


def test_help_text_is_escaped_for_a_markdown_table():
    assert docs_reference._markdown_text("a|b <R> `x|y` *z*") == "a\\|b &lt;R&gt; `x&#124;y` \\*z\\*"


def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]' (make docs does it)")
    pytest.importorskip("mkdocs_gen_files", reason="mkdocs-gen-files is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed: pip install -e '.[docs]'")
    env = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true", "PATH": "/usr/bin:/bin"}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    done = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
    shutil.rmtree(tmp_path / "site")

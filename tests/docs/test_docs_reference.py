"""The reference pages are generated from the code: every public name and method, every option of
paraflow.init, every flag; the committed pages equal what the generator writes; the site builds strictly."""

import argparse
import html
import importlib
import importlib.util
import inspect
import re
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


#: The methods scripts call on a backend, most of them inherited from Backend's bases.
USER_METHODS = (
    "init shutdown wrap_model wrap_optimizer unwrap no_sync accumulate autocast grad_scaler clip_grad_norm_ "
    "clip_grad_value_ join distributed_sampler save load export allreduce allreduce_ broadcast broadcast_ "
    "allgather barrier"
).split()
SPHINX_ROLE = re.compile(r":(func|meth|class|mod|attr|data|exc|obj):`")


def init_options() -> set:
    """Every keyword paraflow.init passes on: Backend's own and each registered backend's OPTIONS."""
    from paraflow.core.registry import spec

    common = set(inspect.signature(paraflow.Backend.__init__).parameters) - {"self", "name", "options"}
    own = {option for name in paraflow.registered_names() for option in spec(name).load().OPTIONS}
    return common | own


def test_the_committed_reference_pages_are_what_the_generator_writes(tmp_path):
    assert docs_reference.main([str(tmp_path)]) == 0
    for page in (docs_reference.API_PAGE, docs_reference.CLI_PAGE):
        committed = (ROOT / "docs" / page).read_text()
        assert committed == (tmp_path / page).read_text(), (
            f"docs/{page} differs from the code: run python scripts/docs_reference.py docs"
        )


@pytest.mark.parametrize("page", sorted((ROOT / "docs").rglob("*.md")), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_between_pages_leads_to_a_file_so_the_docs_read_as_files(page):
    targets = re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", page.read_text())
    assert [t for t in targets if not (page.parent / t).exists()] == []


def test_paraflow_init_documents_every_option_every_backend_takes():
    doc = inspect.getdoc(paraflow.init)
    assert len(init_options()) > 20
    assert [option for option in sorted(init_options()) if f"`{option}`" not in doc] == []


def test_every_method_users_call_is_public_documented_and_rendered_with_the_inherited_ones():
    for method in USER_METHODS:
        doc = inspect.getdoc(getattr(paraflow.Backend, method))
        assert doc and len(doc) > 20, method
    page = docs_reference.api_page()
    backend_entry = page.split("## `paraflow.Backend`")[1].split("\n## ")[0]
    assert "inherited_members: true" in backend_entry


def test_no_docstring_on_the_api_page_carries_a_sphinx_role():
    objects = [getattr(paraflow, name) for name in paraflow.__all__]
    objects += [
        member for _, member in inspect.getmembers(paraflow.Backend) if callable(member) or isinstance(member, property)
    ]
    found = [
        getattr(obj, "__qualname__", repr(obj)) for obj in objects if SPHINX_ROLE.search(inspect.getdoc(obj) or "")
    ]
    assert found == []


def test_paraflow_launch_has_the_default_time_limit_of_its_implementation():
    from paraflow.tools import spawn

    assert inspect.signature(paraflow.launch).parameters["time_limit"].default == spawn.DEFAULT_TIME_LIMIT


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
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed: pip install -e '.[docs]'")
    env = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true", "PATH": "/usr/bin:/bin"}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    done = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
    api = html.unescape(re.sub(r"<[^>]+>", " ", (tmp_path / "site" / "reference" / "api" / "index.html").read_text()))
    shutil.rmtree(tmp_path / "site")
    words = set(re.findall(r"[\w.]+", api))
    assert [name for name in [*USER_METHODS, *sorted(init_options())] if name not in words] == []
    assert SPHINX_ROLE.search(api) is None

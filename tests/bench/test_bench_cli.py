"""`paraflow bench`'s flags: comma lists or repeats, modes as subcommands, old spellings still working."""

from __future__ import annotations

import argparse

import pytest

from paraflow.bench.driver.cli import RENAMED, add_arguments, config_from_args, split_models
from paraflow.errors import ConfigurationError


def parse(*argv):
    return add_arguments(argparse.ArgumentParser(prog="paraflow bench")).parse_args(list(argv))


def test_list_flags_take_a_comma_list_or_repeat():
    args = parse("--backend", "ddp-gloo,horovod", "--backend", "fsdp", "-n", "2", "--launcher", "mpirun")
    assert args.backend == ["ddp-gloo", "horovod", "fsdp"] and args.nprocs == ["2"] and args.launcher == ["mpirun"]
    assert parse("--nprocs", "1,2", "--nprocs", "4").nprocs == ["1", "2", "4"]
    assert parse().backend is None and parse().model is None and (parse().mode or "run") == "run"


def test_model_commas_split_specs_but_not_their_options():
    assert split_models("mlp:width=16,cnn") == ["mlp:width=16", "cnn"]
    assert split_models("transformer:width=16,depth=1") == ["transformer:width=16,depth=1"]
    assert split_models("pkg.mod:build:hidden=40,depth=2,cnn") == ["pkg.mod:build:hidden=40,depth=2", "cnn"]
    args = parse("--model", "mlp,cnn", "--model", "transformer:width=16,depth=1")
    assert args.model == ["mlp", "cnn", "transformer:width=16,depth=1"]


def test_project_is_a_subcommand():
    args = parse("project", "R")
    assert args.mode == "project" and args.run == "R"


def test_script_arguments_after_the_double_dash_stay_the_scripts():
    args = parse("--script", "t.py", "--backend", "ddp-gloo", "--", "--epochs", "3", "--backend", "x")
    assert (
        args.script == "t.py"
        and args.backend == ["ddp-gloo"]
        and args.script_args == ["--epochs", "3", "--backend", "x"]
    )
    with pytest.raises(ConfigurationError, match="add --script PATH"):
        config_from_args(parse("--", "--epochs", "3"))


NEW_SPELLINGS = {  # how each old spelling is written today, with the same values
    "--backends": (["--backends", "ddp-gloo,single"], ["--backend", "ddp-gloo,single"]),
    "--launchers": (["--launchers", "torchrun", "--launchers", "mpirun"], ["--launcher", "torchrun,mpirun"]),
    "--models": (["--models", "mlp"], ["--model", "mlp"]),
    "--project-only": (["--project-only", "A"], ["project", "A"]),
    "--steps": (["--steps", "5"], ["--window-steps", "5"]),
    "--timeout": (["--timeout", "30"], ["--launch-timeout", "30"]),
    "--cluster": (["--cluster", "2"], ["--nodes", "2"]),
}


def test_every_old_spelling_has_its_case():
    assert set(NEW_SPELLINGS) == set(RENAMED)


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_spelling_runs_as_the_new_one_with_a_note(old, capsys):
    old_argv, new_argv = NEW_SPELLINGS[old]
    parsed = parse(*old_argv)
    assert f"note: {old} was renamed: use {RENAMED[old]}" in capsys.readouterr().err
    assert vars(parsed) == vars(parse(*new_argv))


def test_every_flag_has_help():
    parser = add_arguments(argparse.ArgumentParser(prog="paraflow bench"))
    missing = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
    assert not missing


def test_config_from_new_flags():
    config = config_from_args(parse("--backend", "ddp-gloo", "-n", "2", "--model", "mlp:width=16", "--no-plots"))
    assert (
        config.backends == ["ddp-gloo"] and config.nprocs == [2] and [str(m) for m in config.models] == ["mlp:width=16"]
    )

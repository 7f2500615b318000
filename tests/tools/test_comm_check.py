"""`paraflow check comm`: four collectives per backend, a rank that cannot connect named in time."""

import json
import subprocess
import sys

import pytest
from conftest import _HOROVOD_MISSING, ROOT

from paraflow.environment.launchers import free_port
from paraflow.tools.comm_check import COLLECTIVES, render, run_checks


def check_comm(env, *args):
    cmd = [sys.executable, "-m", "paraflow.cli", "check", "comm", *args]
    return subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=400)


def test_single_ddp_gloo_and_horovod_pass_here(no_leftovers):
    names = ["single", "ddp-gloo"] + ([] if _HOROVOD_MISSING else ["horovod"])
    done = check_comm(no_leftovers, "--json", "-n", "2", "--backend", ",".join(names), "--wait-timeout", "60")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert [r["backend"] for r in results] == names
    for result in results:
        assert result["status"] == "ok" and result["problems"] == [] and result["never_arrived"] == []
        assert list(result["times_ms"]) == list(COLLECTIVES)
        n = 1 if result["backend"] == "single" else 2
        assert result["processes"] == n and [r["rank"] for r in result["ranks"]] == list(range(n))
        assert all(r["wrong"] == [] and r["interface"] == "lo" for r in result["ranks"])
        text = render(result)
        assert text.startswith(f"{result['backend']:10s} ok") and "allreduce" in text and "route to it" in text
    transports = {r["backend"]: r["ranks"][0]["transport"]["transport"] for r in results}
    assert transports["ddp-gloo"] == "gloo" and transports["single"] == "none"


def test_a_rank_that_cannot_connect_is_named_within_the_timeout(no_leftovers):
    wrong = {1: {"MASTER_PORT": str(free_port())}}  # nothing listens there: rank 1 cannot reach rank 0
    (result,) = run_checks(["ddp-gloo"], nprocs=2, timeout=5, rank_env=wrong)
    assert result["status"] == "failed" and result["never_arrived"] == [1]
    assert any(p.startswith("rank 1: could not reach rank 0") for p in result["problems"])
    assert any(p.startswith("rank 0: waited 5 s") and "rank 1 never arrived" in p for p in result["problems"])
    assert "never arrived within 5 s: rank(s) 1" in render(result)


def test_a_broken_backend_fails_the_command(no_leftovers):
    env = {**no_leftovers, "GLOO_SOCKET_IFNAME": "no-such-interface0"}
    done = check_comm(env, "--backend", "ddp-gloo", "--wait-timeout", "20")
    assert done.returncode == 1
    assert "ddp-gloo   FAILED" in done.stdout and "no-such-interface0" in done.stdout


def test_unknown_backends_are_refused_before_anything_starts(capsys):
    from paraflow.cli import main

    assert main(["check", "comm", "--backend", "nope"]) == 2
    assert "known backends" in capsys.readouterr().err
    assert main(["check", "--backend", "nope"]) == 2  # the old spelling, refused the same way
    err = capsys.readouterr().err
    assert "known backends" in err and "--backend was renamed: use paraflow check comm --backend" in err


@pytest.mark.parametrize(
    "old, new, said",
    [
        (["check", "--comm"], ["check", "comm"], ["--comm was renamed: use paraflow check comm"]),
        (
            ["check", "--comm", "-n", "3", "--backend", "ddp-gloo", "--timeout", "7"],
            ["check", "comm", "-n", "3", "--backend", "ddp-gloo", "--wait-timeout", "7"],
            [
                "-n was renamed: use paraflow check comm -n",
                "--timeout was renamed: use paraflow check comm --wait-timeout",
            ],
        ),
        (
            ["check", "--timeout", "7"],
            ["check", "comm", "--wait-timeout", "7"],
            ["--timeout was renamed: use paraflow check comm --wait-timeout"],
        ),
        (
            ["check", "comm", "--timeout", "7"],
            ["check", "comm", "--wait-timeout", "7"],
            ["--timeout was renamed: use --wait-timeout"],
        ),
    ],
)
def test_an_old_spelling_of_check_comm_runs_as_the_new_one_with_a_note(old, new, said, capsys):
    from paraflow.cli import build_parser

    parsed = vars(build_parser().parse_args(old))
    err = capsys.readouterr().err
    assert parsed == vars(build_parser().parse_args(new))
    for line in said:
        assert f"note: {line} (the old spelling goes in the next release)" in err, err


def test_an_old_spelling_takes_values_as_the_new_one_does(capsys):
    from paraflow.cli import build_parser

    with pytest.raises(SystemExit) as ended:
        build_parser().parse_args(["check", "-n", "three"])
    assert ended.value.code == 2
    assert "invalid int value: 'three'" in capsys.readouterr().err

"""Horovod's API on paraflow's backends: a script in Horovod's idiom (tests/workers/horovod_idiom.py)
trains real Horovod's parameters through paraflow.compat.horovod, on ddp-gloo under torchrun and
mpirun, on fsdp, and on the horovod backend; unchanged, through `paraflow run --horovod-api`, also
where Horovod cannot be imported at all.

Two ranks add each gradient in the same order as Horovod, and the average is the sum times 1/2 in
both, so the parameters agree bit for bit; the tests ask for 1e-9 in float64, the promise the docs
make for any number of ranks.
"""

import json
import subprocess
import sys

import pytest
import torch
from conftest import RANK_ENV, ROOT, WORKERS, launch, launch_ok, requires_horovod

pytestmark = pytest.mark.xdist_group("horovod-api")

SCRIPT = WORKERS / "horovod_idiom.py"
IMPORT = "\nimport horovod.torch as hvd\n"
#: What the script's collectives give on two ranks: Horovod's answers (the first rank's, the second's).
COLLECTIVES = {
    "size": (2, 2),
    "local": ([0, 2, 0, 1], [1, 2, 0, 1]),
    "gathered": ([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]],) * 2,
    "broadcast": ([6.0], [6.0]),
    "object": ({"epoch": 2, "from": 0},) * 2,
    "objects": ([["rank", 0], ["rank", 1]],) * 2,
    "sum": ([3.0, 4.0],) * 2,
    "int_average": ([3, 4],) * 2,  # (3 + 4) / 2 and (4 + 5) / 2, truncated as Horovod does
    "max": ([1.0, -0.0],) * 2,
    "scaled": ([2.25, 6.75],) * 2,  # (1 + 2) * 0.5 / 2 * 3 and (3 + 6) * 0.5 / 2 * 3
    "grouped": ([[0.5, 0.5], [1.5, 1.5, 1.5]],) * 2,
    "alltoall": ([0, 1, 10, 11], [2, 3, 12, 13]),
    "alltoall_splits": ([[0, 10], [1, 1]], [[1, 2, 11, 12], [2, 2]]),
    "reducescatter": ([0.0, 1.5, 3.0], [4.5, 6.0]),  # five rows: the first rank takes three
    "async": ([[3.0], [3.0]],) * 2,
    # gradients through allgather (this rank's rows, averaged), broadcast (to the root, averaged),
    # alltoall (rows sent back) and reducescatter (gathered, times the size under Sum)
    "gradients": (
        [[1.0, 2.0], [2.5], [1.0, 2.0, 1.0, 2.0], [2.0, 2.0, 4.0]],
        [[3.0, 4.0], [0.0], [6.0, 8.0, 6.0, 8.0], [2.0, 2.0, 4.0]],
    ),
}
#: Importing horovod raises in every process that has this sitecustomize: Horovod "not installed".
HIDE_HOROVOD = """import sys
class HideHorovod:
    def find_spec(self, name, path=None, target=None):
        if name == "horovod" or name.startswith("horovod."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
sys.meta_path.insert(0, HideHorovod())
"""


def results(out):
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return torch.load(out / "params.pt", weights_only=True), reports


def drop_in_script(directory):
    """The worker with only its import changed."""
    text = SCRIPT.read_text()
    assert text.count(IMPORT) == 1
    script = directory / "horovod_idiom_drop_in.py"
    script.write_text(text.replace(IMPORT, "\nimport paraflow.compat.horovod as hvd\n"))
    return script


def run_drop_in(tmp_path, launcher, backend):
    out = tmp_path / "out"
    out.mkdir()
    launch_ok(launcher, 2, [drop_in_script(tmp_path), out], timeout=180, env={"PARAFLOW_BACKEND": backend})
    return results(out)


def paraflow_run(tmp_path, backend, env=None):
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-m", "paraflow.cli", "run", "-n", "2", "--backend", backend, "--horovod-api"]
    done = subprocess.run(
        [*command, str(SCRIPT), str(out)],
        env={"PATH": "/usr/bin:/bin", **RANK_ENV, **(env or {})},
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return results(out)


def assert_same_parameters(trained, reference):
    assert trained.keys() == reference.keys()
    for key, value in reference.items():
        assert value.dtype in (torch.float64, torch.int64), key
        torch.testing.assert_close(trained[key], value, rtol=0, atol=1e-9, msg=key)


def assert_same_reports(reports, reference_reports):
    for mine, theirs in zip(reports, reference_reports):
        assert mine["norms"] == pytest.approx(theirs["norms"], rel=1e-9, abs=0)
        assert mine["losses"] == pytest.approx(theirs["losses"], rel=1e-9, abs=0)
        for key in COLLECTIVES:
            assert mine[key] == theirs[key], key


@pytest.fixture(scope="module")
def horovod(tmp_path_factory):
    """The worker under real Horovod (mpirun), unchanged."""
    out = tmp_path_factory.mktemp("real-horovod")
    launch_ok("mpirun", 2, [SCRIPT, out], timeout=180)
    return results(out)


@pytest.fixture(scope="module")
def without_horovod(tmp_path_factory):
    """The unchanged worker through `paraflow run --horovod-api` on ddp-gloo, horovod hidden."""
    directory = tmp_path_factory.mktemp("no-horovod")
    (directory / "site").mkdir()
    (directory / "site" / "sitecustomize.py").write_text(HIDE_HOROVOD)
    return paraflow_run(directory, "ddp-gloo", env={"PYTHONPATH": f"{directory / 'site'}:{ROOT}"})


@pytest.mark.timeout(300)
def test_the_unchanged_script_runs_through_paraflow_run_horovod_api_where_horovod_cannot_be_imported(without_horovod):
    trained, reports = without_horovod
    for rank, report in enumerate(reports):
        assert report["rank"] == rank
        for key, expected in COLLECTIVES.items():
            assert report[key] == expected[rank], key
        assert report["losses"][0] == reports[0]["losses"][0]  # the metric is the same average on every rank
        assert report["join"] == 1
    assert all(n > 0.5 for n in reports[0]["norms"][:2]), "the guard: clipping must act"
    assert all(torch.isfinite(v.double()).all() for v in trained.values())


@requires_horovod
@pytest.mark.long
@pytest.mark.timeout(300)
def test_the_unchanged_script_gives_real_horovods_parameters_through_paraflow_run_horovod_api(horovod, without_horovod):
    assert_same_parameters(without_horovod[0], horovod[0])
    assert_same_reports(without_horovod[1], horovod[1])
    assert horovod[1][0]["join"] in (0, 1)  # Horovod's last rank to join depends on timing


@requires_horovod
@pytest.mark.long
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "launcher, backend", [("torchrun", "ddp-gloo"), ("mpirun", "ddp-gloo"), ("mpirun", "horovod"), ("torchrun", "fsdp")]
)
def test_the_drop_in_gives_real_horovods_parameters(tmp_path, horovod, launcher, backend):
    trained, reports = run_drop_in(tmp_path, launcher, backend)
    assert_same_parameters(trained, horovod[0])
    assert_same_reports(reports, horovod[1])


@requires_horovod
@pytest.mark.long
@pytest.mark.timeout(420)
def test_paraflow_bench_times_a_horovod_script_under_horovod_and_through_the_drop_in(tmp_path, no_leftovers):
    out = tmp_path / "out"
    script = ROOT / "docs" / "examples" / "horovod_synthetic_benchmark.py"
    command = [sys.executable, "-m", "paraflow.cli", "bench", "--script", str(script), "--horovod-api"]
    quick = [
        "--repeat",
        "1",
        "--max-repeat",
        "1",
        "--no-aa-check",
        "--no-plots",
        "--warmup",
        "2",
        "--window-steps",
        "3",
    ]
    where = ["--backend", "horovod,ddp-gloo", "--launcher", "mpirun,torchrun", "--nprocs", "2", "--out", str(out)]
    done = subprocess.run(
        [*command, *quick, *where, "--", "--batch-size", "8"],
        env={**no_leftovers, "PARAFLOW_BACKEND": ""},
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    cells = results["cells"]
    assert {c["group"] for c in cells} == {"single-python-1", "horovod-mpirun-2", "ddp-gloo-torchrun-2"}
    assert all(c["status"] == "ok" for c in cells), [c["error"] for c in cells]
    for row in results["tables"]["training"]:
        assert row["samples_per_s"] > 0 and row["global_batch"] == 8 * row["processes"]  # the script's --batch-size
    assert done.stdout.index("Verdict") < done.stdout.index("samples/s")  # the verdict first


def test_bench_horovod_api_needs_a_script():
    from paraflow.bench.driver.config import BenchConfig
    from paraflow.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="--horovod-api runs a script written for Horovod: add --script"):
        BenchConfig(horovod_api=True)


CHECKS = WORKERS / "horovod_api_checks.py"


@pytest.mark.long
@pytest.mark.timeout(300)
def test_sync_batch_norm_and_a_parameter_no_rank_uses_on_two_ranks(tmp_path):
    launch_ok("torchrun", 2, [CHECKS, "checks", tmp_path], timeout=180, env={"PARAFLOW_BACKEND": "ddp-gloo"})
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for key in ("output", "input_grad", "weight_grad", "running_mean", "running_var"):
            assert report[key] < 1e-12, (key, report[key])  # BatchNorm over the whole batch, in float64
        assert report["unused_grad"] == 0.0 and report["used_grad"] == [[1.5, 1.5], [1.5, 1.5]]  # (1 + 2) / 2


@pytest.mark.timeout(300)
def test_a_rank_that_fails_ends_the_job_instead_of_leaving_the_other_waiting(tmp_path):
    env = {"PARAFLOW_BACKEND": "ddp-gloo", "PARAFLOW_TIMEOUT": "120"}
    result = launch("torchrun", 2, [CHECKS, "raise", tmp_path], timeout=100, env=env)  # fails the test if it hangs
    assert result.returncode != 0 and "RuntimeError: rank 1 fails on purpose" in result.stderr, result.stderr[-3000:]

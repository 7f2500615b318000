"""In one process: paraflow.current(), options of other backends, the banner, Open MPI's yield setting."""

import os

import pytest

import paraflow
from paraflow.core import options
from paraflow.core.banner import banner_line
from paraflow.core.registry import _REGISTRY
from paraflow.environment.launchers import ProcessEnvironment
from paraflow.environment.launchers.openmpi import MPI_YIELD, apply_mpi_yield, mpi_yield_decision


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Each test starts with nothing initialised and no option announced yet."""
    monkeypatch.setattr(options, "_announced", set())
    for key in ("PARAFLOW_BANNER", MPI_YIELD):
        monkeypatch.setenv(key, "")  # recorded, so whatever a test sets is undone
        monkeypatch.delenv(key)


# ---------------------------------------------------------------- paraflow.current()
def test_current_is_the_initialised_backend_and_goes_with_it():
    with pytest.raises(paraflow.NotInitializedError, match=r"paraflow\.init"):
        paraflow.current()
    with paraflow.init("single", banner=False) as backend:
        assert paraflow.current() is backend
        assert (paraflow.rank(), paraflow.world_size(), paraflow.local_rank(), paraflow.is_main()) == (0, 1, 0, True)
        inner = paraflow.init("single", banner=False)
        assert paraflow.current() is inner
        inner.shutdown()
        assert paraflow.current() is backend  # the one before is current again
    with pytest.raises(paraflow.NotInitializedError):
        paraflow.rank()
    assert issubclass(paraflow.NotInitializedError, RuntimeError)


# ---------------------------------------------------------------- options of other backends
def test_another_backends_options_are_ignored_with_one_line_on_rank_0(capsys):
    options = {"reduce_op": "adasum", "fusion_threshold_mb": 32, "bucket_cap_mb": 50, "static_graph": True}
    for _ in range(2):
        with paraflow.init("single", banner=False, **options) as backend:
            assert sorted(backend.ignored_options) == sorted(options)
            assert backend.ignored_options["reduce_op"] == ["horovod"]
            assert backend.ignored_options["bucket_cap_mb"] == ["ddp", "ddp-gloo", "ddp-nccl"]
    err = capsys.readouterr().err
    assert err.count("paraflow: backend 'single' ignores option(s) of other backends:") == 1, err
    assert "bucket_cap_mb (ddp / ddp-gloo / ddp-nccl)" in err and "reduce_op (horovod)" in err


def test_ddp_ignores_horovods_options_and_keeps_its_own():
    backend = paraflow.get_backend("ddp-gloo", bucket_cap_mb=7, reduce_op="adasum", cycle_time_ms=5)
    assert backend.ddp_options == {"bucket_cap_mb": 7}
    assert sorted(backend.ignored_options) == ["cycle_time_ms", "reduce_op"]


def test_a_name_no_backend_takes_is_an_error_listing_what_is_accepted():
    with pytest.raises(paraflow.ConfigurationError) as err:
        paraflow.get_backend("ddp-gloo", bucket_cap=50)
    message = str(err.value)
    assert "bucket_cap" in message and "no registered backend does" in message
    accepted, _, others = message.partition("other backends' options")
    assert "bucket_cap_mb" in accepted and "timeout" in accepted and "stall_threshold" in accepted
    assert "reduce_op" in others and "fusion_threshold_mb" in others


def test_other_backends_options_come_from_the_registry(capsys):
    """A backend registered later brings its options; unregistered, they are typos again."""

    class Knobbed(paraflow.Backend):
        OPTIONS = frozenset({"toy_knob"})

    paraflow.register_backend("knobbed", Knobbed)
    try:
        with paraflow.init("single", banner=False, toy_knob=3) as backend:
            assert backend.ignored_options == {"toy_knob": ["knobbed"]}
        assert "toy_knob (knobbed)" in capsys.readouterr().err
    finally:
        del _REGISTRY["knobbed"]
    with pytest.raises(paraflow.ConfigurationError, match="toy_knob"):
        paraflow.get_backend("single", toy_knob=3)


# ---------------------------------------------------------------- the banner
def test_banner_on_rank_0_says_what_runs_and_how_to_silence_it(capsys, monkeypatch):
    with paraflow.init("single") as backend:
        line = banner_line(backend)
    assert capsys.readouterr().err.strip() == line
    assert line.startswith("paraflow: single, 1 process, no launcher (plain python), cpu, ")
    assert "PARAFLOW_BANNER=0" in line
    paraflow.init("single", banner=False).shutdown()
    monkeypatch.setenv("PARAFLOW_BANNER", "0")
    paraflow.init("single").shutdown()
    assert capsys.readouterr().err == ""
    paraflow.init("single", banner=True).shutdown()  # the option wins over the variable
    assert "paraflow: single" in capsys.readouterr().err


def test_banner_of_a_multi_process_backend_without_launcher_says_one_process():
    backend = paraflow.get_backend("ddp-gloo", timeout=30)
    backend.init()
    try:
        line = banner_line(backend)
    finally:
        backend.shutdown()
    assert line.startswith("paraflow: ddp-gloo over gloo, 1 process, no launcher (plain python)")
    assert "Plain python starts one process; for N: `torchrun --nproc_per_node N" in line


# ---------------------------------------------------------------- Open MPI's yield_when_idle
def mpirun(ranks: int) -> ProcessEnvironment:
    return ProcessEnvironment("openmpi", 0, ranks, 0, ranks)


def test_yield_is_set_under_mpirun_when_the_ranks_fill_every_core():
    assert mpi_yield_decision(mpirun(2), threads=1, cores=2) is None
    assert apply_mpi_yield(mpirun(4), threads=1, cores=4)
    assert os.environ[MPI_YIELD] == "1"


def test_yield_is_left_alone_elsewhere(monkeypatch):
    assert "leave cores free" in mpi_yield_decision(mpirun(2), threads=2, cores=8)
    assert "Open MPI" in mpi_yield_decision(ProcessEnvironment("torchrun", 0, 2, 0, 2), threads=1, cores=2)
    assert "Open MPI" in mpi_yield_decision(ProcessEnvironment("mpich", 0, 2, 0, 2), threads=1, cores=2)
    monkeypatch.setenv(MPI_YIELD, "0")  # the user's choice, e.g. mpirun --mca mpi_yield_when_idle 0
    assert "is set already" in mpi_yield_decision(mpirun(2), threads=1, cores=2)
    assert not apply_mpi_yield(mpirun(2), threads=1, cores=2)
    assert os.environ[MPI_YIELD] == "0"


def test_single_process_backends_take_the_new_common_options():
    backend = paraflow.get_backend("single", banner=False, stall_threshold=12)
    assert backend.banner is False and backend.stall_threshold == 12
    with pytest.raises(paraflow.ConfigurationError, match="stall_threshold"):
        paraflow.get_backend("single", stall_threshold=-1)

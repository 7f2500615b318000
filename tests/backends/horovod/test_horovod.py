"""The horovod backend: options, controllers per launcher, bad input, missing horovod, real ranks."""

import json
import sys
import textwrap

import pytest
import torch
from conftest import WORKERS, launch, launch_ok, read_rank_json, requires_horovod
from torch import nn

import paraflow
from paraflow.environment.launchers import ProcessEnvironment
from paraflow.errors import ConfigurationError, LauncherError, MissingDependencyError, ParaflowError

# ---------------------------------------------------------------- options (no horovod needed)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"compression": "bf16"}, "'none', 'fp16'"),
        ({"compression": "int8"}, "'none', 'fp16'"),
        ({"reduce_op": "mean"}, "'average', 'sum', 'adasum'"),
        ({"controller": "nccl"}, "'auto', 'mpi', 'gloo'"),
        ({"accumulation_steps": 0}, "accumulation_steps"),
        ({"accumulation_steps": 1.5}, "accumulation_steps"),
        ({"gradient_predivide_factor": 0}, "gradient_predivide_factor"),
        ({"gradient_predivide_factor": 2.0, "reduce_op": "sum"}, "reduce_op='average' only"),
        ({"fusion_threshold_mb": -1}, "non-negative"),
        ({"cycle_time_ms": 0}, "positive"),
        ({"fusion_treshold_mb": 25}, "fusion_threshold_mb"),  # a typo; DDP's bucket_cap_mb is ignored
    ],
)
def test_bad_options_fail_at_construction_naming_what_is_accepted(options, message):
    with pytest.raises(ConfigurationError) as err:
        paraflow.get_backend("horovod", **options)
    assert message in str(err.value)


def test_options_are_kept_under_their_names():
    backend = paraflow.get_backend(
        "horovod",
        compression="fp16",
        accumulation_steps=3,
        reduce_op="sum",
        fusion_threshold_mb=0,
        cycle_time_ms=2.5,
        controller="gloo",
    )
    assert (
        backend.compression,
        backend.accumulation_steps,
        backend.reduce_op,
        backend.fusion_threshold_mb,
        backend.cycle_time_ms,
        backend.requested_controller,
    ) == ("fp16", 3, "sum", 0.0, 2.5, "gloo")
    assert backend.controller is None and backend.transport is None  # not started yet


# ---------------------------------------------------------------- missing horovod (simulated)


@pytest.fixture
def no_horovod(monkeypatch):
    """Make `import horovod.torch` fail as on a machine without horovod."""
    for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "horovod", None)
    monkeypatch.setitem(sys.modules, "horovod.torch", None)


def test_missing_horovod_is_an_import_error_saying_how_to_install(no_horovod):
    with pytest.raises(MissingDependencyError) as err:
        paraflow.init("horovod")
    assert isinstance(err.value, ImportError) and isinstance(err.value, ParaflowError)
    assert "horovod is not installed" in str(err.value)
    assert "paraflow build-horovod" in str(err.value) and "make install" in str(err.value)


def test_missing_horovod_is_listed_unavailable_and_nothing_else_breaks(no_horovod):
    available = paraflow.available_backends()
    assert "paraflow build-horovod" in available["horovod"]
    assert available["single"] is None and available["ddp-gloo"] is None
    with paraflow.init("single") as backend:
        assert backend.allreduce(torch.ones(2), op="sum").tolist() == [1.0, 1.0]


def test_horovod_without_its_torch_extension_is_reported(monkeypatch):
    import types

    for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
        monkeypatch.delitem(sys.modules, name)
    package = types.ModuleType("horovod")
    package.__path__ = []
    monkeypatch.setitem(sys.modules, "horovod", package)
    monkeypatch.setitem(sys.modules, "horovod.torch", types.ModuleType("horovod.torch"))
    with pytest.raises(MissingDependencyError, match="without its PyTorch extension"):
        paraflow.get_backend("horovod").init()


# ---------------------------------------------------------------- launchers it cannot use


@requires_horovod
def test_mpi_controller_under_torchrun_prints_working_commands():
    backend = paraflow.get_backend("horovod", controller="mpi", num_threads=1)
    with pytest.raises(LauncherError) as err:
        backend.init(ProcessEnvironment("torchrun", 0, 2, 0, 2, "127.0.0.1", 1))
    message = str(err.value)
    assert "mpirun -np 2 python train.py --backend horovod" in message
    assert "horovodrun -np 2 -H localhost:2 --gloo python train.py --backend horovod" in message


@requires_horovod
def test_mpi_controller_under_horovodrun_gloo_is_refused():
    backend = paraflow.get_backend("horovod", controller="mpi", num_threads=1)
    with pytest.raises(LauncherError, match="mpirun -np 2 python train.py --backend horovod"):
        backend.init(ProcessEnvironment("horovodrun", 0, 2, 0, 2))


@requires_horovod
def test_horovodrun_variables_without_its_rendezvous_say_how_to_launch():
    backend = paraflow.get_backend("horovod", num_threads=1)
    with pytest.raises(LauncherError, match="horovodrun -np 2 -H localhost:2 --gloo"):
        backend.init(ProcessEnvironment("horovodrun", 1, 2, 1, 2))


@requires_horovod
def test_mpi_launcher_whose_mpi_horovod_was_not_built_for_is_refused():
    """MPICH's mpiexec sets PMI_*; horovod built on Open MPI starts alone, a world of 1, not 2."""
    env = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    result = launch("python", 1, ["-c", "import paraflow; paraflow.init('horovod')"], timeout=90, env=env)
    assert result.returncode != 0
    assert "LauncherError" in result.stderr and "rank 0 of 1" in result.stderr
    assert "mpirun -np 2 python train.py --backend horovod" in result.stderr


# ---------------------------------------------------------------- one process, in this process


@requires_horovod
def test_one_process_session_wraps_with_the_options_asked_for():
    import horovod.torch as hvd

    backend = paraflow.get_backend(
        "horovod",
        num_threads=1,
        compression="fp16",
        accumulation_steps=2,
        reduce_op="average",
        gradient_predivide_factor=2.0,
    )
    with backend:
        assert (backend.controller, backend.transport, backend.world_size) == ("gloo", "gloo", 1)
        model = backend.wrap_model(nn.Linear(3, 2))
        assert backend.unwrap(model) is model
        optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        assert isinstance(optimizer, torch.optim.SGD)
        assert optimizer.backward_passes_per_step == 2 and optimizer.op == hvd.Average
        assert optimizer.gradient_predivide_factor == 2.0
        assert optimizer._compression is hvd.Compression.fp16
        delays = dict(optimizer._allreduce_delay)
        with backend.no_sync(model):
            assert all(optimizer._allreduce_delay[p] > 10**6 for p in delays)
            model(torch.ones(1, 3)).sum().backward()
        # DDP's meaning: the forward inside decided; reduction stays off until a forward outside
        assert all(optimizer._allreduce_delay[p] > 10**6 for p in delays)
        with torch.no_grad():
            model(torch.ones(1, 3))  # evaluation decides nothing
        assert all(optimizer._allreduce_delay[p] > 10**6 for p in delays)
        loss = model(torch.ones(1, 3)).sum()
        assert optimizer._allreduce_delay == delays  # passes inside no_sync did not count
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # horovod 0.28's own zero_grad refuses the keyword
        assert all(p.grad is None for p in model.parameters())
        assert backend.allgather(torch.tensor(3.0))[0].tolist() == 3.0  # a 0-d tensor
    assert backend.controller is None and not hvd.is_initialized()


@requires_horovod
def test_adasum_on_the_cpu_under_gloo_is_refused_with_the_mpirun_command():
    backend = paraflow.get_backend("horovod", reduce_op="adasum", num_threads=1)
    with pytest.raises(ConfigurationError, match="mpirun -np 1 python train.py --backend horovod"):
        backend.init()
    assert backend.controller is None


_MPI_THEN_GLOO = textwrap.dedent("""
    import paraflow
    from paraflow.errors import ConfigurationError
    with paraflow.init("horovod") as backend:
        assert backend.controller == "mpi"
    with paraflow.init("horovod") as backend:  # MPI again: mpi4py keeps MPI up between sessions
        assert backend.controller == "mpi"
    try:
        paraflow.init("horovod", controller="gloo")
    except ConfigurationError as exc:
        print("refused:", exc)
""")


@requires_horovod
def test_mpi_then_gloo_in_one_process_is_refused_instead_of_aborting():
    result = launch_ok("mpirun", 1, ["-c", _MPI_THEN_GLOO], timeout=90)
    assert "refused: horovod ran with its MPI controller earlier in this process" in result.stdout


_KNOBS = textwrap.dedent("""
    import json, os, paraflow
    from paraflow.errors import ConfigurationError
    def horovod_vars():
        return {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}
    seen = {}
    with paraflow.init("horovod", fusion_threshold_mb=1, cycle_time_ms=2.5, timeout=33) as backend:
        seen["during"] = horovod_vars()
    seen["after"] = horovod_vars()
    try:
        paraflow.init("horovod").shutdown()
        seen["restart"] = "started"
    except ConfigurationError as exc:
        seen["restart"] = str(exc)
    print(json.dumps(seen))
""")


@requires_horovod
def test_tuning_options_reach_horovod_and_a_restart_it_would_crash_on_is_refused():
    result = launch_ok("python", 1, ["-c", _KNOBS], timeout=90)
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    during = seen["during"]
    assert during["HOROVOD_FUSION_THRESHOLD"] == str(1024 * 1024)
    assert during["HOROVOD_CYCLE_TIME"] == "2.5"
    assert during["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "33"
    assert during["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "33"
    assert during["HOROVOD_CONTROLLER"] == "gloo" and during["HOROVOD_RANK"] == "0"
    assert seen["after"] == {}  # every variable put back as it was
    assert "new process" in seen["restart"] and "fusion_threshold_mb" in seen["restart"]


# ---------------------------------------------------------------- real ranks


@requires_horovod
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "launcher, controller, options, gradient",
    [
        ("mpirun", "mpi", {}, 1.5),  # the average of 1 and 2
        ("horovodrun", "gloo", {"reduce_op": "sum"}, 3.0),
        ("torchrun", "gloo", {"compression": "fp16", "gradient_predivide_factor": 2.0}, 1.5),
    ],
    ids=["mpirun", "horovodrun-sum", "torchrun-fp16-predivide"],
)
def test_real_ranks(tmp_path, launcher, controller, options, gradient):
    """Controller per launcher; bad shapes; parameter, buffer and optimizer broadcasts; gradient options."""
    launch_ok(launcher, 2, [WORKERS / "horovod_checks.py", tmp_path, json.dumps(options)], timeout=150)
    for rank, seen in enumerate(read_rank_json(tmp_path, 2)):
        assert (seen["rank"], seen["world_size"], seen["controller"]) == (rank, 2, controller)
        # Shapes that differ across ranks: an error on every rank, quickly, and the job goes on.
        for collective in ("allreduce", "allgather", "broadcast"):
            outcome = seen["mismatch"][collective]
            assert outcome["raised"] == "CollectiveError", (rank, collective, outcome)
            assert "shape" in outcome["message"] and outcome["seconds"] < 30, (rank, collective, outcome)
        assert seen["mismatch"]["after"] == [2.0, 2.0]
        b = seen["broadcast"]
        assert b["model_same"] and b["buffers_from_rank0"] and b["rank0_model_kept"] in (True, None)
        assert b["lr"] == pytest.approx(0.1) and b["momentum_same"] and b["momentum_from_rank0"]
        assert b["model_same_after_optimizer"]
        assert b["adam_state_empty"] and b["adam_model_unchanged"]
        assert b["missing_model_error"] is None  # wrap_optimizer(optimizer) works without the model, as on DDP
        assert seen["gradient"] == [gradient] * 4


# ---------------------------------------------------------------- rendezvous helpers


@pytest.mark.parametrize(
    "hosts, rank, local_rank, expected",
    [
        (["a", "a"], 1, 1, (1, 2, 0, 1)),  # one host
        (["a", "a", "b", "b"], 2, 0, (0, 2, 1, 2)),  # two hosts, first slot of the second
        (["a", "a", "b", "b"], 3, 1, (1, 2, 1, 2)),
        (["a", "a", "b"], 1, 1, (1, 2, 0, 1)),  # uneven: only host a has a local rank 1
    ],
)
@requires_horovod
def test_rendezvous_gives_horovods_local_and_cross_ranks(monkeypatch, hosts, rank, local_rank, expected):
    from paraflow.backends.horovod import start

    class Store(dict):
        def set(self, key, value):
            self[key] = str(value).encode()

        def wait(self, keys, timeout=None):
            pass

        def get(self, key):
            return self[key]

    local_size = hosts.count(hosts[rank])
    env = ProcessEnvironment("torchrun", rank, len(hosts), local_rank, local_size, "a", 1)
    rendezvous = start.GlooRendezvous(env, "a", 1, serve_store=False, timeout=5)
    monkeypatch.setattr(start, "store_for_this_attempt", lambda *args, **kwargs: Store(server=b"127.0.0.1:1"))
    monkeypatch.setattr(rendezvous, "_gather_hosts", lambda store: hosts)
    monkeypatch.setattr(start.socket, "gethostname", lambda: hosts[rank])
    try:
        variables = rendezvous.start()
    finally:
        rendezvous.close()
    names = ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")
    assert tuple(int(variables[name]) for name in names) == expected


def test_gloo_interface_towards_this_host_is_loopback():
    from paraflow.backends.horovod.start import gloo_interface

    assert gloo_interface("127.0.0.1") == "lo"


# ---------------------------------------------------------------- the build command


def test_build_cache_key_names_horovod_torch_python_and_the_mpi():
    from paraflow.backends.horovod.build import build_gpu, cache_key
    from paraflow.environment.mpi_library import wrapper_mpi

    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    mpi = wrapper_mpi(sys.executable)
    gpu = build_gpu(sys.executable)
    suffix = f"-{gpu.operations.lower() or 'cuda'}" if gpu.enabled else ""
    expected = f"horovod-0.28.1-torch{torch.__version__}-{tag}-{mpi.key if mpi else 'nompi'}{suffix}"
    assert cache_key(sys.executable) == expected


def test_build_without_compilers_says_what_to_apt_get_first(monkeypatch, tmp_path, capsys):
    import paraflow.backends.horovod.build as build

    monkeypatch.setenv("PARAFLOW_WHEEL_CACHE", str(tmp_path))
    monkeypatch.setattr(build.shutil, "which", lambda tool, path=None: None)
    monkeypatch.setattr(build, "find_tool", lambda name, python=None: None)  # not even in the venv's bin
    monkeypatch.setattr(build, "probe", lambda python: {"version": None})  # as if horovod were absent
    monkeypatch.setattr(build, "build_wheel", lambda *a: pytest.fail("must not start a build"))
    assert build.build_and_install(sys.executable) == 1
    err = capsys.readouterr().err
    assert "apt-get install openmpi-bin libopenmpi-dev cmake g++" in err


@requires_horovod
def test_build_command_leaves_a_working_horovod_alone():
    result = launch_ok("python", 1, ["-m", "paraflow.cli", "build-horovod"], timeout=120)
    assert "already installed" in result.stdout

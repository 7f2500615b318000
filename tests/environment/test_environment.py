"""Launcher detection from mocked environment variables."""

import pytest

from paraflow.environment.launchers import detect_environment, expand_hostlist, launcher_variables
from paraflow.errors import LauncherError, ParaflowError

CASES = {
    "torchrun": (
        {
            "RANK": "3",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "n0",
            "MASTER_PORT": "29500",
        },
        (3, 8, 1, 2, "n0", 29500),
    ),
    "paraflow-launch": (
        {
            "PARAFLOW_RANK": "1",
            "PARAFLOW_WORLD_SIZE": "2",
            "PARAFLOW_LOCAL_RANK": "1",
            "PARAFLOW_LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "41000",
        },
        (1, 2, 1, 2, "127.0.0.1", 41000),
    ),
    "slurm": (
        {
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "6",
            "SLURM_LOCALID": "2",
            "SLURM_TASKS_PER_NODE": "3(x2)",
            "SLURM_NODEID": "1",
            "SLURM_NODELIST": "gpu[07-08]",
            "SLURM_JOB_ID": "100",
        },
        (5, 6, 2, 3, "gpu07", 15100),
    ),
    "openmpi": (
        {
            "OMPI_COMM_WORLD_RANK": "1",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        },
        (1, 4, 1, 2, None, None),
    ),
    "mpich": (
        {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"},
        (2, 3, 0, 1, None, None),
    ),
    "mvapich2": (
        {
            "MV2_COMM_WORLD_RANK": "0",
            "MV2_COMM_WORLD_SIZE": "2",
            "MV2_COMM_WORLD_LOCAL_RANK": "0",
            "MV2_COMM_WORLD_LOCAL_SIZE": "2",
        },
        (0, 2, 0, 2, None, None),
    ),
    "horovodrun": (
        {
            "HOROVOD_RANK": "1",
            "HOROVOD_SIZE": "2",
            "HOROVOD_LOCAL_RANK": "1",
            "HOROVOD_LOCAL_SIZE": "2",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1",
        },
        (1, 2, 1, 2, "10.0.0.1", None),
    ),
}


@pytest.mark.parametrize("launcher", CASES)
def test_each_launcher_is_detected(launcher):
    env, (rank, world, local_rank, local_world, addr, port) = CASES[launcher]
    info = detect_environment(env)
    assert (
        info.launcher,
        info.rank,
        info.world_size,
        info.local_rank,
        info.local_world_size,
        info.master_addr,
        info.master_port,
    ) == (launcher, rank, world, local_rank, local_world, addr, port)


def test_plain_python_is_one_process():
    info = detect_environment({})
    assert (info.launcher, info.rank, info.world_size, info.is_distributed) == ("python", 0, 1, False)


def test_torchrun_wins_over_slurm_it_runs_inside():
    env = {**CASES["slurm"][0], **CASES["torchrun"][0]}
    assert detect_environment(env).launcher == "torchrun"


def test_torchrun_started_inside_a_paraflow_launch_worker_wins():
    env = {**CASES["paraflow-launch"][0], **CASES["torchrun"][0]}
    assert detect_environment(env).launcher == "torchrun"


def test_paraflow_launch_variables_are_launcher_variables():
    assert set(launcher_variables(CASES["paraflow-launch"][0])) == set(CASES["paraflow-launch"][0])


def test_slurm_wins_over_openmpi():
    env = {**CASES["openmpi"][0], **CASES["slurm"][0]}
    assert detect_environment(env).launcher == "slurm"


def test_slurm_step_size_and_explicit_tasks_per_node():
    env = {**CASES["slurm"][0], "SLURM_STEP_NUM_TASKS": "6", "SLURM_NTASKS": "12", "SLURM_NTASKS_PER_NODE": "3"}
    info = detect_environment(env)
    assert (info.world_size, info.local_world_size) == (6, 3)


def test_half_set_torchrun_names_the_missing_variable():
    with pytest.raises(LauncherError, match="WORLD_SIZE is missing") as err:
        detect_environment({"RANK": "0", "LOCAL_RANK": "0"})
    assert "torchrun --nproc_per_node" in str(err.value)
    assert isinstance(err.value, (ParaflowError, RuntimeError))


def test_world_size_without_rank_is_refused():
    with pytest.raises(LauncherError, match="no launcher started this process"):
        detect_environment({"WORLD_SIZE": "2"})


def test_rank_outside_world_is_refused():
    with pytest.raises(LauncherError, match="inconsistent openmpi"):
        detect_environment(
            {"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
        )


def test_non_integer_rank_is_refused():
    with pytest.raises(LauncherError, match="not an integer"):
        detect_environment({"RANK": "zero", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("node1", ["node1"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("a[1-2],b5", ["a1", "a2", "b5"]),
    ],
)
def test_slurm_hostlist_expansion(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts

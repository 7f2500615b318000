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
        detect_environment({"RANK": "0", "LOCAL_RANK": "0"})  # read as torch's env:// contract
    assert "env:// environment is half-set" in str(err.value)
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


# ---------------------------------------------------------------- torch's env://, LSF, Kubeflow's MPIJob
PYTORCHJOB = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}


def test_torchs_plain_env_contract_is_a_launcher_of_its_own():
    """Kubernetes' PyTorchJob: each pod's `python train.py` gets the four variables and nothing else."""
    info = detect_environment(PYTORCHJOB)
    assert (info.launcher, info.rank, info.world_size, info.master_addr, info.master_port) == (
        "env://",
        2,
        3,
        "job-master-0",
        23456,
    )
    assert (info.local_rank, info.local_world_size) == (0, 1)
    assert "one process per host assumed" in info.note
    assert info.launched_by.sets_master and not info.is_mpi


def test_plain_env_takes_the_local_rank_when_it_is_given():
    info = detect_environment({**PYTORCHJOB, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert info.launcher == "torchrun"  # torchrun's full set: its own mark LOCAL_WORLD_SIZE
    info = detect_environment({**PYTORCHJOB, "LOCAL_RANK": "1"})
    assert (info.launcher, info.local_rank, info.local_world_size) == ("env://", 1, 3)
    assert "LOCAL_RANK" in info.note


def test_torchruns_agent_marks_it_even_without_local_world_size():
    info = detect_environment({**PYTORCHJOB, "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "abc"})
    assert (info.launcher, info.local_rank) == ("torchrun", 0)
    with pytest.raises(LauncherError, match="torchrun environment is half-set: RANK is present but LOCAL_RANK"):
        detect_environment({**PYTORCHJOB, "TORCHELASTIC_RUN_ID": "abc"})


def test_plain_env_without_master_names_both_variables():
    from paraflow.environment.rendezvous import resolve_master

    info = detect_environment({"WORLD_SIZE": "2", "RANK": "1"})
    with pytest.raises(LauncherError, match="MASTER_ADDR and MASTER_PORT are not"):
        resolve_master(info)


def test_lsf_jsrun_is_detected_with_rank_0_on_the_first_compute_host(tmp_path):
    rankfile = tmp_path / "rankfile"
    rankfile.write_text("launch1\nbatch3\nbatch3\nbatch4\n")
    env = {
        "JSM_NAMESPACE_RANK": "3",
        "JSM_NAMESPACE_SIZE": "4",
        "JSM_NAMESPACE_LOCAL_RANK": "1",
        "JSM_NAMESPACE_LOCAL_SIZE": "2",
        "LSB_DJOB_RANKFILE": str(rankfile),
        "LSB_JOBID": "4242",
    }
    info = detect_environment(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("lsf", 3, 4, 1, 2)
    assert (info.master_addr, info.master_port) == ("batch3", 10000 + 4242 % 20000)
    assert info.is_mpi


def test_lsf_look_alike_variables_are_not_a_jsrun_job():
    info = detect_environment({"LSB_JOBID": "4242", "JSM_NAMESPACE_SIZE": "4"})  # a batch shell, no task
    assert info.launcher == "python"


def test_kubeflow_mpijob_ranks_are_open_mpi_ranks():
    """Kubeflow's MPIJob: a launcher pod runs Open MPI's mpirun over the workers' hostfile."""
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_COMM_WORLD_NODE_RANK": "1",
        "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
        "OMPI_MCA_plm_rsh_agent": "/etc/mpi/kubexec.sh",
        "PMIX_NAMESPACE": "prterun-mpijob-launcher-1@1",
        "K_MPI_JOB_ROLE": "worker",
    }
    info = detect_environment(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == (
        "openmpi",
        3,
        4,
        1,
        2,
    )
    from paraflow.environment.launchers import job_key

    assert job_key(env) == "prterun-mpijob-launcher-1@1"


def test_looks_like_a_launcher_but_is_not():
    """Variables of a launcher's family without its rank: no launcher started this process."""
    for env in (
        {"MASTER_ADDR": "h", "MASTER_PORT": "1"},
        {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"},
        {"PMIX_RANK": "0"},
    ):
        assert detect_environment(env).launcher == "python", env

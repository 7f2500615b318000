"""What Open MPI's mpi_yield_when_idle is inside this rank, and what it does to horovod's latency.

Usage: mpirun -np 2 python tests/workers/mpi_yield.py [REPEATS]
Rank 0 prints one line: the variable as the process saw it before and after paraflow.init, the
value Open MPI itself reports through its tool interface (MPI_T, read with ctypes from the
loaded libmpi), the median time of a 4 KB horovod allreduce, and the median training step of a
small MLP. Run it with and without ``-x OMPI_MCA_mpi_yield_when_idle=0`` to compare.
"""

import ctypes
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import paraflow

MPI_YIELD = "OMPI_MCA_mpi_yield_when_idle"


def mca_value(name: str):
    """The MCA variable `name` as Open MPI holds it (MPI_T control variable), or None if unreadable."""
    try:
        lib = ctypes.CDLL("libmpi.so.40", mode=ctypes.RTLD_GLOBAL)
        provided, index, count = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        handle, value = ctypes.c_void_p(), ctypes.c_int()
        if lib.MPI_T_init_thread(0, ctypes.byref(provided)) != 0:
            return None
        if lib.MPI_T_cvar_get_index(name.encode(), ctypes.byref(index)) != 0:
            return None
        if lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) != 0:
            return None
        if lib.MPI_T_cvar_read(handle, ctypes.byref(value)) != 0:
            return None
        return value.value
    except OSError:
        return None


def median_ms(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(repeats: int) -> None:
    before = os.environ.get(MPI_YIELD)
    with paraflow.init("horovod", banner=False) as backend:
        after = os.environ.get(MPI_YIELD)
        seen = mca_value("mpi_yield_when_idle")
        x = torch.ones(1024)
        median_ms(lambda: backend._allreduce(x.clone(), "sum"), 20)
        allreduce = median_ms(lambda: backend._allreduce(x.clone(), "sum"), repeats)
        torch.manual_seed(0)
        model = backend.wrap_model(
            torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        )
        optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
        data, target = torch.randn(32, 64), torch.randint(0, 10, (32,))

        def step() -> None:
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()

        median_ms(step, 10)
        step_ms = median_ms(step, repeats)
        if backend.is_main:
            print(
                f"yield before init={before} after init={after} open-mpi sees={seen} "
                f"allreduce_4KB_ms={allreduce:.3f} step_ms={step_ms:.3f} threads={torch.get_num_threads()}",
                flush=True,
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)

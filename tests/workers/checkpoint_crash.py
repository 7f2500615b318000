"""Write checkpoint 1, then fail while writing checkpoint 2 over it.

Usage: python tests/workers/checkpoint_crash.py MODE PATH
MODE "kill": the process is SIGKILLed half-way through writing checkpoint 2.
MODE "full": the file-size limit (RLIMIT_FSIZE) is set between checkpoint 1's size and 2's, so the
write fails as on a full disk; the worker prints the error it got and exits 0.
"""

import os
import resource
import signal
import sys

import torch

import paraflow
import paraflow.training.checkpoint


def main(mode: str, path: str) -> None:
    with paraflow.init("single") as backend:
        backend.save(path, {"version": 1, "weights": torch.ones(256)})
        big = {"version": 2, "weights": torch.full((1 << 20,), 2.0)}  # 4 MiB
        if mode == "kill":

            def half_then_die(payload, f):
                paraflow.training.checkpoint.torch.save(payload, f)
                f.truncate(f.tell() // 2)
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)

            paraflow.training.checkpoint._serialize = half_then_die
        else:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            backend.save(path, big)
        except paraflow.CheckpointError as exc:
            print(f"save failed: {exc}")
            return
        print("save succeeded")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

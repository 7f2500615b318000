"""Exit right after a DDP backward whose hook's future has a slow callback on gloo's thread.

Usage: python tests/workers/hook_exit.py paraflow|torch PORT
The callback sleeps 0.3 s on the process group's worker thread, which then lets go of the hook's
continuation; the interpreter's shutdown meanwhile takes 2 s (an object whose __del__ sleeps).
With torch's own bf16 hook the worker thread asks for the GIL during that shutdown and the process
aborts; with paraflow's hook, exit waits for the continuation to be released first.
"""

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class SlowFinalization:
    def __del__(self):
        time.sleep(2)


def main(kind: str, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    if kind == "paraflow":
        from paraflow.backends.ddp.comm_hooks import compress_hook

        base = compress_hook(torch.bfloat16)
    else:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        def base(state, bucket):  # torch's hook under a name DDP accepts without NCCL
            return bf16_compress_hook(state, bucket)

    def hook(state, bucket):
        fut = base(state, bucket)
        fut.then(lambda _: time.sleep(0.3))  # runs on gloo's thread after fut completes
        return fut

    model.register_comm_hook(None, hook)
    model(torch.randn(3, 4)).sum().backward()
    print("backward done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    slow = SlowFinalization()  # collected while the interpreter shuts down

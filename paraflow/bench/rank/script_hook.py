"""`paraflow bench --script`: time an unmodified paraflow script from inside it.

The benchmark launches the script with PARAFLOW_BACKEND naming the cell's backend and
PARAFLOW_INIT_HOOK=paraflow.bench.rank.script_hook:install, so the script's own
``paraflow.init()`` calls :func:`install` with the started backend. From then on:

- every model the script passes through ``backend.wrap_model`` counts the samples of the
  training batches it sees (forward calls with gradients on, in training mode; the first
  dimension of the first tensor argument);
- every optimizer it passes through ``backend.wrap_optimizer`` counts its steps (a step
  post-hook): ``--warmup`` steps untimed, then, after a barrier, ``--steps`` timed ones (the
  device synchronised at each step's end);
- after the last timed step each rank writes its numbers to OUT/rank<R>.json in the form of the
  built-in loop's (step times, window, samples) and leaves with ``sys.exit(0)``: the script's
  ``with`` blocks and the backend shut down as on any exit, whatever it would have trained.

A script that ends before the window is full, or never wraps an optimizer, leaves an ``error``
in its rank file saying what to change.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path

import torch

from .factory import batch_samples
from .train_loop import device_sync, peak_memory, reset_peak_memory

__all__ = ["install", "script_env", "HOOK", "OUT", "WARMUP", "STEPS", "TASK"]

HOOK = "paraflow.bench.rank.script_hook:install"
OUT, WARMUP, STEPS, TASK = "PARAFLOW_BENCH_OUT", "PARAFLOW_BENCH_WARMUP", "PARAFLOW_BENCH_STEPS", "PARAFLOW_BENCH_TASK"


def script_env(out_dir: Path, warmup: int, steps: int, task: str) -> dict:
    """Variables that make paraflow.init in a launched script install the step counter."""
    return {
        "PARAFLOW_INIT_HOOK": HOOK,
        OUT: str(out_dir),
        WARMUP: str(max(1, warmup)),
        STEPS: str(steps),
        TASK: task,
    }


class StepCounter:
    """Counts a script's optimizer steps and training samples; times the window (module doc)."""

    def __init__(self, backend, out: Path, warmup: int, steps: int, task: str) -> None:
        from .worker import RankFile, _meta

        self.backend, self.warmup, self.steps, self.task = backend, warmup, steps, task
        self.rank_file = RankFile(out, backend.rank, {**_meta(backend), "script": True})
        self.optimizers = 0
        self.models: list = []
        self.step = 0
        self.pending = 0  # samples seen since the last optimizer step
        self.window_samples = 0
        self.step_s: list = []
        self.warmup_s: list = []
        self.start = self.last = time.perf_counter()
        reset_peak_memory(backend.device)
        self.done = False
        self.depth = 0

    # ------------------------------------------------------------------ hooks
    def saw_batch(self, module, args, kwargs) -> None:
        if module.training and torch.is_grad_enabled():
            self.pending += batch_samples(args) or batch_samples(kwargs)

    def entered(self, optimizer, args, kwargs) -> None:
        self.depth += 1

    def stepped(self, optimizer, args, kwargs) -> None:
        # An optimizer class derived from a hooked one (horovod's DistributedOptimizer) runs the
        # hooks of both steps, one inside the other: only the outermost counts.
        self.depth -= 1
        if self.depth > 0:
            return
        self.step += 1
        device_sync(self.backend.device)
        now = time.perf_counter()
        samples, self.pending = self.pending, 0
        if self.step < self.warmup:
            self.warmup_s.append(now - self.last)
            self.last = now
            return
        if self.step == self.warmup:
            self.backend.barrier()  # every rank starts the window together
            self.start = self.last = time.perf_counter()
            return
        self.step_s.append(now - self.last)
        self.last = now
        self.window_samples += samples
        if self.step == self.warmup + self.steps:
            self.finish(now - self.start)

    # ------------------------------------------------------------------ results
    def finish(self, window_s: float) -> None:
        self.done = True
        if not self.window_samples:
            self.rank_file.data["error"] = (
                "the script's model saw no training batch during the timed steps: pass it through "
                "backend.wrap_model(model), where the benchmark counts samples, and train it in training mode"
            )
            self.rank_file.write()
        else:
            self.rank_file.add(self.task, self.result(window_s))
        self.backend.barrier()  # no rank leaves while another still writes
        sys.exit(0)

    def result(self, window_s: float) -> dict:
        from .factory import model_facts

        module = self.backend.unwrap(self.models[0])  # a sample was counted, so a model was wrapped
        per_step = self.window_samples / self.steps
        device = self.backend.device
        return {
            "model": Path(self.task.split("::", 1)[-1]).name,
            "model_spec": self.task.split("/", 1)[-1],
            **model_facts(module),
            "batch_per_rank": round(per_step, 2),
            "samples_per_step": per_step,
            "window_samples": self.window_samples,
            "replicas": getattr(self.backend, "replicas", 1),
            "scaling": "weak",
            "warmup": self.warmup,
            "warmup_settled": None,
            "warmup_s": self.warmup_s,
            "steps": self.steps,
            "step_s": self.step_s,
            "window_s": window_s,
            "losses": [],
            **peak_memory(device),
        }

    def at_exit(self) -> None:
        """The script ended on its own: say why the window is missing."""
        if self.done:
            return
        need = f"--warmup {self.warmup} + --steps {self.steps} = {self.warmup + self.steps} optimizer steps"
        if not self.optimizers:
            error = (
                "the script never called backend.wrap_optimizer(optimizer, model), where the benchmark counts "
                "optimizer steps: wrap its optimizer that way"
            )
        else:
            error = (
                f"the script ended after {self.step} optimizer step(s), before the timed window was full ({need}): "
                "let it train longer (more epochs or data), or lower --warmup and --steps"
            )
        self.rank_file.data["error"] = error
        self.rank_file.write()


def install(backend) -> StepCounter:
    """Called by paraflow.init (PARAFLOW_INIT_HOOK): count `backend`'s wrapped models' samples and
    wrapped optimizers' steps, and end the script once the timed window is full."""
    counter = StepCounter(
        backend,
        Path(os.environ[OUT]),
        int(os.environ.get(WARMUP, "5")),
        int(os.environ.get(STEPS, "20")),
        os.environ.get(TASK, "train/script"),
    )
    wrap_model, wrap_optimizer = backend.wrap_model, backend.wrap_optimizer

    def counting_model(model, *args, **kwargs):
        wrapped = wrap_model(model, *args, **kwargs)
        wrapped.register_forward_pre_hook(counter.saw_batch, with_kwargs=True)
        counter.models.append(wrapped)
        return wrapped

    def counting_optimizer(optimizer, *args, **kwargs):
        wrapped = wrap_optimizer(optimizer, *args, **kwargs)
        wrapped.register_step_pre_hook(counter.entered)
        wrapped.register_step_post_hook(counter.stepped)
        counter.optimizers += 1
        return wrapped

    backend.wrap_model, backend.wrap_optimizer = counting_model, counting_optimizer
    _count_horovod_api(counter)
    atexit.register(counter.at_exit)
    return counter


def _count_horovod_api(counter: StepCounter) -> None:
    """A script in Horovod's idiom (``--horovod-api``) wraps no model: count the steps of its
    ``hvd.DistributedOptimizer`` and the samples of the outermost forward calls of a module that
    owns the optimizer's parameters."""
    from ...compat.horovod import runtime as horovod_api

    trained: set = set()  # ids of the DistributedOptimizers' parameters
    owners: dict = {}  # id(module) -> whether it owns one of them
    depth = [0]

    def optimizer_made(optimizer) -> None:
        optimizer.register_step_pre_hook(counter.entered)
        optimizer.register_step_post_hook(counter.stepped)
        counter.optimizers += 1
        if not trained:  # every module's forward is watched from the first one on, in these scripts only
            torch.nn.modules.module.register_module_forward_pre_hook(before)
            torch.nn.modules.module.register_module_forward_hook(after, always_call=True)
        trained.update(id(p) for group in optimizer.param_groups for p in group["params"])
        owners.clear()

    def before(module, args) -> None:
        depth[0] += 1
        if depth[0] > 1:
            return
        if id(module) not in owners:
            owners[id(module)] = any(id(p) in trained for p in module.parameters())
        if owners[id(module)]:
            if module not in counter.models:
                counter.models.append(module)
            counter.saw_batch(module, args, {})

    def after(module, args, output) -> None:
        depth[0] -= 1

    horovod_api.watch_optimizers(optimizer_made)

"""The fault campaign: seeded random faults in real jobs, each judged on five points.

An injection is one job of 2 ranks (tests/reliability/workers/campaign.py, ``PARAFLOW_TIMEOUT=20``,
one thread per rank) in one *cell*, a backend under a launcher: ddp-gloo under torchrun and
mpirun, horovod under mpirun and horovodrun, fsdp under torchrun. One rank (0 or 1) injects one
*fault*: SIGKILL, SIGSTOP, an exception, ``sys.exit(3)``, ``os._exit(0)``, a collective with another
shape than the other rank's, or a collective it leaves out; in one *phase*: start-up, the middle
of a step, inside a checkpoint save, or after the last step; at a step (see the worker's doc).
Or no fault at all (``none``): a clean run, which must exit 0.
The injections are drawn with ``random.Random(seed)``: cell x fault x phase x faulty rank x step.

``make soak`` runs ``test_fault_campaign``: ``PARAFLOW_CAMPAIGN_COUNT`` injections (default 100)
drawn with ``PARAFLOW_CAMPAIGN_SEED`` (default 38); each is one test, its id the injection.
``PARAFLOW_CAMPAIGN_RECORD=FILE`` appends one JSON line per injection to FILE (its judgements).
``test_fault_campaign_sample`` (marker ``campaign``, run by .ci/run) is five fixed injections, one
per cell. Each cell's fault-free run is made once per session: its checkpoints and final
parameters are what the injections are compared with.

Each injection is judged on every point, and fails with one line per point that does not hold
(a clean run, on (a') in place of (a) and (b), and on (c), (d) and (e)):

(a) *ends*: the launcher exits non-zero within 60 s of the fault (the time the faulty rank
    printed right before it struck). The test kills the job 75 s after the fault at the latest.
(b) *names the faulty rank R*: paraflow's own output (stdout and stderr of the job, launcher
    prefixes such as ``[1]<stderr>:`` allowed), not the launcher's summary nor the worker's own
    exception, holds one of:

    - an exception of paraflow's (a line ``paraflow.errors.<Name>: <message>``) whose message
      mentions ``rank R`` (or R in a list of ranks) once the speaking rank's own ``on rank N [of W]``
      and a broadcast's ``from rank N`` are taken out;
    - a ``paraflow:`` line (paraflow's last words) mentioning ``rank R``, once a leading speaker
      ``paraflow: rank N:`` is taken out (``paraflow: rank 1 of 2 left the job ...`` names rank 1);
      when more than one rank says it left the job, none of those lines counts: they do not single
      out the rank at fault;
    - a ``paraflow stall:`` report whose rank lines (the indented ``rank R: ...`` lines right after
      its header) do not put every rank in one group, and one of them is R's (``rank R: in ...``,
      ``rank R: no record``).

    Naming other ranks as well does not fail the point.
(a') *a clean run exits 0*: the launcher exits 0 within the run's bound, and no rank aborted (a
    C++ ``terminate``, a fatal signal or Python's fatal error in its output) on the way out.
(c) *no process left*: once the launcher has exited, no process of the job (found by a marker in
    its environment, tests/reliability/leftovers.py) is alive 5 s later. A rank stopped by SIGSTOP
    counts only when the launcher left it; the test kills every process it finds either way.
    Not judged when the test had to kill the job.
(d) *checkpoint old-or-new*: DIR/checkpoint, read by paraflow's read path (the CRC-checked file
    reader, or the sharded reader for fsdp's directories), loads and equals, entry for entry and bit
    for bit, one save of the fault-free run: the one of the step it records, no older than the last
    save that finished before the fault. No checkpoint at all holds only when no save finished
    before the fault.
(e) *exit 0 means the right parameters*: a job that exits 0 has every rank's final parameters
    equal, bit for bit, to the fault-free run's.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import RANK_ENV, ROOT, requires_horovod
from faultkit import FAULT_WORKERS, STARTUP_S, events, process_state
from leftovers import MARKER_ENV, kill_processes, leftover_processes

from paraflow.tools.launch import kill_tree, launch_command, start_group

NPROC = 2
TIMEOUT_S = 20
STEPS, SAVE_STEPS = 6, (2, 4, 6)
ENDS_WITHIN_S = 60
#: The test ends a job still running this long after the fault.
KILL_AFTER_S = ENDS_WITHIN_S + 15
#: The longest a job may run before its fault (or, fault-free, at all): start-up and six short steps.
RUN_S = STARTUP_S + 120
LEFTOVER_GRACE_S = 5.0

CELLS = (
    ("ddp-gloo", "torchrun"),
    ("ddp-gloo", "mpirun"),
    ("horovod", "mpirun"),
    ("horovod", "horovodrun"),
    ("fsdp", "torchrun"),
)
FAULTS = ("sigkill", "sigstop", "raise", "exit3", "exit0", "shape", "skip", "none")
PHASES = ("start-up", "mid-step", "save", "after-last-step")
SEED = int(os.environ.get("PARAFLOW_CAMPAIGN_SEED", "38"))
COUNT = int(os.environ.get("PARAFLOW_CAMPAIGN_COUNT", "100"))


@dataclass(frozen=True)
class Injection:
    """One fault: `rank` does `fault` in `phase` (at `step`) of a job of `backend` under `launcher`."""

    backend: str
    launcher: str
    fault: str
    phase: str
    rank: int
    step: int

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.launcher}-{self.fault}-{self.phase}-rank{self.rank}-step{self.step}"

    @property
    def finished_saves(self) -> list[int]:
        """The save steps every rank had left behind when the fault struck."""
        if self.phase == "start-up":
            return []
        if self.phase in ("after-last-step", "none"):
            return list(SAVE_STEPS)
        return [s for s in SAVE_STEPS if s < self.step]


def draw(seed: int, count: int) -> list[Injection]:
    """`count` injections drawn with `random.Random(seed)` (the same list for the same seed)."""
    rng = random.Random(seed)
    drawn = []
    for _ in range(count):
        backend, launcher = rng.choice(CELLS)
        fault, phase, rank = rng.choice(FAULTS), rng.choice(PHASES), rng.randrange(NPROC)
        mid, saving = rng.randint(1, STEPS), rng.choice(SAVE_STEPS)
        step = {"start-up": 0, "mid-step": mid, "save": saving, "after-last-step": STEPS}[phase]
        if fault == "none":  # a clean run: the reference's own arguments
            phase, rank, step = "none", -1, 0
        drawn.append(Injection(backend, launcher, fault, phase, rank, step))
    return drawn


def param(injection: Injection, index: int | None = None, marks=()):
    marks = [*marks, *([requires_horovod] if injection.backend == "horovod" else [])]
    name = injection.id if index is None else f"{index:03d}-{injection.id}"
    return pytest.param(injection, id=name, marks=marks)


# ---------------------------------------------------------------------------- one job
@dataclass
class Job:
    """What one launch did and left."""

    returncode: int | None
    output: str
    fault: dict | None
    ended: float
    killed_by_test: bool
    leftovers: dict
    directory: Path


def run_job(backend: str, launcher: str, directory: Path, fault: str, phase: str, rank: int, step: int) -> Job:
    """Launch the worker, wait for the launcher to exit (or kill it past the bounds), then find and kill
    what it left behind."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    env = {**RANK_ENV, "PARAFLOW_TIMEOUT": str(TIMEOUT_S), MARKER_ENV: marker, "TMPDIR": str(directory)}
    script = [str(FAULT_WORKERS / "campaign.py"), backend, str(directory), fault, phase, str(rank), str(step)]
    command = launch_command(launcher, NPROC, script, env_keys=list(env))
    out_path, err_path = directory / "stdout.txt", directory / "stderr.txt"
    started = time.time()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = start_group(command, env, str(ROOT), stdout=out, stderr=err)
    seen, killed = None, False
    try:
        while proc.poll() is None:
            if seen is None:
                seen = _fault_event(out_path)
            limit = seen["time"] + KILL_AFTER_S if seen else started + RUN_S
            if time.time() > limit:
                killed = True
                kill_tree(proc.pid)
                proc.wait()
                break
            time.sleep(0.2)
        ended = time.time()
    except BaseException:
        kill_tree(proc.pid)
        raise
    finally:
        left = {} if killed else leftover_processes(marker, grace_s=LEFTOVER_GRACE_S)
        left = {pid: f"{command} (state {process_state(pid) or 'gone'})" for pid, command in left.items()}
        _kill_everything(marker)
    output = out_path.read_text(errors="replace") + "\n" + err_path.read_text(errors="replace")
    return Job(proc.returncode, output, seen or _fault_event(out_path), ended, killed, left, directory)


def _fault_event(path: Path) -> dict | None:
    found = [e for e in events(path.read_text(errors="replace")) if e.get("fault")]
    return found[0] if found else None


def _kill_everything(marker: str) -> None:
    """SIGKILL (after SIGCONT, for a stopped rank) every process carrying `marker`, until none is left."""
    for _ in range(10):
        left = leftover_processes(marker, grace_s=0)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        kill_processes(left)
        time.sleep(0.2)


# ---------------------------------------------------------------------------- reading results
def read_checkpoint(path: Path) -> dict:
    """`path` through paraflow's read path (a file, or fsdp's directory of shards), on the CPU."""
    from paraflow.training.checkpoint_reader import read_checkpoint as read_file
    from paraflow.training.checkpoint_sharded import read_sharded_checkpoint

    reader = read_sharded_checkpoint if path.is_dir() else read_file
    return reader(str(path), torch.device("cpu"), 0, True)


def differences(a, b, where: str = "") -> list[str]:
    """Where `a` and `b` differ, bit for bit (tensors by dtype, shape and bytes)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [where or "."]
        if a.dtype != b.dtype or a.shape != b.shape:
            return [where or "."]
        same = torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)) if a.numel() else True
        return [] if same else [where or "."]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}{{keys}}"]
        return [d for key in a for d in differences(a[key], b[key], f"{where}.{key}" if where else str(key))]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}[len]"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [where or "."]


@dataclass
class Reference:
    """A cell's fault-free run: its saves (step -> checkpoint as read) and each rank's final parameters."""

    saves: dict
    finals: list


_references: dict = {}


def reference(backend: str, launcher: str, root: Path) -> Reference:
    """The cell's fault-free run, made on first use in this session."""
    key = (backend, launcher)
    if key not in _references:
        job = run_job(backend, launcher, root / f"reference-{backend}-{launcher}", "none", "none", -1, 0)
        if job.returncode != 0 or job.killed_by_test or job.leftovers:
            pytest.fail(f"the fault-free run of {backend} under {launcher} failed:\n{job.output[-5000:]}")
        saves = {s: read_checkpoint(job.directory / "saves" / f"step-{s}") for s in SAVE_STEPS}
        finals = [torch.load(job.directory / f"final-rank{r}.pt") for r in range(NPROC)]
        _references[key] = Reference(saves, finals)
    return _references[key]


# ---------------------------------------------------------------------------- the judgements
#: What launchers put before a rank's line: horovodrun's ``[1]<stderr>:``, torchrun's ``[rank1]: ``.
_LAUNCHER_PREFIX = re.compile(r"^(?:\[\d+(?:,\d+)?\]<std(?:out|err)>:|\[rank\d+\]: ?)")
_ERROR = re.compile(r"^\s*paraflow\.errors\.\w+: (.*)$")
_LAST_WORDS = re.compile(r"^paraflow: (.*)$")
_REPORT_RANKS = re.compile(r"^  ranks? (\d+(?:, \d+)*): ")
_LEFT = re.compile(r"^rank (\d+) of \d+ left the job\b")
#: How a line names the rank that speaks (or a broadcast's source), which is not naming a rank at fault.
_SPEAKER = re.compile(r"\b(?:on|from) rank \d+(?: of \d+)?\b|^rank \d+: ")


def mentions(text: str, rank: int) -> bool:
    """Whether `text` names `rank`: "rank R", "ranks 0, R", "rank(s) [0, R]"."""
    for match in re.finditer(r"\branks?(?:\(s\))? \[?(\d+(?:, \d+)*)", text):
        if str(rank) in match.group(1).split(", "):
            return True
    return False


def paraflow_lines(output: str) -> tuple[list[str], list[str], list[list[str]]]:
    """paraflow's own lines in `output`: error messages, ``paraflow:`` lines, stall reports (as lines)."""
    errors, words, reports = [], [], []
    report = None  # the stall report whose indented lines are being read
    for raw in output.splitlines():
        line = _LAUNCHER_PREFIX.sub("", raw)
        if report is not None and line.startswith("  "):
            if _REPORT_RANKS.match(line):
                report.append(line)
            continue
        report = None
        if line.startswith("paraflow stall:"):
            report = [line]
            reports.append(report)
        elif _ERROR.match(line):
            errors.append(_ERROR.match(line).group(1))
        elif _LAST_WORDS.match(line):
            words.append(_LAST_WORDS.match(line).group(1))
    return errors, words, reports


def naming_lines(output: str, rank: int) -> list[str]:
    """paraflow's lines in `output` that name `rank` as (b) counts them (see the module doc)."""
    errors, words, reports = paraflow_lines(output)
    if len({m.group(1) for m in map(_LEFT.match, words) if m}) > 1:
        words = [w for w in words if not _LEFT.match(w)]
    found = [m for m in errors + words if mentions(_SPEAKER.sub("", m), rank)]
    for report in reports:
        groups = [_REPORT_RANKS.match(line).group(1).split(", ") for line in report[1:]]
        if len(groups) > 1 and any(str(rank) in group for group in groups):
            found.append(" ".join(report))
    return found


def summary(output: str) -> str:
    """paraflow's lines in `output`, shortened, for a failure message."""
    errors, words, reports = paraflow_lines(output)
    lines = [*errors, *("paraflow: " + w for w in words), *(" / ".join(r) for r in reports)]
    return " | ".join(" ".join(line.split())[:300] for line in lines) or "none"


def judge(injection: Injection, job: Job, ref: Reference) -> list[str]:
    """Every point of (a)-(e) that does not hold, one line each."""
    failed = []
    fault = job.fault
    if injection.fault == "none":
        failed += judge_clean_run(job)
    elif job.killed_by_test:
        failed.append(f"(a) the job was still running {KILL_AFTER_S} s after the fault; the test killed it")
    elif job.returncode == 0:
        failed.append("(a) the job exited 0 although a rank injected a fault")
    elif job.ended - fault["time"] > ENDS_WITHIN_S:
        failed.append(f"(a) the job ended {job.ended - fault['time']:.0f} s after the fault (bound {ENDS_WITHIN_S} s)")
    if injection.fault != "none" and not naming_lines(job.output, injection.rank):
        failed.append(f"(b) paraflow's output does not name rank {injection.rank}; its lines: {summary(job.output)}")
    if job.leftovers:
        failed.append(f"(c) processes of the job outlived the launcher: {job.leftovers}")
    failed += judge_checkpoint(injection, job.directory / "checkpoint", ref)
    if job.returncode == 0:
        for rank in range(NPROC):
            path = job.directory / f"final-rank{rank}.pt"
            if not path.exists():
                failed.append(f"(e) the job exited 0 but rank {rank} wrote no final parameters")
                continue
            differ = differences(torch.load(path), ref.finals[rank])
            if differ:
                failed.append(
                    f"(e) the job exited 0 with rank {rank}'s parameters other than the fault-free run's: "
                    f"{', '.join(differ[:6])}"
                )
    return failed


#: What a rank that aborted on its way out leaves in the job's output.
ABORTED = ("terminate called", "Fatal Python error", "SIGABRT", "SIGSEGV", "Signal 6", "core dumped")


def judge_clean_run(job: Job) -> list[str]:
    """(a'): a run with no fault ended by itself, exited 0, and no rank aborted on the way out."""
    if job.killed_by_test:
        return [f"(a') the clean run was still running {RUN_S} s after it started; the test killed it"]
    failed = []
    if job.returncode != 0:
        failed.append(f"(a') the clean run exited {job.returncode}")
    aborted = [word for word in ABORTED if word in job.output]
    if aborted:
        failed.append(f"(a') a rank of the clean run aborted on its way out: {', '.join(aborted)} in its output")
    return failed


def judge_checkpoint(injection: Injection, path: Path, ref: Reference) -> list[str]:
    finished = injection.finished_saves
    committed = path.is_file() or (path / "current").is_file()
    if not committed:
        if finished:
            return [
                f"(d) no checkpoint at {path.name} although the save of step {finished[-1]} finished before the fault"
            ]
        return []
    try:
        saved = read_checkpoint(path)
    except Exception as exc:  # noqa: BLE001 - the finding
        return [f"(d) the last checkpoint does not load: {type(exc).__name__}: {exc}"]
    step = saved.get("state", {}).get("step")
    if step not in ref.saves:
        return [f"(d) the last checkpoint records step {step!r}, which no save of the fault-free run has"]
    problems = []
    if finished and step < finished[-1]:
        problems.append(
            f"(d) the last checkpoint holds step {step}, older than the save of step {finished[-1]} "
            "that finished before the fault"
        )
    differ = differences(
        {"state": saved["state"], "rng": saved["rng"]}, {k: ref.saves[step][k] for k in ("state", "rng")}
    )
    if differ:
        others = [s for s, r in ref.saves.items() if not differences(saved["state"], r["state"])]
        problems.append(
            f"(d) the last checkpoint (step {step}) is not that save of the fault-free run: "
            f"{', '.join(differ[:6])} differ; it equals the saves of steps {others or 'none'}"
        )
    return problems


def run_injection(injection: Injection, root: Path) -> None:
    ref = reference(injection.backend, injection.launcher, root)
    directory = root / injection.id
    shutil.rmtree(directory, ignore_errors=True)
    inj = injection
    job = run_job(inj.backend, inj.launcher, directory, inj.fault, inj.phase, inj.rank, inj.step)
    if job.fault is None and inj.fault != "none":
        pytest.fail(f"the fault never struck (a fault of the harness):\n{job.output[-5000:]}")
    failed = judge(injection, job, ref)
    record = os.environ.get("PARAFLOW_CAMPAIGN_RECORD")
    if record:
        named = [" ".join(line.split())[:300] for line in naming_lines(job.output, injection.rank)]
        fields = {"injection": injection.id, **injection.__dict__, "returncode": job.returncode}
        ended_after = None if job.fault is None else round(job.ended - job.fault["time"], 1)
        fields.update(ended_after_s=ended_after, failed=failed, named_by=named)
        with open(record, "a") as f:
            f.write(json.dumps(fields) + "\n")
    report = [f"injection {injection.id}:", *failed, "--- the job's output (end):", job.output[-6000:]]
    assert not failed, "\n".join(report)


@pytest.fixture(scope="module")
def campaign_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("campaign")


@pytest.mark.soak
@pytest.mark.timeout(RUN_S + KILL_AFTER_S + 2 * 200)
@pytest.mark.parametrize("injection", [param(inj, i) for i, inj in enumerate(draw(SEED, COUNT))])
def test_fault_campaign(injection, campaign_root):
    run_injection(injection, campaign_root)


#: One injection per cell, chosen among those every check passes on, and a clean run: .ci/run's sample.
SAMPLE = (
    Injection("ddp-gloo", "torchrun", "skip", "after-last-step", 1, STEPS),
    Injection("ddp-gloo", "mpirun", "sigstop", "save", 1, 2),
    Injection("horovod", "mpirun", "exit3", "mid-step", 1, 3),
    Injection("horovod", "horovodrun", "exit3", "start-up", 0, 0),
    Injection("fsdp", "torchrun", "skip", "save", 0, 4),
    Injection("ddp-gloo", "torchrun", "none", "none", -1, 0),
)


@pytest.mark.campaign
@pytest.mark.timeout(RUN_S + KILL_AFTER_S + 2 * 200)
@pytest.mark.parametrize("injection", [param(inj) for inj in SAMPLE])
def test_fault_campaign_sample(injection, campaign_root):
    run_injection(injection, campaign_root)


# ---------------------------------------------------------------------------- the judges themselves
_TIMEOUT_LINE = (
    "paraflow.errors.CollectiveTimeoutError: allreduce on rank 0 of 2 (backend ddp-gloo) did not complete: "
    "rank 1 did not join it within the timeout of 20 s"
)
_STALL = [
    "paraflow stall: seen from rank 0 of 2: a rank has waited 10 s (threshold 10 s). Each rank:",
    "  rank 0: in save at campaign.py:181, waiting 10 s (step 4)",
    "  rank 1: no record",
    "  likely cause: rank 1 sent no record within 8 s: stopped (SIGSTOP, a debugger), crashed or exited",
]


@pytest.mark.parametrize(
    "output, named",
    [
        (_TIMEOUT_LINE, [1]),
        ("Traceback (most recent call last):\n  ...\n" + _TIMEOUT_LINE, [1]),
        ("\n".join(_STALL), [0, 1]),
        ("\n".join(f"[0]<stderr>:{line}" for line in _STALL), [0, 1]),
        ("paraflow stall: seen from rank 1 of 2: a rank has waited 10 s. Each rank:\n  ranks 0, 1: in allreduce", []),
        ("paraflow: rank 1 of 2 left the job with exit status 3 (sys.exit out of paraflow.init).", [1]),
        ("paraflow: rank 1 of 2 left the job on an uncaught InjectedFailure: injected failure on rank 1.", [1]),
        (
            "paraflow: rank 0 of 2 left the job on an uncaught CollectiveError: shapes differ.\n"
            "paraflow: rank 1 of 2 left the job on an uncaught CollectiveError: shapes differ.",
            [],
        ),
        ("paraflow: rank 0: horovod's wait cannot be interrupted and outlived the timeout, so this process ends", []),
        ("paraflow.errors.CheckpointError: could not read checkpoint ckpt on rank(s) [0, 1]: damaged", [0, 1]),
        ("paraflow.errors.CollectiveError: allreduce on rank 1 of 2: the connection to rank 0 was lost", [0]),
        ("__main__.InjectedFailure: injected failure on rank 1\n  rank       : 1 (local_rank: 1)", []),
        ('EVENT {"message": "allreduce on rank 0 of 2: rank 1 did not join"}', []),
        ("paraflow: ddp-gloo over gloo, 2 processes, launcher torchrun, cpu, 1 thread each", []),
        ("[rank0]: " + _TIMEOUT_LINE, [1]),
        ("paraflow.errors.CollectiveError: horovod broadcast from rank 0 of a tensor failed on rank 0: Mismatched", []),
        (_STALL[0] + "\n  ranks 0, 1: in allreduce\nother output\n  rank       : 1 (local_rank: 1)", []),
    ],
    ids=[
        "timeout-error",
        "timeout-error-in-a-traceback",
        "stall-report-with-a-silent-rank",
        "stall-report-under-horovodrun",
        "stall-report-with-every-rank-in-one-place",
        "last-words-of-a-leaving-rank",
        "last-words-of-a-rank-raising",
        "every-rank-leaving-singles-out-none",
        "last-words-of-the-speaker-only",
        "checkpoint-error-listing-ranks",
        "lost-connection-names-the-other-rank",
        "the-scripts-exception-and-torchruns-summary",
        "the-workers-event-line",
        "the-banner",
        "torchruns-rank-prefix",
        "a-broadcasts-source-and-the-speaker",
        "a-report-ends-at-the-first-line-not-indented",
    ],
)
def test_what_counts_as_paraflow_naming_a_rank(output, named):
    assert [rank for rank in range(NPROC) if naming_lines(output, rank)] == named


def test_differences_are_bit_for_bit():
    assert differences({"w": torch.tensor([0.0, 1.0])}, {"w": torch.tensor([0.0, 1.0])}) == []
    assert differences({"w": torch.tensor([0.0, 1.0])}, {"w": torch.tensor([-0.0, 1.0])}) == ["w"]
    assert differences({"w": torch.tensor([1.0])}, {"w": torch.tensor([1.0], dtype=torch.float64)}) == ["w"]
    assert differences({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}) == ["a[1].b"]


def _checkpoint(step: int, weight: float) -> dict:
    from paraflow.training.checkpoint_reader import capture_rng_state

    torch.manual_seed(step)
    return {
        "paraflow": {"format": 2, "backend": "ddp-gloo", "world_size": NPROC},
        "state": {"model": {"w": torch.full((3,), weight)}, "step": step},
        "rng": [capture_rng_state(torch.device("cpu"))],
    }


def test_a_checkpoint_is_judged_old_or_new(tmp_path):
    saves = {s: _checkpoint(s, float(s)) for s in SAVE_STEPS}
    ref = Reference(saves={s: {k: v for k, v in c.items() if k != "paraflow"} for s, c in saves.items()}, finals=[])
    path = tmp_path / "checkpoint"
    in_save_4 = Injection("ddp-gloo", "torchrun", "sigkill", "save", 0, 4)
    mid_step_5 = Injection("ddp-gloo", "torchrun", "sigkill", "mid-step", 0, 5)
    at_start = Injection("ddp-gloo", "torchrun", "sigkill", "start-up", 0, 0)

    assert judge_checkpoint(at_start, path, ref) == []
    assert "although the save of step 2 finished" in judge_checkpoint(in_save_4, path, ref)[0]
    for step in (2, 4):
        torch.save(saves[step], path)
        assert judge_checkpoint(in_save_4, path, ref) == []
    torch.save(saves[2], path)
    assert "older than the save of step 4" in judge_checkpoint(mid_step_5, path, ref)[0]
    mixed = {**saves[4], "state": {**saves[4]["state"], "model": saves[2]["state"]["model"]}}
    torch.save(mixed, path)
    (problem,) = judge_checkpoint(in_save_4, path, ref)
    assert "is not that save" in problem and "state.model.w" in problem, problem
    path.write_bytes(b"PK\x03\x04 truncated")
    assert "does not load" in judge_checkpoint(in_save_4, path, ref)[0]


def test_a_clean_run_that_aborts_on_its_way_out_fails():
    def job(returncode, output, killed=False):
        return Job(returncode, output, None, 0.0, killed, {}, Path("."))

    assert judge_clean_run(job(0, "rank 0 done\nrank 1 done")) == []
    (aborted,) = judge_clean_run(job(0, "done\nterminate called without an active exception"))
    assert "aborted on its way out: terminate called" in aborted
    assert judge_clean_run(job(1, "Signal 6 (SIGABRT) received"))[0] == "(a') the clean run exited 1"
    assert "the test killed it" in judge_clean_run(job(None, "", killed=True))[0]
    clean = [i for i in draw(SEED, COUNT) if i.fault == "none"]
    assert clean, "the campaign draws no clean run"
    assert {(i.phase, i.rank, i.step) for i in clean} == {("none", -1, 0)}

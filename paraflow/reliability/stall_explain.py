"""Turn every rank's stall record into the report: who waits on what, and the likely fix.

A record (written by :mod:`paraflow.reliability.stall`) holds a rank's phase (``call``: a paraflow
call, ``forward``, ``backward``, ``optimizer.step`` or ``idle`` with the phase it left in
``after``), its call site, step, seconds in that phase, whether that phase waits on other ranks,
and how many data passes of paraflow's sampler it has begun.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["compose_report", "likely_causes", "COLLECTIVE_CALLS"]

#: Paraflow calls every rank must make together.
COLLECTIVE_CALLS = ("allreduce", "broadcast", "allgather", "barrier", "save", "load", "export")
_TRAINING = ("forward", "backward", "optimizer.step", "idle")


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _doing(record: dict) -> str:
    call, site, seconds = record["call"], record["site"], record["for"]
    if call == "idle":
        return f"running its own code for {seconds:.0f} s, since {record['after']} returned (last paraflow line {site})"
    if call == "backward":
        what = f"in backward or the optimizer step after the forward at {site}"
    else:
        what = f"in {record.get('detail') or f'{call} at {site}'}"
    return what + (f", waiting {seconds:.0f} s" if record["waits"] else f" for {seconds:.0f} s")


def _short(record: dict) -> str:
    if record["call"] == "idle":
        what = f"own code after {record['after']}"
    else:
        what = record.get("detail") or f"{record['call']} at {record['site']}"
    return f"{what}, step {record['step']}"


def _line(ranks: list[int], record: dict) -> str:
    return f"  {_ranks(ranks)}: {_doing(record)} (step {record['step']})"


def likely_causes(records: dict[int, dict], world_size: int, window: float) -> list[str]:
    """The likely explanations of a stall, most specific first.

    Args:
        records: rank -> its record, for the ranks that answered.
        world_size: number of ranks in the job.
        window: seconds the ranks had to answer.
    """
    causes = []
    missing = [r for r in range(world_size) if r not in records]
    if missing:
        causes.append(
            f"{_ranks(missing)} sent no record within {window:.0f} s: stopped (SIGSTOP, a debugger), crashed or "
            "exited, or stuck in native code that holds the Python GIL; its own output or the launcher's says which."
        )
    if _different_collectives(records):
        causes.append(
            "the ranks wait in different collectives ("
            + "; ".join(f"rank {r}: {rec['detail']}" for r, rec in sorted(records.items()))
            + "): every rank must make the same collectives in the same order, with tensors of the same shape "
            "and dtype and the same op or source. A loop over uneven shards (an evaluation where one rank has "
            "more batches) does this: give every rank the same number of batches, or reduce once after the loop. "
            "PARAFLOW_DEBUG=1 (or paraflow.init(check_collectives=True)) makes it an error at the call."
        )
        return causes
    for call in COLLECTIVE_CALLS:
        inside = sorted(r for r, rec in records.items() if rec["call"] == call)
        outside = sorted(r for r, rec in records.items() if rec["call"] != call)
        if inside and outside:
            causes.append(_collective_cause(call, inside, outside, records))
    idle = sorted(r for r, rec in records.items() if rec["call"] == "idle")
    if not causes and idle and len(idle) < len(records):
        causes.append(
            f"{_ranks(idle)} {'is' if len(idle) == 1 else 'are'} in the script's own code, in no paraflow call or "
            f"training step, while the others wait: either work only some ranks do (an evaluation, logging or a "
            f"torch.save under `if rank == 0:`: make it short, or have every rank take part), or "
            f"{'it has' if len(idle) == 1 else 'they have'} left the training loop early. " + _UNEVEN_FIX
        )
    if not causes and len({rec["step"] for rec in records.values()}) > 1:
        steps = ", ".join(f"rank {r} at step {rec['step']}" for r, rec in sorted(records.items()))
        causes.append(
            f"the ranks are at different training steps ({steps}): they ran different numbers of batches. "
            + _UNEVEN_FIX
        )
    if not causes:
        causes.append(
            "every rank is in the same phase at the same step: one is slow inside it (I/O, a long computation) or "
            "the network is stuck. If the wait is legitimate, raise the threshold (stall_threshold=SECONDS, "
            "PARAFLOW_STALL_THRESHOLD) or the timeout (timeout=SECONDS, PARAFLOW_TIMEOUT)."
        )
    return causes


def _different_collectives(records: dict[int, dict]) -> bool:
    """True when every rank is inside a public collective but not all in the same one."""
    details = {rec.get("detail") for rec in records.values()}
    return len(details) > 1 and all(details) and len({_call_only(d) for d in details}) > 1


def _call_only(detail: str) -> str:
    """A collective's description without its call site: ranks calling from different lines is fine."""
    return detail.rpartition(" at ")[0]


_UNEVEN_FIX = (
    "Uneven batch counts per epoch: train the epoch under `with backend.join(model, optimizer):`, or give every "
    "rank the same number of batches (backend.distributed_sampler(..., drop_last=True))."
)


def _collective_cause(call: str, inside: list[int], outside: list[int], records: dict[int, dict]) -> str:
    site = records[inside[0]]["site"]
    writes = " (it writes from rank 0 alone)" if call == "save" else ""
    elsewhere = "; ".join(f"rank {r}: {_short(records[r])}" for r in outside[:4]) + (
        "; ..." if len(outside) > 4 else ""
    )
    text = (
        f"{call} is collective: every rank must call it{writes}. {_ranks(inside)} called it at {site}; "
        f"{_ranks(outside)} did not and went on ({elsewhere}). A call under `if rank == 0:` (or any branch only "
        f"some ranks take) waits for ranks that never come: call it on every rank."
    )
    ahead = all(records[r]["passes"] > max(records[i]["passes"] for i in inside) for r in outside)
    training = all(records[r]["call"] in _TRAINING for r in outside)
    if training and not ahead:
        text += f" Or {_ranks(inside)} ran out of batches first. " + _UNEVEN_FIX
    return text


def compose_report(
    *, rank: int, world_size: int, records: dict[int, dict], threshold: float, timeout: float, window: float
) -> str:
    """The report one rank prints: a header, one line per group of ranks doing the same, the causes."""
    groups: dict[tuple, list[int]] = {}
    for r, rec in sorted(records.items()):
        groups.setdefault((rec["call"], rec["site"], rec["step"], rec["after"], rec["waits"]), []).append(r)
    longest: Optional[float] = max((rec["for"] for rec in records.values() if rec["waits"]), default=None)
    waited = f"a rank has waited {longest:.0f} s" if longest is not None else "a wait passed the threshold"
    lines = [f"paraflow stall: seen from rank {rank} of {world_size}: {waited} (threshold {threshold:g} s). Each rank:"]
    for ranks in groups.values():
        worst = max(ranks, key=lambda r: records[r]["for"])
        lines.append(_line(ranks, records[worst]))
    missing = [r for r in range(world_size) if r not in records]
    if missing:
        lines.append(f"  {_ranks(missing)}: no record")
    lines += [f"  likely cause: {cause}" for cause in likely_causes(records, world_size, window)]
    lines.append(
        f"  The job fails when the timeout of {timeout:g} s runs out (paraflow.init(timeout=...), PARAFLOW_TIMEOUT)."
    )
    return "\n".join(lines)

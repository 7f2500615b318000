"""In one process: what each rank records, how the stall report reads it, and the uneven-shard check."""

import copy
import pickle
import sys
import threading
from types import SimpleNamespace

import pytest
import torch
import torch.utils.checkpoint
from torch.utils.data import DataLoader

import paraflow
from paraflow.reliability.activity import Activity, attach_markers, attach_step_marker
from paraflow.reliability.stall import StallWatch, compose_report, stall_facts
from paraflow.training.sampler import ShardSampler
from paraflow.training.shard_check import watch_epoch


def record(call, site="t.py:9", step=3, waits=True, seconds=31.0, after="", passes=2):
    return {"call": call, "site": site, "step": step, "waits": waits, "for": seconds, "after": after, "passes": passes}


def report(records, world_size=2):
    return compose_report(rank=0, world_size=world_size, records=records, threshold=30, timeout=600, window=12)


def test_collective_on_one_rank_only_names_both_calls_and_the_if_rank_0_fix():
    text = report({0: record("save", "t.py:40", step=8, passes=2), 1: record("backward", "t.py:30", step=9, passes=4)})
    assert text.startswith("paraflow stall: seen from rank 0 of 2: a rank has waited 31 s (threshold 30 s)")
    assert "  rank 0: in save at t.py:40, waiting 31 s (step 8)" in text
    assert "  rank 1: in backward or the optimizer step after the forward at t.py:30, waiting 31 s (step 9)" in text
    assert "save is collective: every rank must call it (it writes from rank 0 alone)" in text
    assert "`if rank == 0:`" in text and "backend.join" not in text  # rank 1 is a data pass ahead: it skipped save
    assert text.rstrip().endswith("timeout of 600 s runs out (paraflow.init(timeout=...), PARAFLOW_TIMEOUT).")


def test_collective_where_the_others_are_still_training_also_names_uneven_batches():
    text = report({0: record("allreduce", passes=2), 1: record("optimizer.step", step=5, passes=2)})
    assert "allreduce is collective" in text and "backend.join(model, optimizer)" in text and "drop_last" in text


def test_rank_that_sent_nothing_and_rank_in_its_own_code():
    text = report({0: record("backward"), 1: record("idle", waits=False, seconds=45, after="optimizer.step")}, 3)
    assert "  rank 2: no record" in text
    assert "rank 2 sent no record within 12 s: stopped" in text
    assert "rank 1: running its own code for 45 s, since optimizer.step returned" in text
    text = report({0: record("backward"), 1: record("idle", waits=False, after="optimizer.step")})
    assert "rank 1 is in the script's own code" in text and "backend.join" in text


def test_same_ranks_doing_the_same_are_grouped_and_different_steps_mean_uneven_batches():
    text = report({r: record("backward", step=3 + (r == 3)) for r in range(4)}, 4)
    assert "  ranks 0, 1, 2: in backward" in text and "  rank 3: in backward" in text
    assert "different training steps (rank 0 at step 3, rank 1 at step 3, rank 2 at step 3, rank 3 at step 4)" in text


def test_ranks_in_the_same_collective_with_different_tensors_are_not_grouped():
    records = {r: record("allreduce") for r in range(2)}
    records[0]["detail"] = "allreduce(float32[], op=mean) as collective #4 at t.py:9"
    records[1]["detail"] = "allreduce(float32[2], op=mean) as collective #4 at t.py:9"
    text = report(records)
    assert (
        "  rank 0: in allreduce(float32[], op=mean)" in text and "  rank 1: in allreduce(float32[2], op=mean)" in text
    )


def test_threshold_option_and_variable(monkeypatch):
    def stall_threshold_seconds(value):
        return paraflow.get_backend("single", stall_threshold=value).stall_threshold

    monkeypatch.delenv("PARAFLOW_STALL_THRESHOLD", raising=False)
    assert stall_threshold_seconds(None) == 30
    assert stall_threshold_seconds(0) == 0
    monkeypatch.setenv("PARAFLOW_STALL_THRESHOLD", "12.5")
    assert stall_threshold_seconds(None) == 12.5
    monkeypatch.setenv("PARAFLOW_STALL_THRESHOLD", "soon")
    with pytest.raises(paraflow.ConfigurationError, match="PARAFLOW_STALL_THRESHOLD='soon'"):
        stall_threshold_seconds(None)


def test_stall_facts_without_a_report_add_nothing():
    assert stall_facts(object()) == ""


# ---------------------------------------------------------------- what a rank records
def test_calls_nest_under_the_outer_one_and_forwards_mark_steps():
    activity = Activity()
    with activity.call("save"):
        state = activity.state
        with activity.call("allgather"):
            assert activity.state is state  # save's inner collectives keep the name "save"
    assert (state.call, state.waits) == ("save", True) and state.site.startswith("test_stall_report.py:")
    assert (activity.state.call, activity.state.after, activity.state.waits) == ("idle", "save", False)
    model = torch.nn.Linear(2, 2)
    attach_markers(activity, model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    attach_step_marker(activity, optimizer)
    forward_line = sys._getframe().f_lineno + 1
    model(torch.ones(1, 2)).sum().backward()
    assert (activity.state.call, activity.state.step, activity.state.waits) == ("backward", 1, True)
    assert activity.state.site == f"test_stall_report.py:{forward_line}"
    optimizer.step()
    assert (activity.state.call, activity.state.after) == ("idle", "optimizer.step")
    stepped = activity.state
    activity.optimizer_stepped()  # torch runs the hook again for a subclass whose step calls its base's
    assert activity.state is stepped, "one step is recorded once"
    with torch.no_grad():
        model(torch.ones(1, 2))  # evaluation: not a step, not a wait
    assert (activity.step, activity.state.waits) == (1, False)


def test_the_forward_site_is_the_callers_line_at_every_depth():
    """A caller through other library frames still gets its line."""
    activity = Activity()
    model = torch.nn.Linear(2, 2)
    attach_markers(activity, model)
    sites = []
    for _ in range(2):
        line = sys._getframe().f_lineno + 1
        model(torch.ones(1, 2))
        sites.append((activity.state.site, f"test_stall_report.py:{line}"))
    line = sys._getframe().f_lineno + 1
    torch.utils.checkpoint.checkpoint(model, torch.ones(1, 2, requires_grad=True), use_reentrant=False)
    sites.append((activity.state.site, f"test_stall_report.py:{line}"))  # torch frames in between
    assert all(found == expected for found, expected in sites), sites


def test_call_site_keeps_each_lines_own_site_and_skips_library_frames():
    """Sites are remembered per code object and instruction: two lines of one loop keep their
    own, on every pass, and a paraflow frame between the script and the check is skipped."""
    from paraflow.reliability.activity import call_site

    library = {"__name__": "paraflow.stand_in", "call_site": call_site}
    exec("def checked():\n    return call_site()\ndef public():\n    return checked()\n", library)
    sites = []
    for _ in range(3):
        first = sys._getframe().f_lineno + 1
        at_first = library["public"]()
        second = sys._getframe().f_lineno + 1
        at_second = library["public"]()
        sites += [(at_first, f"test_stall_report.py:{first}"), (at_second, f"test_stall_report.py:{second}")]
    assert all(found == expected for found, expected in sites), sites


def test_the_benchmarks_rank_programs_are_call_sites_as_a_script_is():
    """paraflow.bench's ranks call the public API as a script does: the walk stops at their line
    (not at the launcher's entry point further up), while paraflow's library frames are skipped."""
    from paraflow.reliability.activity import call_site

    library = {"__name__": "paraflow.stand_in", "call_site": call_site}
    exec("def checked():\n    return call_site()\ndef public():\n    return checked()\n", library)
    program = {"__name__": "paraflow.bench.rank.stand_in", "public": library["public"]}
    exec(compile("def sweep():\n    return public()\n", "sweep_stand_in.py", "exec"), program)
    assert program["sweep"]() == "sweep_stand_in.py:2"


def test_marked_models_still_copy_and_pickle():
    activity = Activity()
    model = torch.nn.Linear(2, 2)
    attach_markers(activity, model)
    clone = copy.deepcopy(model)
    clone(torch.ones(1, 2))
    assert activity.step == 1  # the copy's hooks are the same markers
    restored = pickle.loads(pickle.dumps(model))
    restored(torch.ones(1, 2))  # unpickled, the markers are inert
    assert activity.step == 1


# ---------------------------------------------------------------- uneven batch counts
def sampler_on(activity, size=449, rank=0, drop_last=False):
    sampler = ShardSampler(size, 2, rank, drop_last=drop_last)
    sampler.on_iteration = lambda s, indices: watch_epoch(activity, s, indices)
    return sampler


def test_uneven_batch_counts_stop_the_first_training_forward():
    activity = Activity()
    model = torch.nn.Linear(1, 1)
    attach_markers(activity, model)
    loader = DataLoader(torch.zeros(449, 1), batch_size=112, sampler=sampler_on(activity))
    batches = iter(loader)
    next(batches)
    assert activity.passes == 1 and len(activity.uneven) == 1
    with torch.no_grad():
        model(torch.zeros(1, 1))  # evaluating uneven shards is fine
    with pytest.raises(paraflow.ConfigurationError) as err:
        model(torch.zeros(1, 1))
    assert "rank 0: 3, rank 1: 2" in str(err.value) and "backend.join(model, optimizer)" in str(err.value)
    activity.joins = 1  # inside backend.join it is allowed
    model(torch.zeros(1, 1))
    del batches  # an abandoned or finished epoch leaves nothing behind
    assert activity.uneven == {}


@pytest.mark.parametrize(
    "size, batch, loader_drop_last, sampler_drop_last, uneven",
    [
        (449, 112, False, False, True),  # 225 and 224 samples: 3 and 2 batches
        (449, 32, False, False, True),  # 8 and 7
        (449, 10, False, False, False),  # 23 and 23
        (449, 112, True, False, False),  # the loader drops the partial batches: 2 and 2
        (449, 112, False, True, False),  # the sampler drops the left-over sample: equal shards
        (448, 112, False, False, False),
    ],
)
def test_batch_counts_follow_the_loader(size, batch, loader_drop_last, sampler_drop_last, uneven):
    activity = Activity()
    sampler = sampler_on(activity, size, rank=1, drop_last=sampler_drop_last)
    loader = DataLoader(torch.zeros(size, 1), batch_size=batch, sampler=sampler, drop_last=loader_drop_last)
    batches = iter(loader)
    next(batches)
    assert bool(activity.uneven) == uneven


def test_a_sampler_iterated_by_hand_is_not_checked():
    activity = Activity()
    assert len(list(sampler_on(activity))) == 225
    assert activity.passes == 1 and activity.uneven == {}


# ---------------------------------------------------------------- the watchdogs' rounds
def watch_on(store, rank, call):
    backend = SimpleNamespace(rank=rank, world_size=2, name="ddp-gloo", timeout=600, stall_threshold=0.5)
    activity = Activity()
    with activity.call(call):  # a wait that began long ago
        waiting = activity.state
    activity.state = waiting._replace(since=waiting.since - 60)
    return StallWatch(backend, activity, lambda: store)


def test_two_ranks_opening_rounds_at_once_each_print_one_report_naming_both(capsys):
    import torch.distributed as dist

    store = dist.PrefixStore("stall/", dist.HashStore())
    watches = [watch_on(store, 0, "save"), watch_on(store, 1, "allreduce")]
    rounds = [store.add("round", 1), store.add("round", 1)]  # both opened before either collected
    threads = [threading.Thread(target=w._report, args=(store, r)) for w, r in zip(watches, rounds)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    reports = [w.last_report for w in watches]
    for report in reports:
        assert "  rank 0: in save at" in report and "  rank 1: in allreduce at" in report, report
        assert "no record" not in report
    for watch in watches:  # the next wakes open no new round and print nothing more
        watch._tick(store)
    assert capsys.readouterr().err.count("paraflow stall:") == 2

"""The storage-fault hook of the real save (replay/storage_faults.py), torch-free: which file is
which kind, which rank's which write a fault hits, and what it does there. The interposer runs
with a stub kill that records the pids instead of killing."""

import builtins
import errno
import io
import os
import pathlib

import pytest

from replay import storage_faults as sf


def _root(tmp_path):
    root = str(tmp_path / "ckpt")
    os.makedirs(os.path.join(root, "iter_0000003"))
    return root


def _it(root, name):
    return os.path.join(root, "iter_0000003", name)


def test_each_real_file_has_the_kind_of_the_model_file_it_stands_for(tmp_path):
    root = _root(tmp_path)
    assert sf.file_kind(root, _it(root, "__0_0.distcp")) == "shard"
    assert sf.file_kind(root, _it(root, "__12_1.distcp")) == "shard"
    assert sf.file_kind(root, _it(root, "common.pt")) == "object"
    assert sf.file_kind(root, _it(root, ".metadata.tmp")) == "metadata"
    assert sf.file_kind(root, _it(root, ".metadata")) == "metadata"
    # The real metadata.json is a format marker, not the piece index: counted by "any" only.
    assert sf.file_kind(root, _it(root, "metadata.json")) == "other"
    assert sf.file_kind(root, os.path.join(root, sf.TRACKER)) == "tracker"
    assert sf.file_kind(root, pathlib.Path(root) / sf.TRACKER) == "tracker"
    assert sf.file_kind(root, _it(root, sf.TRACKER)) == "other"
    assert sf.file_kind(root, str(tmp_path / "elsewhere" / "__0_0.distcp")) is None
    assert sf.file_kind(root, root + "-other/x") is None


def test_parse_faults_checks_the_fields_as_the_scenario_parser_does():
    assert sf.parse_faults({"storage_faults": [{"kind": "torn"}]}, "p") == [sf.Fault("torn", "any", 0)]
    for bad, words in [({"kind": "melt"}, "kind"), ({"kind": "torn", "file": "log"}, "file"),
                       ({"kind": "torn", "nth": -1}, "nth"), ({"kind": "torn", "when": 1}, "unknown field")]:
        with pytest.raises(sf.StorageFaultSpecError) as e:
            sf.parse_faults({"storage_faults": [bad]}, "scenario.phases[1]")
        assert "scenario.phases[1].storage_faults[0]" in str(e.value) and words in str(e.value)


def _writes(root):
    """Rank 0's writes of one F save, in its order."""
    return [_it(root, "common.pt"), _it(root, "__0_0.distcp"), _it(root, "__0_1.distcp"),
            _it(root, ".metadata.tmp"), _it(root, "metadata.json"), os.path.join(root, sf.TRACKER)]


@pytest.mark.parametrize("fault,where", [
    (sf.Fault("crash_before", "object", 0), "common.pt"),
    (sf.Fault("crash_before", "metadata", 0), ".metadata.tmp"),
    (sf.Fault("crash_before", "tracker", 0), sf.TRACKER),
    (sf.Fault("crash_before", "shard", 0), "__0_0.distcp"),
    (sf.Fault("crash_before", "any", 0), "common.pt"),
    (sf.Fault("crash_before", "any", 3), ".metadata.tmp"),
    (sf.Fault("crash_before", "any", 4), "metadata.json"),
])
def test_a_fault_fires_at_its_nth_write_of_its_kind_on_rank_0(tmp_path, fault, where):
    root = _root(tmp_path)
    plan = sf.FaultPlan(root, [fault], rank=0, world=2)
    fired = [os.path.basename(w) for w in _writes(root) if plan.decide(w) is not None]
    assert fired == [where]


def test_the_nth_write_not_the_one_after_it(tmp_path):
    root = _root(tmp_path)
    tracker = os.path.join(root, sf.TRACKER)
    plan = sf.FaultPlan(root, [sf.Fault("torn", "tracker", 1)], rank=0, world=1)
    assert [plan.decide(tracker) is not None for _ in range(4)] == [False, True, False, False]


def test_a_shard_fault_hits_rank_k_first_bucket_file_only(tmp_path):
    root = _root(tmp_path)
    fault = sf.Fault("crash_after", "shard", 1)
    for rank in range(3):
        plan = sf.FaultPlan(root, [fault], rank=rank, world=3)
        # Bucket 1 first: the writer threads (HEAD) or processes (F) race, the target is by name.
        fired = [n for n in ("__%d_1.distcp" % rank, "__%d_0.distcp" % rank) if plan.decide(_it(root, n))]
        assert fired == (["__1_0.distcp"] if rank == 1 else []), rank
    assert sf.target_rank(sf.Fault("crash_after", "shard", 3), world=3) is None


def test_faults_of_other_ranks_never_fire_on_this_one(tmp_path):
    root = _root(tmp_path)
    plan = sf.FaultPlan(root, [sf.Fault("crash_before", "tracker", 0)], rank=1, world=2)
    assert plan.decide(os.path.join(root, sf.TRACKER)) is None


def test_counters_in_a_file_are_shared_by_a_forked_writer(tmp_path):
    root = _root(tmp_path)
    counters = sf.Counters(str(tmp_path / "counts"), 1)
    plan = sf.FaultPlan(root, [sf.Fault("crash_before", "any", 1)], rank=0, world=1, counters=counters)
    assert plan.decide(_it(root, "common.pt")) is None
    pid = os.fork()
    if pid == 0:  # the forked writer takes write 1: the fault fires there
        os._exit(0 if plan.decide(_it(root, "__0_0.distcp")) is not None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert plan.decide(_it(root, "__0_1.distcp")) is None  # fired once, in the child


def test_cut_size_keeps_whole_pages_of_half_the_bytes():
    assert sf.cut_size(3) == 0
    assert sf.cut_size(8192) == 4096
    assert sf.cut_size(20000) == 8192


class _Job:
    """An interposer with a stub kill, installed on builtins for one test."""

    def __init__(self, tmp_path, faults, rank=0, world=2):
        self.root = _root(tmp_path)
        self.marker = str(tmp_path / "crashed")
        self.fired = []
        self.killed = []
        plan = sf.FaultPlan(self.root, faults, rank=rank, world=world)
        self.hook = sf.Interposer(plan, self.marker, self.fired.append, kill=self.killed.append,
                                  rank_pid=os.getpid())

    def __enter__(self):
        self._saved = (builtins.open, io.open, os.rename, os.replace)
        builtins.open, io.open, os.rename, os.replace = (self.hook.open, self.hook.open, self.hook.rename,
                                                         self.hook.replace)
        return self

    def __exit__(self, *exc):
        builtins.open, io.open, os.rename, os.replace = self._saved


def test_crash_before_kills_before_the_file_exists(tmp_path):
    with _Job(tmp_path, [sf.Fault("crash_before", "tracker", 0)]) as job:
        tracker = os.path.join(job.root, sf.TRACKER)
        with pytest.raises(OSError):
            with open(tracker, "w") as f:
                f.write("3")
    assert job.killed == [os.getpid()] and os.path.exists(job.marker)
    assert not os.path.exists(tracker)
    assert job.fired == ["crash_before at write 0 of tracker files: %s (rank 0)" % sf.TRACKER]


def test_crash_after_kills_once_the_write_closed(tmp_path):
    with _Job(tmp_path, [sf.Fault("crash_after", "shard", 0)]) as job:
        path = _it(job.root, "__0_0.distcp")
        with open(path, "wb") as f:
            f.write(b"x" * 10000)
            assert job.killed == []
    assert job.killed == [os.getpid()]
    assert os.path.getsize(path) == 10000


@pytest.mark.parametrize("kind,size,killed", [("torn", 4096, True), ("short", 4096, False)])
def test_torn_and_short_leave_half_in_whole_pages(tmp_path, kind, size, killed):
    with _Job(tmp_path, [sf.Fault(kind, "shard", 0)]) as job:
        path = _it(job.root, "__0_0.distcp")
        with open(path, "wb") as f:
            f.write(b"x" * 10000)
    assert os.path.getsize(path) == size
    assert bool(job.killed) == killed


def test_a_torn_small_tracker_lands_empty(tmp_path):
    with _Job(tmp_path, [sf.Fault("torn", "tracker", 0)]) as job:
        tracker = os.path.join(job.root, sf.TRACKER)
        with open(tracker, "w") as f:
            f.write("3")
    assert open(tracker).read() == "" and job.killed


def test_disk_full_raises_enospc_and_the_job_goes_on(tmp_path):
    with _Job(tmp_path, [sf.Fault("disk_full", "metadata", 0)]) as job:
        with pytest.raises(OSError) as e:
            open(_it(job.root, ".metadata.tmp"), "wb")
        assert e.value.errno == errno.ENOSPC
        with open(_it(job.root, "metadata.json"), "w") as f:
            f.write("{}")
    assert job.killed == []


def test_crash_after_the_metadata_lands_with_its_rename(tmp_path):
    """torch writes .metadata.tmp and renames it: the model's metadata write lands at the rename."""
    with _Job(tmp_path, [sf.Fault("crash_after", "metadata", 0)]) as job:
        tmp = _it(job.root, ".metadata.tmp")
        with pathlib.Path(tmp).open("wb") as f:  # as torch's FileSystem.create_stream opens it
            f.write(b"m")
        assert job.killed == []
        pathlib.Path(tmp).rename(_it(job.root, ".metadata"))
    assert job.killed == [os.getpid()]
    assert os.path.exists(_it(job.root, ".metadata"))


def test_a_torn_metadata_dies_before_the_rename(tmp_path):
    with _Job(tmp_path, [sf.Fault("torn", "metadata", 0)]) as job:
        with open(_it(job.root, ".metadata.tmp"), "wb") as f:
            f.write(b"m" * 9000)
    assert job.killed == [os.getpid()]
    assert os.path.getsize(_it(job.root, ".metadata.tmp")) == 4096


def test_after_a_crash_every_rank_dies_at_its_next_write(tmp_path):
    with _Job(tmp_path, [], rank=1) as job:
        open(job.marker, "w").close()
        with pytest.raises(OSError):
            open(_it(job.root, "__1_0.distcp"), "wb")
        with open(str(tmp_path / "not-a-checkpoint-file"), "w") as f:  # outside the root: untouched
            f.write("ok")
    assert job.killed == [os.getpid()] and job.fired == []
    assert not os.path.exists(_it(job.root, "__1_0.distcp"))


def test_a_forked_writer_kills_the_rank_process_too(tmp_path):
    root = _root(tmp_path)
    killed = []
    hook = sf.Interposer(sf.FaultPlan(root, [sf.Fault("crash_before", "shard", 0)], 0, 1), str(tmp_path / "m"),
                         lambda line: None, kill=killed.append, rank_pid=os.getpid() + 100000)
    with pytest.raises(OSError):
        hook.open(_it(root, "__0_0.distcp"), "wb")
    assert killed == [os.getpid() + 100000, os.getpid()]


def test_torch_save_to_a_checkpoint_path_goes_through_the_hook(tmp_path):
    root = _root(tmp_path)
    killed = []
    hook = sf.Interposer(sf.FaultPlan(root, [sf.Fault("crash_after", "object", 0)], 0, 1), str(tmp_path / "m"),
                         lambda line: None, kill=killed.append)
    save = hook.torch_save(lambda obj, f: f.write(repr(obj).encode()))
    save({"a": 1}, _it(root, "common.pt"))
    assert open(_it(root, "common.pt"), "rb").read() == b"{'a': 1}" and killed
    buf = io.BytesIO()
    save([2], buf)  # a stream (a tensor inside a .distcp): not a file of its own
    assert buf.getvalue() == b"[2]"


def test_a_phase_resumes_after_a_completed_save_or_a_save_that_met_a_fault():
    from replay import coordinator as c
    err = lambda stage, secondary=False: {"at": "error", "stage": stage, "secondary": secondary}  # noqa: E731
    assert c.resumes_after({"status": "completed", "save": True, "events": []})
    assert not c.resumes_after({"status": "completed", "save": False, "events": []})
    crashed = {"status": "failed", "storage_faults": ["crash_before ..."], "events": [err("save"), err("train", True)]}
    assert c.resumes_after(crashed)
    assert not c.resumes_after(dict(crashed, storage_faults=None))  # a failure of the code, not a fault
    assert not c.resumes_after(dict(crashed, events=[err("train")]))


def test_the_loaded_iteration_names_the_last_run_that_saved_it():
    from replay import coordinator as c
    done = {"reference": {}, "phase0": {"_save_iteration": 2}, "phase1": {"_save_iteration": 3},
            "phase2": {"_save_iteration": 3}}
    assert c.saved_by(done, 3) == "phase2" and c.saved_by(done, 2) == "phase0" and c.saved_by(done, 9) is None
    run = {"save": True, "steps": 1}
    assert c.save_iteration({"status": "failed", "storage_faults": ["x"], "start_step": 2,
                             "events": [{"at": "error", "stage": "save"}]}, run) == 3
    assert c.save_iteration({"status": "failed", "start_step": 2, "events": [{"at": "error", "stage": "load"}]},
                            run) is None
    assert c.crash_rank(["short at write 0 of shard files: iter_0000003/__0_0.distcp (rank 0)",
                         "crash_after at write 0 of shard files: iter_0000003/__1_0.distcp (rank 1)"]) == 1


def test_tracker_state_reads_what_the_training_loop_would(tmp_path):
    from replay import coordinator as c
    assert c.tracker_state(str(tmp_path)) is None
    (tmp_path / sf.TRACKER).write_text("")
    assert c.tracker_state(str(tmp_path)) == -1
    (tmp_path / sf.TRACKER).write_text("7")
    assert c.tracker_state(str(tmp_path)) == 7


def test_gradients_before_the_planned_start_come_from_grads_before():
    from replay import plan as plan_mod
    run = {"id": "phase2", "start_step": 3, "grads": [["g4"]], "grads_before": [["g1"], ["g2"], ["g3"]]}
    assert [plan_mod.step_gradients(run, g) for g in (1, 2, 3, 4)] == [["g1"], ["g2"], ["g3"], ["g4"]]
    with pytest.raises(KeyError):
        plan_mod.step_gradients(run, 5)

"""Where a checkpoint of the replay lives on disk, as Megatron's training loop lays it out
(megatron/training/checkpointing.py; torch-free):

  <save dir>/latest_checkpointed_iteration.txt    the tracker: the last iteration saved, as text
  <save dir>/iter_0000005/                        dist_checkpointing.save's folder (torch_dist:
                                                  metadata.json, .metadata, __R_0.distcp, common.pt)

The training loop writes the tracker on rank 0 after every rank has saved, and a resume reads
it to pick the iteration folder. The replay does the same, so that a kept checkpoint
(`--keep-checkpoints`) is a checkpoint directory a user would have on disk.
"""

from __future__ import annotations

import os

TRACKER = "latest_checkpointed_iteration.txt"


class LayoutError(ValueError):
    pass


def iteration_dir(root: str, iteration: int) -> str:
    """get_checkpoint_name() for a torch_dist checkpoint: no per-rank subfolders."""
    if iteration < 0:
        raise LayoutError("iteration %d is negative" % iteration)
    return os.path.join(root, "iter_%07d" % iteration)


def write_tracker(root: str, iteration: int) -> None:
    """As save_checkpoint() writes it (iter_finalize_fn): open('w') in place, no newline, no
    rename, no fsync, so that a crash there leaves what the training loop's would."""
    with open(os.path.join(root, TRACKER), "w") as f:
        f.write(str(int(iteration)))


def read_tracker(root: str) -> int:
    """read_metadata(): the iteration the tracker names. A missing or unreadable tracker is an
    error that names the file (Megatron starts from scratch there; a replay must not)."""
    path = os.path.join(root, TRACKER)
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError as e:
        raise LayoutError("%s: cannot read the checkpoint tracker (%s)" % (path, e.strerror)) from None
    if text == "release":
        raise LayoutError("%s: a release checkpoint, which the replay does not write" % path)
    try:
        iteration = int(text)
    except ValueError:
        raise LayoutError("%s: expected an iteration number, read %r" % (path, text[:40])) from None
    if iteration < 0:
        raise LayoutError("%s: negative iteration %d" % (path, iteration))
    return iteration


def resume_dir(root: str) -> str:
    """The iteration folder a resume from `root` loads."""
    d = iteration_dir(root, read_tracker(root))
    if not os.path.isdir(d):
        raise LayoutError("%s names iteration folder %s, which does not exist" % (TRACKER, d))
    return d


# ---------------------------------------------------------------------------------------------
# --resume-from: a run loads a given checkpoint directory instead of an earlier run's save
# ---------------------------------------------------------------------------------------------
# For the cross-load (a checkpoint the model saved, exported by `ckptsim run --checkpoint-format
# torch_dist`, loaded by the real Megatron): `run --resume-from [RUN=]DIR`. DIR is a checkpoint
# directory in this layout (tracker + iteration folder); `{scenario}` in it stands for the plan's
# scenario name, so one option serves a folder of plans. Without RUN=, the spec applies to the
# plan's first run that loads. The run still records its after_load state as usual, with
# "resumed_from": DIR in the trace (load_from keeps naming the plan's source run, whose own save
# is then what the loaded state can be compared with).


def parse_resume_from(specs):
    """[(run id or None, directory template)] from the --resume-from values; LayoutError for an
    empty directory or run id."""
    out = []
    for spec in specs or []:
        run, sep, directory = spec.partition("=")
        if not sep:
            run, directory = None, spec
        elif not run or "/" in run or os.sep in run:
            # "DIR" that holds '=' but no run id before it: the whole text is the directory.
            run, directory = None, spec
        if not directory:
            raise LayoutError("--resume-from %r: no checkpoint directory" % spec)
        out.append((run, directory))
    return out


def resume_dirs_for(plan, specs):
    """{run id: absolute checkpoint directory} of one plan (parse_resume_from's specs). Every
    named run must exist and load; every directory must hold a tracker naming an existing
    iteration folder (resume_dir). Raises LayoutError naming the spec."""
    name = plan["scenario"]["name"]
    loading = [r["id"] for r in plan["runs"] if r.get("load")]
    out = {}
    for run, template in specs:
        rid = run if run is not None else (loading[0] if loading else None)
        if rid is None:
            raise LayoutError("--resume-from %s: plan %s has no run that loads" % (template, name))
        if rid not in [r["id"] for r in plan["runs"]]:
            raise LayoutError("--resume-from %s=%s: plan %s has no run %r" % (rid, template, name, rid))
        if rid not in loading:
            raise LayoutError("--resume-from %s=%s: run %r of plan %s does not load" % (rid, template, rid, name))
        if rid in out:
            raise LayoutError("--resume-from: run %r of plan %s named twice" % (rid, name))
        directory = os.path.abspath(template.replace("{scenario}", name))
        resume_dir(directory)  # the tracker and its iteration folder exist
        out[rid] = directory
    return out

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
    tmp = os.path.join(root, TRACKER + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(int(iteration)))
    os.replace(tmp, os.path.join(root, TRACKER))


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

"""Storage faults on the real save (issue 25, item 3): a phase's `storage_faults` ([{kind, file,
nth}], the scenario format of ckptsim's sim/scenario.h) acted out on the files a real Megatron
save writes, so that a crash scenario can be replayed on the real code. Torch-free: the worker
installs the interposer (`Interposer`) around one run; everything that decides (which kind a
file is, which rank's which write a fault hits, what it does there) is plain functions tested by
tests/replay/test_storage_faults.py.

How a fault of the model maps onto the real job (PLAN_AND_TRACE.md, "Storage faults"):

  model file kind   model file (one shared storage,     real file (each rank its own process)
                    writes numbered over all ranks)
  shard             shards/rank_R.bin, one per rank     __R_0.distcp: rank R's first bucket file
                    (rank 0's first, then rank 1's ...) (F also writes __R_1.distcp: not counted)
  object            *.pt (objects, the common state)    common.pt (rank 0; F/P/R; H writes none)
  metadata          metadata.json (the piece index)     .metadata (DCP's piece index, written as
                                                        .metadata.tmp and renamed: one write)
  tracker           latest_checkpointed_iteration.txt   the same (rank 0, open('w'), no rename)
  any               every file above                    every write of rank 0's process tree

`shard` nth=k hits rank k (the model hits rank k mod world's shard file in save k / world,
whatever order its ranks write in: sim::StorageFaultSpec::fault); every
other kind is written by rank 0 only, so nth counts rank 0's writes of that kind, in its order.
Real metadata.json (a format marker whose bytes do not depend on the save) is counted by `any`
only.

What a fault does to the write it hits (the model's FaultyStorage, model/faulty_storage.h):
  crash_before  the job dies before the file is opened (SIGKILL of the rank's process)
  crash_after   the write closes (for .metadata: the rename lands), then the job dies
  torn          the write closes, the file is cut to half its bytes in whole 4 KiB pages, the
                job dies (for .metadata.tmp: before the rename, as a process killed mid-write)
  short         the file is cut the same way and the save goes on (the disk lost the tail)
  disk_full     opening it raises OSError(ENOSPC); the save goes on to raise as it does
"The job dies": the rank writes the crash marker (a file the coordinator named), then SIGKILLs
its own process (and the rank's process where the write ran in a forked writer). Every other
rank's next write under the checkpoint root finds the marker and dies the same way, silently: a
dead job writes nothing more. The coordinator then stops whatever still runs, as a scheduler
would.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import io
import json
import os
import re
import signal
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

KINDS = ("crash_before", "crash_after", "torn", "short", "disk_full")
CRASH_KINDS = ("crash_before", "crash_after", "torn")
FILES = ("any", "shard", "object", "metadata", "tracker")
STORAGE_FAULTS_MAX = 4  # sim/scenario.cpp kStorageFaultsMax
PAGE_BYTES = 4096  # sim/driver.cpp kPageBytes: a torn or short write lands whole pages
TRACKER = "latest_checkpointed_iteration.txt"
_SHARD_RE = re.compile(r"^__(\d+)_(\d+)\.distcp$")


class StorageFaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    file: str = "any"
    nth: int = 0

    def text(self) -> str:
        """As model::StorageFault::text() names it, with the real files' names."""
        return "%s at write %d of %s" % (self.kind, self.nth, "any file" if self.file == "any" else self.file + " files")


def parse_faults(phase: Dict[str, Any], where: str) -> List[Fault]:
    """A phase's storage_faults, checked with sim/scenario.cpp's rules; StorageFaultSpecError names
    the field."""
    raw = phase.get("storage_faults")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise StorageFaultSpecError("%s.storage_faults: expected a list" % where)
    if len(raw) > STORAGE_FAULTS_MAX:
        raise StorageFaultSpecError("%s.storage_faults: %d faults, at most %d" % (where, len(raw), STORAGE_FAULTS_MAX))
    out = []
    for i, f in enumerate(raw):
        at = "%s.storage_faults[%d]" % (where, i)
        if not isinstance(f, dict):
            raise StorageFaultSpecError("%s: expected an object" % at)
        unknown = sorted(set(f) - {"kind", "file", "nth"})
        if unknown:
            raise StorageFaultSpecError("%s: unknown field %r" % (at, unknown[0]))
        kind, file, nth = f.get("kind"), f.get("file", "any"), f.get("nth", 0)
        if kind not in KINDS:
            raise StorageFaultSpecError("%s.kind: expected one of %s, got %r" % (at, "|".join(KINDS), kind))
        if file not in FILES:
            raise StorageFaultSpecError("%s.file: expected one of %s, got %r" % (at, "|".join(FILES), file))
        if not isinstance(nth, int) or isinstance(nth, bool) or nth < 0:
            raise StorageFaultSpecError("%s.nth: expected an integer >= 0, got %r" % (at, nth))
        out.append(Fault(kind, file, nth))
    return out


def file_kind(root: str, path: Any) -> Optional[str]:
    """The kind of a file the save writes at `path` ("shard", "object", "metadata", "tracker",
    "other"), or None where it is not under the checkpoint root `root`."""
    try:
        p = os.path.abspath(os.fspath(path))
    except TypeError:
        return None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    r = os.path.abspath(root)
    if not p.startswith(r.rstrip(os.sep) + os.sep):
        return None
    rel = os.path.relpath(p, r)
    base = os.path.basename(rel)
    if rel == TRACKER:
        return "tracker"
    if _SHARD_RE.match(base):
        return "shard"
    if base.endswith(".pt"):
        return "object"
    if base in (".metadata", ".metadata.tmp"):
        return "metadata"
    return "other"


def counts(fault: Fault, kind: str) -> bool:
    """Whether `fault` counts a write of a file of `kind`."""
    return fault.file == "any" or fault.file == kind


def target_rank(fault: Fault, world: int) -> Optional[int]:
    """The rank whose write the fault hits: shard nth=k is rank k's (None past the world's ranks);
    every other kind is rank 0's."""
    if fault.file == "shard":
        return fault.nth if fault.nth < world else None
    return 0


def shard_index(path: Any) -> Optional[Sequence[int]]:
    """(rank, bucket) of a __R_B.distcp file name, or None."""
    m = _SHARD_RE.match(os.path.basename(os.fspath(path)))
    return (int(m.group(1)), int(m.group(2))) if m else None


class Counters:
    """Per-fault write counts, shared by a rank's process and the writer processes it forks (F
    writes its .distcp files in forked children, HEAD in threads): a small JSON file under an
    exclusive lock. `path` None keeps them in memory (tests)."""

    def __init__(self, path: Optional[str], n: int) -> None:
        self.path = path
        self._mem = [0] * n
        self._done = [False] * n

    def take(self, eligible: Sequence[bool], nths: Sequence[int]) -> Optional[int]:
        """Counts one write for every eligible fault not yet fired; returns the index of the first
        that fires at it (its count reaches its nth), marking it fired."""
        if self.path is None:
            return self._take(self._mem, self._done, eligible, nths)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.read(fd, 1 << 16)
            state = json.loads(raw) if raw else {"seen": [0] * len(nths), "done": [False] * len(nths)}
            firing = self._take(state["seen"], state["done"], eligible, nths)
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(state).encode())
            return firing
        finally:
            os.close(fd)

    @staticmethod
    def _take(seen: List[int], done: List[bool], eligible: Sequence[bool], nths: Sequence[int]) -> Optional[int]:
        firing = None
        for i, ok in enumerate(eligible):
            if not ok or done[i]:
                continue
            if seen[i] == nths[i] and firing is None:
                firing = i
                done[i] = True
            seen[i] += 1
        return firing


class FaultPlan:
    """Which write of this rank a fault hits. `decide(path)` is called once per file the rank
    opens for writing; it returns the Fault that fires there, or None."""

    def __init__(self, root: str, faults: Sequence[Fault], rank: int, world: int,
                 counters: Optional[Counters] = None) -> None:
        self.root = root
        self.faults = list(faults)
        self.rank = rank
        self.world = world
        self.counters = counters or Counters(None, len(self.faults))

    def decide(self, path: Any) -> Optional[Fault]:
        kind = file_kind(self.root, path)
        if kind is None:
            return None
        eligible = []
        nths = []
        for f in self.faults:
            mine = target_rank(f, self.world) == self.rank
            if f.file == "shard":
                idx = shard_index(path)
                # Rank k's first bucket file: the model's rank k shard file.
                ok = mine and kind == "shard" and idx is not None and idx[0] == self.rank and idx[1] == 0
                eligible.append(ok)
                nths.append(0)
            else:
                eligible.append(mine and counts(f, kind))
                nths.append(f.nth)
        i = self.counters.take(eligible, nths)
        return self.faults[i] if i is not None else None


def cut_size(size: int, page_bytes: int = PAGE_BYTES) -> int:
    """What lands of a torn or short write of `size` bytes: half, rounded down to whole pages."""
    return size // 2 // page_bytes * page_bytes


def is_write_mode(mode: Any) -> bool:
    return isinstance(mode, str) and any(c in mode for c in "wax+")


class _FaultedFile:
    """A file opened for writing that a fault acts on when it closes."""

    def __init__(self, inner: Any, path: str, on_close: Callable[[str], None]) -> None:
        self._inner = inner
        self._path = path
        self._on_close = on_close
        self._closed_once = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __iter__(self) -> Any:
        return iter(self._inner)

    def __enter__(self) -> "_FaultedFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._inner.close()
        if not self._closed_once:
            self._closed_once = True
            self._on_close(self._path)


class Interposer:
    """Wraps builtins.open / io.open (Megatron's .distcp writer, torch's FileSystemWriter through
    pathlib, save_config's metadata.json, the tracker), os.rename / os.replace (torch's
    .metadata.tmp -> .metadata) and, where given, torch.save to a path (F's common.pt: torch
    writes it through its C++ file writer, so the wrapper serializes to memory and writes the
    bytes through open(); same bytes) so that `plan`'s faults act on the files under its root.

    `record(line)` is called (before any kill) for every fault that fires; `marker` is the file
    whose existence says the job died; `kill(pid)` ends a process (os.kill with SIGKILL)."""

    def __init__(self, plan: FaultPlan, marker: str, record: Callable[[str], None],
                 kill: Optional[Callable[[int], None]] = None, rank_pid: Optional[int] = None) -> None:
        self.plan = plan
        self.marker = marker
        self.record = record
        self.kill = kill or (lambda pid: os.kill(pid, signal.SIGKILL))
        self.rank_pid = rank_pid if rank_pid is not None else os.getpid()
        self._saved: List[Any] = []
        self._open = builtins.open
        self._rename = os.rename
        self._replace = os.replace
        self._pending_rename: Dict[str, Fault] = {}

    # ---------------------------------------------------------------- the job dies
    def die(self) -> None:
        try:
            fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT, 0o644)
            os.close(fd)
        except OSError:
            pass
        me = os.getpid()
        if me != self.rank_pid:
            self.kill(self.rank_pid)
        self.kill(me)

    def _fire(self, fault: Fault, path: str) -> None:
        self.record("%s: %s (rank %d)" % (fault.text(), os.path.relpath(path, self.plan.root), self.plan.rank))

    # ---------------------------------------------------------------- hooks
    def open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if not is_write_mode(mode) or isinstance(file, int) or file_kind(self.plan.root, file) is None:
            return self._open(file, mode, *args, **kwargs)
        path = os.path.abspath(os.fspath(file))
        if os.path.exists(self.marker):
            self.die()
            raise OSError(errno.EIO, "the job crashed", path)  # reached only where kill is a stub
        fault = self.plan.decide(path)
        if fault is None:
            return self._open(file, mode, *args, **kwargs)
        self._fire(fault, path)
        if fault.kind == "crash_before":
            self.die()
            raise OSError(errno.EIO, "the job crashed", path)
        if fault.kind == "disk_full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        inner = self._open(file, mode, *args, **kwargs)
        return _FaultedFile(inner, path, lambda p, f=fault: self._after_close(f, p))

    def _after_close(self, fault: Fault, path: str) -> None:
        renamed_later = os.path.basename(path) == ".metadata.tmp"
        if fault.kind in ("torn", "short"):
            size = os.path.getsize(path)
            os.truncate(path, cut_size(size))
        if fault.kind == "crash_after" and renamed_later:
            self._pending_rename[path] = fault  # the write lands with its rename
            return
        if fault.kind in ("crash_after", "torn"):
            self.die()

    def rename(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        self._rename(src, dst, *args, **kwargs)
        self._after_rename(src)

    def replace(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        self._replace(src, dst, *args, **kwargs)
        self._after_rename(src)

    def _after_rename(self, src: Any) -> None:
        try:
            key = os.path.abspath(os.fspath(src))
        except TypeError:
            return
        if self._pending_rename.pop(key, None) is not None:
            self.die()

    def torch_save(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(f, (str, bytes, os.PathLike)) and file_kind(self.plan.root, f) is not None:
                buf = io.BytesIO()
                original(obj, buf, *args, **kwargs)
                with self.open(f, "wb") as out:
                    out.write(buf.getvalue())
                return None
            return original(obj, f, *args, **kwargs)

        return save

    # ---------------------------------------------------------------- install
    def install(self, patches: Any, torch_module: Any = None) -> None:
        """Sets the hooks through `patches` (replay.emulation.Patches: restored after the run)."""
        patches.set(builtins, "open", self.open)
        patches.set(io, "open", self.open)
        patches.set(os, "rename", self.rename)
        patches.set(os, "replace", self.replace)
        if torch_module is not None:
            patches.set(torch_module, "save", self.torch_save(torch_module.save))


def append_line(path: str, line: str) -> None:
    """Appends one line under an exclusive lock (several processes record into one file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, (line.replace("\n", " ") + "\n").encode("utf-8"))
    finally:
        os.close(fd)


def read_lines(path: str) -> List[str]:
    try:
        with builtins.open(path, encoding="utf-8") as f:
            return [ln.rstrip("\n") for ln in f if ln.strip()]
    except OSError:
        return []

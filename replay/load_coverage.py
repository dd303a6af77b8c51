"""Which elements a load wrote: the runner's side of `load_writes_every_element`.

Megatron's `dist_checkpointing.load(sharded_state_dict, dir)` writes the checkpoint's values into
the tensors of the request's ShardedTensors (in place, for the torch_dist format). An element no
saved piece covers, or a whole key the load skips (radixark's `allow_partial_load`), keeps what
the request was built with (often `torch.empty`), and nothing says so. To see it without changing
what the real code computes, the runner:

  1. before the load, copies every floating ShardedTensor's data (all copies first: two requests
     may share memory), then fills each with a sentinel NaN whose bits no computation makes;
  2. after the load, finds the elements that still hold the sentinel's bits, in the tensor the
     loaded state dict holds at the request's place, reports them as ranges of the key's global
     element space, and writes back what they held before (so the run goes on exactly as it
     would have without the probe).

An element the checkpoint itself holds as the sentinel's exact bits would read as unwritten; no
training computes that NaN payload. Integer tensors, ShardedTensorFactory data and requests with
more than one dimension are not probed (`Probe.unchecked` counts them; the trace's ranges are
1-D global offsets, as ckptsim's model reports them).

Trace field (replay/PLAN_AND_TRACE.md): the `after_load` event's `unwritten`, a list of
{"key", "range": [a, b], "missing_key"} sorted by key and range; `missing_key` is true where the
checkpoint's metadata has no such key at all.
"""

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

# The sentinel's bits per floating dtype, as the signed integer of the same width (a quiet NaN
# with an unusual payload; 0x5A5A...).
SENTINEL_BITS = {
    "float32": 0x7FC05A5A,
    "float64": 0x7FF85A5A5A5A5A5A,
    "float16": 0x7E5A,
    "bfloat16": 0x7FDA,
}


def ranges_of(flags: Sequence[bool]) -> List[Tuple[int, int]]:
    """Maximal [a, b) runs of True in `flags`."""
    out: List[Tuple[int, int]] = []
    start = None
    for i, f in enumerate(flags):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(flags)))
    return out


def entries(key: str, offset: int, local: Sequence[Tuple[int, int]], missing_key: bool) -> List[Dict[str, Any]]:
    """The trace entries of one request's unwritten local ranges, in the key's global space."""
    return [{"key": key, "range": [offset + a, offset + b], "missing_key": bool(missing_key)} for a, b in local]


def sort_entries(items: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return sorted(items, key=lambda e: (e["key"], e["range"][0], e["range"][1]))


def _walk(obj: Any, path: Tuple[Any, ...] = ()) -> Iterator[Tuple[Tuple[Any, ...], Any]]:
    """(path, leaf) of every leaf of nested dicts and lists, in order."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, path + (i,))
    else:
        yield path, obj


def _at(obj: Any, path: Tuple[Any, ...]) -> Any:
    for k in path:
        if isinstance(obj, dict):
            if k not in obj:
                return None
            obj = obj[k]
        elif isinstance(obj, list):
            if not isinstance(k, int) or k >= len(obj):
                return None
            obj = obj[k]
        else:
            return None
    return obj


class Probe:
    """One load's probe: `Probe(sd)` before `dist_checkpointing.load(sd, dir)`, then
    `probe.finish(loaded, checkpoint_keys)` with what it returned."""

    def __init__(self, sharded_state_dict: Dict[str, Any]) -> None:
        import torch
        from megatron.core.dist_checkpointing.mapping import ShardedTensor

        self._torch = torch
        self.unchecked = 0
        self._probed: List[Tuple[Tuple[Any, ...], Any, Any, int]] = []  # path, ST, copy, bits
        candidates = []
        for path, leaf in _walk(sharded_state_dict):
            if not isinstance(leaf, ShardedTensor):
                if type(leaf).__name__ == "ShardedTensorFactory":
                    self.unchecked += 1
                continue
            data = leaf.data
            name = str(data.dtype).replace("torch.", "") if data is not None else ""
            if data is None or name not in SENTINEL_BITS or data.dim() != 1:
                self.unchecked += 1
                continue
            candidates.append((path, leaf, SENTINEL_BITS[name]))
        # Every copy before any fill: two requests may share memory.
        copies = [leaf.data.detach().clone() for _, leaf, _ in candidates]
        with torch.no_grad():
            for (path, leaf, bits), copy in zip(candidates, copies):
                self._fill(leaf.data, bits)
                self._probed.append((path, leaf, copy, bits))

    def _int_view(self, t: Any) -> Any:
        torch = self._torch
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.view(width)

    def _fill(self, t: Any, bits: int) -> None:
        self._int_view(t).fill_(bits)

    def finish(self, loaded: Dict[str, Any], checkpoint_keys: Optional[set]) -> List[Dict[str, Any]]:
        """The unwritten ranges (trace entries), then every probed element restored. Every mask is
        taken before anything is restored: two requests may share memory."""
        torch = self._torch
        out: List[Dict[str, Any]] = []
        found = []
        with torch.no_grad():
            for path, st, copy, bits in self._probed:
                targets = [st.data]
                t = _at(loaded, path)
                if isinstance(t, torch.Tensor) and t is not st.data and t.shape == copy.shape \
                        and t.dtype == copy.dtype:
                    targets.insert(0, t)  # the loaded tensor, when the load replaced the request's
                masks = [self._int_view(x) == bits for x in targets]
                if bool(masks[0].any()):
                    missing = checkpoint_keys is not None and st.key not in checkpoint_keys
                    flags = masks[0].cpu().tolist()
                    out.extend(entries(st.key, int(st.global_offset[0]), ranges_of(flags), missing))
                found.append((targets, masks, copy))
            for targets, masks, copy in found:
                for x, mask in zip(targets, masks):
                    if bool(mask.any()):
                        x[mask] = copy.to(x.device)[mask]
        self._probed = []
        return sort_entries(out)


def checkpoint_keys(checkpoint_dir: str) -> Optional[set]:
    """The keys of a torch_dist checkpoint's metadata, or None when it cannot be read."""
    try:
        from torch.distributed.checkpoint import FileSystemReader

        return set(FileSystemReader(str(checkpoint_dir)).read_metadata().state_dict_metadata.keys())
    except Exception:  # noqa: BLE001 - then missing_key is left false, and the notes say why
        return None

#!/usr/bin/env python3
"""Check that a common.pt written by ckptsim's pickle codec loads in Python.

Usage:
    CKPTSIM_PICKLE_SAMPLE_OUT=/tmp/common.pt build/ckptsim_tests \
        --gtest_filter=PickleCodec.WritesSampleForPythonCheck
    python3 tests/python/read_common.py /tmp/common.pt            # needs PyTorch
    python3 tests/python/read_common.py --stdlib /tmp/common.pt   # no PyTorch: structure only

The torch mode is the real check: torch.load(path, weights_only=True), the way HEAD
Megatron loads common state (spec 9.4); it fails if the pickle names a global that the
weights-only unpickler does not allow. The --stdlib mode replays the pickle with the
standard library, resolving only the globals that the weights-only unpickler allows (tensor
data is not read), so the structure can be checked where torch is absent.
Exit status 0 on success; the tree is printed either way.
"""
import io
import pickle
import pickletools
import pprint
import sys
import zipfile

# Globals our codec may name; all are in torch/_weights_only_unpickler.py's allowlist.
ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"),
    ("collections", "OrderedDict"),
} | {("torch", f"{t}Storage") for t in (
    "Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool")}


def pickle_bytes(path):
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith("/data.pkl")]
        assert len(names) == 1, f"expected one data.pkl record, found {z.namelist()}"
        return z.read(names[0])


def globals_named(data):
    return sorted({tuple(arg.split(" ", 1)) for op, arg, _ in pickletools.genops(data)
                   if op.name in ("GLOBAL", "STACK_GLOBAL")})


class FakeTensor:
    def __init__(self, storage, offset, size, stride, *rest):
        self.dtype, self.shape = storage, tuple(size)

    def __repr__(self):
        return f"tensor(<{self.dtype} {list(self.shape)}>)"


class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not weights_only-allowed")
        if name == "_rebuild_tensor_v2":
            return FakeTensor
        if name == "OrderedDict":
            import collections
            return collections.OrderedDict
        return name  # a storage type: keep its name for printing

    def persistent_load(self, pid):
        typename, storage_type, key, location, numel = pid
        assert typename == "storage" and location == "cpu", pid
        return storage_type.replace("Storage", "").lower()


def main(argv):
    stdlib = "--stdlib" in argv
    paths = [a for a in argv[1:] if a != "--stdlib"]
    if len(paths) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    path = paths[0]
    data = pickle_bytes(path)
    named = globals_named(data)
    print("globals:", [".".join(g) for g in named])
    bad = [g for g in named if g not in ALLOWED]
    if bad:
        print("NOT weights_only-allowed:", bad, file=sys.stderr)
        return 1
    if stdlib:
        tree = RestrictedUnpickler(io.BytesIO(data)).load()
    else:
        import torch
        tree = torch.load(path, weights_only=True)
    pprint.pprint(tree, width=100, sort_dicts=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

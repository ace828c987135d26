#!/usr/bin/env python3
"""compare-runs.py: compares two toy run bundles (the data-parallel check of
tests/mpi/test-dp.sh, docs/distributed.md): the step losses of
events.jsonl, the eval losses, and the weights of the final checkpoints.

    compare-runs.py RUN_A RUN_B [--loss-tol 1e-4] [--weight-tol 1e-4] [--common-evals]

Prints one JSON line {steps, max_loss_abs, max_loss_rel, max_eval_abs,
max_weight_abs, max_weight_rel, ...} and exits 1 when a difference passes
its tolerance (losses: relative; weights: max |a-b| / max |a| per tensor).
--common-evals compares the evaluations both runs made (a resumed run has
the "final" evaluation of its first part too).
Reads GGUF with its own few lines (f32 tensors; llama.cpp's layout)."""
import json
import struct
import sys

import numpy as np

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_tensors(path):
    buf = open(path, "rb").read()
    pos = [4]

    def rd(fmt):
        v = struct.unpack_from(fmt, buf, pos[0])[0]
        pos[0] += struct.calcsize(fmt)
        return v

    def rstr():
        n = rd("<Q")
        s = buf[pos[0]:pos[0] + n]
        pos[0] += n
        return s.decode("utf-8", "replace")

    def rval(t):
        if t in SCALAR:
            return rd(SCALAR[t])
        if t == 8:
            return rstr()
        if t == 9:
            et, n = rd("<I"), rd("<Q")
            return [rval(et) for _ in range(n)]
        raise ValueError(f"{path}: GGUF value type {t}")

    assert buf[:4] == b"GGUF", path
    rd("<I")
    n_tensors, n_kv = rd("<Q"), rd("<Q")
    kv = {}
    for _ in range(n_kv):
        k = rstr()
        kv[k] = rval(rd("<I"))
    infos = []
    for _ in range(n_tensors):
        name = rstr()
        ne = [rd("<Q") for _ in range(rd("<I"))]
        typ, off = rd("<I"), rd("<Q")
        infos.append((name, ne, typ, off))
    align = kv.get("general.alignment", 32)
    base = (pos[0] + align - 1) // align * align
    out = {}
    for name, ne, typ, off in infos:
        if typ != 0:
            continue  # f32 only: what the trainer writes
        out[name] = np.frombuffer(buf, dtype="<f4", count=int(np.prod(ne)), offset=base + off)
    return out


def events(run):
    steps, evals = {}, {}
    for line in open(f"{run}/events.jsonl"):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("kind") == "step" and e.get("phase", "train") == "train":
            steps[e["step"]] = e["loss"]
        elif e.get("kind") == "eval":
            evals[(e["step"], e.get("name"))] = e["loss"]
    return steps, evals


def main():
    args = sys.argv[1:]
    loss_tol, weight_tol = 1e-4, 1e-4
    if "--loss-tol" in args:
        i = args.index("--loss-tol")
        loss_tol = float(args[i + 1])
        del args[i:i + 2]
    if "--weight-tol" in args:
        i = args.index("--weight-tol")
        weight_tol = float(args[i + 1])
        del args[i:i + 2]
    common = "--common-evals" in args
    if common:
        args.remove("--common-evals")
    a, b = args
    sa, ea = events(a)
    sb, eb = events(b)
    assert sa.keys() == sb.keys() and sa, f"different steps: {len(sa)} vs {len(sb)}"
    labs = [abs(sa[k] - sb[k]) for k in sa]
    lrel = [abs(sa[k] - sb[k]) / max(abs(sa[k]), 1e-12) for k in sa]
    if common:
        keep = ea.keys() & eb.keys()
        ea, eb = {k: ea[k] for k in keep}, {k: eb[k] for k in keep}
    assert ea.keys() == eb.keys(), f"different evals: {sorted(ea)} vs {sorted(eb)}"
    eabs = [abs(ea[k] - eb[k]) for k in ea] or [0.0]
    wa = gguf_tensors(f"{a}/weights/latest")
    wb = gguf_tensors(f"{b}/weights/latest")
    assert wa.keys() == wb.keys() and wa, "different tensors"
    wabs = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa)
    wrel = max(float(np.max(np.abs(wa[k] - wb[k])) / max(np.max(np.abs(wa[k])), 1e-12)) for k in wa)
    identical = all(np.array_equal(wa[k], wb[k]) for k in wa)
    r = {"steps": len(sa), "max_loss_abs": max(labs), "max_loss_rel": max(lrel), "first_loss_rel": lrel[0],
         "last_loss_rel": lrel[-1], "max_eval_abs": max(eabs), "max_weight_abs": wabs, "max_weight_rel": wrel,
         "weights_bit_identical": identical, "loss_tol": loss_tol, "weight_tol": weight_tol}
    print(json.dumps(r))
    ok = max(lrel) <= loss_tol and wrel <= weight_tol and max(eabs) <= loss_tol * 10
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

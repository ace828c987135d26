#!/usr/bin/env python3
"""cuda_report.py: the JSON lines of bench/bench-cuda.sh as two tables, with
issue 9's targets: BF16 training ahead of eager PyTorch and within 1.2x of
torch.compile's step time; decode tokens/s against eager PyTorch; and what
the tensor-core attention gains over the SIMT kernels (TOY_CUDA_ATTN=simt).
Lines that failed or were skipped are listed at the end.
    python3 bench/cuda_report.py bench-cuda.jsonl      (or the lines on stdin)
"""
import json
import sys


def read(src):
    rows, notes = [], []
    for line in src:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except ValueError:
            notes.append("unreadable: " + line[:100])
            continue
        if "failed" in r or "skipped" in r or "tokens_per_s" not in r:
            notes.append(json.dumps(r)[:160])
        else:
            rows.append(r)
    return rows, notes


def pick(rows, **want):
    for r in rows:
        if all(r.get(k) == v for k, v in want.items()):
            return r
    return None


def ratio(a, b):
    return "%.2fx" % (a / b) if a and b else "-"


def main():
    src = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin
    rows, notes = read(src)
    train = [r for r in rows if r["bench"] == "train"]
    print("training (BF16)      B x T      toy tok/s    MFU | eager tok/s  toy/eager | compile tok/s  toy/compile"
          " | simt-attn tok/s  tc gain")
    for model in sorted({r["model"] for r in train}):
        toy = pick(train, model=model, impl="toy", attn="auto") or pick(train, model=model, impl="toy")
        if not toy:
            continue
        eager = pick(train, model=model, impl="torch-eager")
        comp = pick(train, model=model, impl="torch-compile")
        simt = pick(train, model=model, impl="toy", attn="simt")
        t = toy["tokens_per_s"]
        e = eager["tokens_per_s"] if eager else 0
        c = comp["tokens_per_s"] if comp else 0
        s = simt["tokens_per_s"] if simt else 0
        verdict = []
        if e:
            verdict.append("ahead of eager" if t >= e else "BEHIND eager")
        if c:
            verdict.append("within 1.2x of compile" if t * 1.2 >= c else "MORE than 1.2x slower than compile")
        print("%-18s %4d x %-5d %11.0f %6.1f%% | %11.0f %10s | %13.0f %12s | %15.0f %8s   %s" %
              (model, toy["B"], toy["T"], t, 100 * toy.get("mfu", 0), e, ratio(t, e), c, ratio(t, c), s,
               ratio(t, s), "; ".join(verdict)))
    dec = [r for r in rows if r["bench"] == "decode"]
    print()
    print("decode               weights    toy tok/s | eager tok/s   toy/eager")
    for r in dec:
        if r["impl"] != "toy":
            continue
        e = pick(dec, model=r["model"], impl="torch-eager", weights=r["weights"])
        et = e["tokens_per_s"] if e else 0
        print("%-20s %-8s %11.1f | %11.1f %11s" % (r["model"], r["weights"], r["tokens_per_s"], et,
                                                   ratio(r["tokens_per_s"], et)))
    if notes:
        print()
        print("failed or skipped:")
        for n in notes:
            print("  " + n)


if __name__ == "__main__":
    main()

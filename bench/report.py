#!/usr/bin/python3
"""Joins toy's and PyTorch's JSON lines (stdin) into a table of ratios and
writes them to bench-results.json (the path in argv[1])."""
import json
import sys

rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
out = {"gemm": [], "ops": {}}
for r in rows:
    if r["bench"] == "gemm":
        out["gemm"].append(r)
        print(f"gemm {r['shape']:>16} {r['threads']} threads: engine {r['engine_gflops']:7.1f} GFLOPS, "
              f"BLAS direct {r['blas_gflops']:7.1f} GFLOPS, overhead {r['overhead_pct']:+.1f}%")
    elif r["bench"] == "gemm_bf16":
        out["gemm"].append(r)
        print(f"gemm {r['shape']:>16} {r['threads']} threads: bf16 weights {r['bf16_gflops']:7.1f} GFLOPS "
              f"({r['vs_f32_sgemm']:.2f}x f32 sgemm)")
    elif r["bench"] in ("train", "infer"):
        out.setdefault(r["bench"], {}).setdefault(r["shape"], []).append(r)
    else:
        out["ops"].setdefault(r["bench"], {}).update(r)
for name, r in out["ops"].items():
    base = out["ops"].get(name.removesuffix("_bf16"), {})  # bf16 products: against PyTorch's f32 op
    if "toy_ms" in r and "torch_ms" not in r and "torch_ms" in base:
        r["torch_f32_ms"] = base["torch_ms"]
        r["ratio"] = r["toy_ms"] / base["torch_ms"]
        print(f"{name:>14} fwd+bwd: toy {r['toy_ms']:8.3f} ms, PyTorch f32 {base['torch_ms']:8.3f} ms, "
              f"toy/PyTorch time {r['ratio']:.2f}x")
    elif "toy_ms" in r and "torch_ms" in r:
        r["ratio"] = r["toy_ms"] / r["torch_ms"]
        what = "draw" if name.startswith("sample") else "fwd+bwd"
        print(f"{name:>14} {what:>7}: toy {r['toy_ms']:8.3f} ms, PyTorch {r['torch_ms']:8.3f} ms, "
              f"toy/PyTorch time {r['ratio']:.2f}x")

def spread(xs, fmt):
    """the range over rounds, when there were several"""
    return f" [rounds {fmt.format(min(xs))}-{fmt.format(max(xs))}]" if len(xs) > 1 else ""


# several rounds (bench/run.sh): the best of each side, and its range
for shape, rs in out.get("train", {}).items():
    torch_all = [r["torch_s"] for r in rs if "torch_s" in r]
    torch_s = min(torch_all) if torch_all else None
    for dtype in dict.fromkeys(r["dtype"] for r in rs if "toy_s" in r):
        mine = [r for r in rs if "toy_s" in r and r["dtype"] == dtype]
        r = min(mine, key=lambda x: x["toy_s"])
        ratio = f", toy/PyTorch time {r['toy_s'] / torch_s:.2f}x" if torch_s else ""
        print(f"train {shape} {r['dtype']:>4}: toy {r['toy_s']:.3f} s/step ({r['toy_tok_s']:.0f} tok/s, "
              f"{r['toy_gflops']:.0f} GFLOPS){ratio}" + spread([x["toy_s"] for x in mine], "{:.3f}"))
    if torch_s:
        print(f"train {shape}  torch: {torch_s:.3f} s/step (f32, OMP_WAIT_POLICY=passive)"
              + spread(torch_all, "{:.3f}"))
for shape, rs in out.get("infer", {}).items():
    peers = [r for r in rs if "torch_prefill_tok_s" in r]
    t = {k: max(r[k] for r in peers) for k in ("torch_prefill_tok_s", "torch_decode_tok_s")} if peers else {}
    for dtype in dict.fromkeys(r["dtype"] for r in rs if "prefill_tok_s" in r):
        mine = [r for r in rs if "prefill_tok_s" in r and r["dtype"] == dtype]
        p = max(x["prefill_tok_s"] for x in mine)
        r = max(mine, key=lambda x: x["decode_tok_s"] / x["decode_bound_tok_s"])  # with its own bound
        d = max(x["decode_tok_s"] for x in mine)
        print(f"infer {shape} {dtype}: prefill {p:.0f} tok/s"
              + (f" ({p / t['torch_prefill_tok_s']:.2f}x PyTorch)" if t else "")
              + f", decode {d:.1f} tok/s"
              + (f" ({d / t['torch_decode_tok_s']:.2f}x PyTorch)" if t else "")
              + f", best share of its bound: {r['decode_tok_s']:.1f} tok/s of {r['decode_bound_tok_s']:.1f}"
              + f" (max(read {r['read_gbs']:.1f}, triad {r['triad_gbs']:.1f}) GB/s / {r['weight_mb']:.0f} MB)"
              + f" = {100 * r['decode_tok_s'] / r['decode_bound_tok_s']:.0f}%"
              + (f"; {100 * r['decode_tok_s'] / r['decode_bound_sustained_tok_s']:.0f}% of the read rate sustained"
                 f" as long as the run ({r['sustained_read_gbs']:.1f} GB/s)" if r.get("decode_bound_sustained_tok_s") else "")
              + spread([x["prefill_tok_s"] for x in mine], "{:.0f}"))
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)

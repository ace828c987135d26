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
    if "toy_ms" in r and "torch_ms" in r:
        r["ratio"] = r["toy_ms"] / r["torch_ms"]
        print(f"{name:>10} fwd+bwd: toy {r['toy_ms']:8.3f} ms, PyTorch {r['torch_ms']:8.3f} ms, "
              f"toy/PyTorch time {r['ratio']:.2f}x")
for shape, rs in out.get("train", {}).items():
    torch_s = next((r["torch_s"] for r in rs if "torch_s" in r), None)
    for r in rs:
        if "toy_s" in r:
            ratio = f", toy/PyTorch time {r['toy_s'] / torch_s:.2f}x" if torch_s else ""
            print(f"train {shape} {r['dtype']:>4}: toy {r['toy_s']:.3f} s/step ({r['toy_tok_s']:.0f} tok/s, "
                  f"{r['toy_gflops']:.0f} GFLOPS){ratio}")
    if torch_s:
        print(f"train {shape}  torch: {torch_s:.3f} s/step (f32, OMP_WAIT_POLICY=passive)")
for shape, rs in out.get("infer", {}).items():
    t = next((r for r in rs if "torch_prefill_tok_s" in r), {})
    for r in rs:
        if "prefill_tok_s" in r:
            print(f"infer {shape} {r['dtype']}: prefill {r['prefill_tok_s']:.0f} tok/s"
                  + (f" ({r['prefill_tok_s'] / t['torch_prefill_tok_s']:.2f}x PyTorch)" if t else "")
                  + f", decode {r['decode_tok_s']:.1f} tok/s"
                  + (f" ({r['decode_tok_s'] / t['torch_decode_tok_s']:.2f}x PyTorch)" if t else "")
                  + f", bound {r['decode_bound_tok_s']:.1f} tok/s (max(read {r['read_gbs']:.1f}, triad {r['triad_gbs']:.1f}) GB/s"
                  + f" / {r['weight_mb']:.0f} MB)"
                  + f" = {100 * r['decode_tok_s'] / r['decode_bound_tok_s']:.0f}% of bound")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)

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
    else:
        out["ops"].setdefault(r["bench"], {}).update(r)
for name, r in out["ops"].items():
    if "toy_ms" in r and "torch_ms" in r:
        r["ratio"] = r["toy_ms"] / r["torch_ms"]
        print(f"{name:>10} fwd+bwd: toy {r['toy_ms']:8.3f} ms, PyTorch {r['torch_ms']:8.3f} ms, "
              f"toy/PyTorch time {r['ratio']:.2f}x")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)

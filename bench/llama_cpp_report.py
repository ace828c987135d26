"""bench/llama_cpp_report.py: pairs bench-llama `file` lines with
bench/llama_cpp.mjs lines (same GGUF, same thread count) and prints the
ratios and each side's share of the decode bound measured in the same run.
Usage: ... | llama_cpp_report.py OUT.json"""
import json
import sys

rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
toy = {(r["dtype"], r["threads"]): r for r in rows if r["bench"] == "file"}
ref = {(r["dtype"], r["threads"]): r for r in rows if r["bench"] == "llama_cpp"}
order = ["f32", "f16", "q8_0", "q4_0"]
out = []


def shape(dtype):  # M (SmolLM2-135M), K (its width-512 twin), E (a mixture of experts)
    return "M" if dtype in order else "E" if dtype.startswith("moe-") else "K"


for key in sorted(toy, key=lambda k: (order.index(k[0]) if k[0] in order else 9, k[1])):
    a, b = toy[key], ref.get(key)
    if not b:
        print(f"llama.cpp {shape(key[0])} {key[0]} {key[1]}t: no llama.cpp figure")
        continue
    bound = a["decode_bound_tok_s"]
    ap, bp, ad, bd = a["prefill_tok_s"], b["prefill_tok_s"], a["decode_tok_s"], b["decode_tok_s"]
    print(f"llama.cpp {shape(key[0])} {key[0]:6s} {key[1]}t: prefill toy {ap:7.1f} vs {bp:7.1f} tok/s ({ap / bp:.2f}x); "
          f"decode toy {ad:6.1f} ({100 * ad / bound:3.0f}% of bound {bound:.0f}) vs {bd:6.1f} ({100 * bd / bound:3.0f}%) "
          f"tok/s ({ad / bd:.2f}x)"
          + (f"; toy {100 * ad / a['decode_bound_sustained_tok_s']:.0f}% of the sustained read bound"
             if a.get("decode_bound_sustained_tok_s") else ""))
    out.append({"dtype": key[0], "threads": key[1], "toy": a, "llama_cpp": b})
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)

#!/usr/bin/env python3
"""dp-model.py: the communication-cost model of data-parallel training in
docs/distributed.md: bytes all-reduced per step against compute time per
step, and the efficiency that follows at 8, 64 and 512 GPUs.

    dp-model.py [--calibrate MS_PER_13MB [COMPUTE_MS BUCKETS]]   (prints the tables of the doc)

Per optimizer step, every rank all-reduces S = 4 * P bytes (f32 gradients;
2 * P if they were bf16). A hierarchical all-reduce (what NCCL does on
NVLink within a node and InfiniBand across nodes, and what the ring
algorithm gives within one node) moves, per GPU,
    2 (g-1)/g * S    over NVLink (reduce-scatter + all-gather in the node),
    2 (n-1)/n * S/g  over its own InfiniBand NIC (across the n nodes),
plus a latency of about 2 log2(N) hops per bucket. Compute per step is
6 * P * tokens_per_gpu FLOPs at a model FLOP utilization (MFU) of the peak.
Efficiency = compute / (compute + exposed communication), where exposed is
all of it when the all-reduce follows the backward pass (`--dp-overlap 0`),
and what the backward pass (2/3 of the compute) cannot hide when buckets are
reduced while it runs (`--dp-overlap 1`, toy's default): at least the last
bucket, which can only start when the backward pass ends.

ZeRO-1 (`--zero 1`) moves the same bytes (a reduce-scatter and an all-gather
are the two halves of a ring all-reduce) but the all-gather of the
parameters follows the optimizer step and is not hidden by the backward
pass: it adds (g-1)/g * S / BW_NVL (+ the IB half) per step unless the next
forward pass overlaps it. What it buys is memory per GPU: weights and
gradients (4P + 4P in f32) plus Adam's moments 8P / N instead of 8P."""
import math
import sys

PEAK = 989e12     # H100/H200 SXM dense bf16 FLOP/s
MFU = 0.40        # model FLOP utilization a good trainer reaches
BW_NVL = 350e9    # NVLink 4 all-reduce bus bandwidth per GPU, achieved (of 450 GB/s per direction)
BW_IB = 45e9      # InfiniBand NDR 400 Gb/s, one NIC per GPU, achieved (of 50 GB/s)
HOP = 8e-6        # seconds per latency hop
BUCKET = 25e6     # bytes per all-reduce message
G = 8             # GPUs per node


def comm_s(S, N):
    g = min(G, N)
    n = max(1, N // G)
    t = 2 * (g - 1) / g * S / BW_NVL
    if n > 1:
        t += 2 * (n - 1) / n * (S / g) / BW_IB
    buckets = math.ceil(S / BUCKET)
    return t + buckets * 2 * math.log2(N) * HOP


def eff(P, tokens_per_gpu, N):
    """(compute s, all-reduce s, efficiency after backward, efficiency overlapped)"""
    S = 4 * P
    comp = 6 * P * tokens_per_gpu / (PEAK * MFU)
    c = comm_s(S, N)
    last = c * min(1.0, BUCKET / S)  # the last bucket starts when the backward pass ends
    exposed = min(c, max(last, c - 2 / 3 * comp))
    return comp, c, comp / (comp + c), comp / (comp + exposed)


def memory_gb(P, N, zero):
    """f32 weights + f32 gradients + Adam moments (sharded over N with ZeRO-1), per GPU, in GB"""
    return (4 * P + 4 * P + 8 * P / (N if zero else 1)) / 1e9


def main():
    if "--calibrate" in sys.argv:  # what this machine's shared memory gives, for the doc's check
        ms = float(sys.argv[sys.argv.index("--calibrate") + 1])
        S = 13.1e6
        print(f"measured: {S / 1e6:.1f} MB in {ms:.1f} ms -> bus bandwidth {S / (ms / 1e3) / 1e9:.2f} GB/s "
              "(2 ranks: 2(N-1)/N = 1)")
        i = sys.argv.index("--calibrate")
        if len(sys.argv) > i + 3:  # the same model's prediction for overlap on this machine
            comp, nb = float(sys.argv[i + 2]), int(sys.argv[i + 3])
            exposed = min(ms, max(ms / nb, ms - 2 / 3 * comp))
            print(f"overlap, {comp:.0f} ms of compute per rank, {nb} buckets: exposed {ms:.1f} -> {exposed:.1f} ms "
                  f"(efficiency {comp / (comp + ms) * 100:.0f}% -> {comp / (comp + exposed) * 100:.0f}%), if the "
                  "all-reduce took no compute time from the ranks")
    P = 134.5e6  # SmolLM2-135M; the efficiencies hardly depend on P (both sides scale with it)
    print("Efficiency by tokens per GPU per step (SmolLM2-135M; after backward / overlapped):\n")
    print("| GPUs | links | 2048 tokens | 8192 tokens | 32768 tokens |")
    print("|---:|---|---:|---:|---:|")
    for N in (8, 64, 512):
        links = "NVLink" if N <= G else f"NVLink + IB, {N // G} nodes"
        cells = []
        for tok in (2048, 8192, 32768):
            _, _, e, eo = eff(P, tok, N)
            cells.append(f"{e * 100:.0f}% / {eo * 100:.0f}%")
        print(f"| {N} | {links} | " + " | ".join(cells) + " |")
    print("\nAbsolute times at 32768 tokens per GPU per step:\n")
    print("| model | gradients | compute | all-reduce 8 / 64 / 512 GPUs |")
    print("|---|---:|---:|---:|")
    for name, P in (("SmolLM2-135M", 134.5e6), ("TinyLlama-1.1B", 1.1e9), ("Llama-3-8B", 8.0e9)):
        comp = eff(P, 32768, 8)[0]
        cs = " / ".join(f"{eff(P, 32768, N)[1] * 1e3:.0f}" for N in (8, 64, 512))
        print(f"| {name} | {4 * P / 1e9:.2f} GB | {comp * 1e3:.0f} ms | {cs} ms |")
    print("\nMemory per GPU, f32 weights + gradients + AdamW moments (activations not counted):\n")
    print("| model | plain DP | ZeRO-1, 8 GPUs | ZeRO-1, 64 GPUs | ZeRO-1, 512 GPUs |")
    print("|---|---:|---:|---:|---:|")
    for name, P in (("SmolLM2-135M", 134.5e6), ("TinyLlama-1.1B", 1.1e9), ("Llama-3-8B", 8.0e9)):
        z = " | ".join(f"{memory_gb(P, N, True):.1f} GB" for N in (8, 64, 512))
        print(f"| {name} | {memory_gb(P, 8, False):.1f} GB | {z} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""mlakit's prefill against cuDNN SDPA in one process, on the same tensors, per shape.

mlakit.mla_prefill (the Python package over the CUDA build: d_qk 192 = k_nope 128 | k_pe 64 with
k_pe shared by the heads, d_v 128, bf16, varlen, bottom-right causal) and
torch.nn.functional.scaled_dot_product_attention restricted to SDPBackend.CUDNN_ATTENTION (k_pe
broadcast to every head) run on the same values, on torch's current stream, timed with CUDA
events: 3 warm-up calls, then the median of 10 timed calls, each on the next of (up to) 3 copies
of the inputs so that no call finds its inputs in L2; mlakit's and cuDNN's timings alternate for 3
rounds (--rounds), and each side's time is its median over the rounds, the ratio the median of the
rounds' ratios, so that the GPU's clock drift under sustained load (up to 10 % between runs at h128)
falls on both sides alike. The outputs of the two are compared
(relative L2, printed per row); above 2e-2 the script says so and exits 1. TF/s is mlakit's,
counting useful work: 2 * H * sum(L (L + 1) / 2) * (192 + 128) causal, 2 * H * Lq * Lk * (192 +
128) non-causal. mlakit / cuDNN > 1 means mlakit is slower.

The varlen batch runs through cuDNN both as one ragged (THD) call when torch allows it (a jagged
nested tensor; recent torch gates that experimental path behind
TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED=1, which this script sets unless the environment already has
it) and as one SDPA call per request; cuDNN's time is the faster of the two, and the row names it
("cudnn path", with both times in the notes): torch 2.11's ragged path took 84 ms on the H200 for
what the loop does in a few (2026-12-06), so either alone could flatter mlakit.
--cudnn-varlen nested / loop times one path only.

On the GPU machine. Build here (docs/device.md), with the C library for Python:
    JOBS=2 bash scripts/device/build_here.sh
    cmake --build --preset cuda --target mlakit_c
    bash scripts/device/collect.sh
then one device `run` call (kind nvidia-h200, carry [".devbin"], timeout_s 600):
    tar -C .devbin -xzf .devbin/programs.tar.gz && mkdir -p /tmp/mlakit-devlib &&
    tar -C /tmp/mlakit-devlib -xzf .devbin/lib.tar.gz &&
    LD_LIBRARY_PATH=/tmp/mlakit-devlib/lib:/usr/local/cuda/lib64 \
    MLAKIT_LIBRARY=$PWD/.devbin/libmlakit_c.so PYTHONPATH=$PWD/python \
    python3 bench/prefill_vs_cudnn.py --commit "$(cat .devbin/COMMIT)" \
        --json "$OUT/prefill.json" | tee "$OUT/prefill.md"
and copy prefill.md / prefill.json to bench/results/<date>-h200-prefill.md / .json. With the
package installed over a CUDA build (`MLAKIT_CUDA=ON pip install ./python`):
    python bench/prefill_vs_cudnn.py --commit "$(git rev-parse --short HEAD)" --json out.json
    python bench/prefill_vs_cudnn.py --quick        # lengths / 16, fewer repetitions

Without a GPU (checks the script's logic: CPU tensors, mlakit's CPU op, SDPA's math backend
instead of cuDNN, wall-clock timing; the varlen batch falls back to the per-request loop):
    python3 -m venv /tmp/venv && . /tmp/venv/bin/activate
    pip install torch==2.5.1 && MLAKIT_CUDA=OFF pip install ./python    # torch: checked with 2.5.1
    python bench/prefill_vs_cudnn.py --device cpu --quick               # about 2 minutes, 2 cores

Exit status: 0 when every row's outputs agree, 1 when one does not, 2 when torch, CUDA, cuDNN or
a CUDA build of mlakit is missing.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
import types

# Read by torch once, at its first SDPA call on nested tensors: set before torch is imported.
os.environ.setdefault("TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED", "1")

NOPE, ROPE, DV = 128, 64, 128  # MLA head sizes (DeepSeek V2/V3): k_nope | k_pe, and v
DQK = NOPE + ROPE  # 192: q and k width
SCALE = DQK**-0.5  # SDPA's default softmax scale for a 192-wide q, passed to both explicitly
TOLERANCE = 2e-2  # relative L2 above which the outputs disagree (two bf16 kernels: ~1e-3)
COPIES = 3  # input copies rotated per repetition: H200 L2 is 60 MiB, each copy >= 100 MB
MEMORY_SHARE = 0.6  # share of free memory the copies may take: SDPA's outputs, cuDNN's workspace
VARLEN_SEED = 0  # fixed lengths of the varlen batch, so every run times the same batch
QUICK_DIVISOR = 16  # --quick: every length / 16 (h128 1 x 16384 -> 1 x 1024)
CHECK_CHUNK = 4096  # tokens per f32 chunk of the relative-L2 sum (bounds its temporaries)


def die(message, code=2):
    print(f"prefill_vs_cudnn: {message}", file=sys.stderr)
    sys.exit(code)


class Case:
    """One prefill shape: request b has q_lens[b] queries over k_lens[b] keys, `heads` heads."""

    def __init__(self, label, heads, q_lens, k_lens, causal):
        # mlakit's causal is bottom-right, torch's cuDNN causal top-left: equal only for lq == lk.
        if causal and list(q_lens) != list(k_lens):
            raise ValueError(f"{label}: causal cases need lq == lk per request")
        self.label, self.heads, self.causal = label, heads, causal
        self.q_lens, self.k_lens = list(q_lens), list(k_lens)
        self.dense = len(set(q_lens)) == 1 and len(set(k_lens)) == 1  # one [B, H, L, D] batch

    def flops(self):
        if self.causal:
            work = sum(n * (n + 1) // 2 for n in self.q_lens)
        else:
            work = sum(lq * lk for lq, lk in zip(self.q_lens, self.k_lens))
        return 2 * self.heads * work * (DQK + DV)


def make_cases(quick):
    import numpy as np

    # The shapes of PERF.md's mlakit/cuDNN table, h128 1 x 16384 and a varlen batch (issue
    # "Hopper prefill v2", item 4).
    d = QUICK_DIVISOR if quick else 1
    cases = []
    for heads, batch, length in [(16, 4, 4096), (16, 16, 1024), (128, 4, 4096), (128, 16, 1024)]:
        n = length // d
        cases.append(Case(f"h{heads} {batch}x{n} causal", heads, [n] * batch, [n] * batch, True))
    lq, lk = 4096 // d, 16384 // d  # one request: 4096 new queries over 16384 keys
    cases.append(Case(f"h128 q{lq} k{lk} non-causal", 128, [lq], [lk], False))
    n = 16384 // d
    cases.append(Case(f"h128 1x{n} causal", 128, [n], [n], True))
    lo, hi, count = 64 // d, 4096 // d, 32  # 32 requests, lengths uniform in [64, 4096]
    lens = np.random.default_rng(VARLEN_SEED).integers(lo, hi + 1, size=count).tolist()
    cases.append(Case(f"h128 varlen {count}x[{lo},{hi}] causal", 128, lens, lens, True))
    return cases


def cumulative(lens, torch, device, dtype):
    """[B + 1] offsets 0, l0, l0 + l1, ... on `device`."""
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=dtype, device=device)


def make_inputs(case, torch, device, seed):
    """One copy of the inputs in mlakit's layout, token-major; out starts as NaN so a row the op
    leaves unwritten fails the check."""
    bf16 = torch.bfloat16
    g = torch.Generator(device=device).manual_seed(seed)
    T, S, H = sum(case.q_lens), sum(case.k_lens), case.heads
    x = types.SimpleNamespace()
    x.q = torch.randn(T, H, DQK, generator=g, device=device, dtype=bf16)  # [T, H, 192]
    x.k_nope = torch.randn(S, H, NOPE, generator=g, device=device, dtype=bf16)  # [S, H, 128]
    x.k_pe = torch.randn(S, ROPE, generator=g, device=device, dtype=bf16)  # [S, 64], all heads
    x.v = torch.randn(S, H, DV, generator=g, device=device, dtype=bf16)  # [S, H, 128]
    x.cu_q = cumulative(case.q_lens, torch, device, torch.int32)  # [B + 1], on the device
    x.cu_k = cumulative(case.k_lens, torch, device, torch.int32)  # [B + 1]
    x.out = torch.full((T, H, DV), float("nan"), device=device, dtype=bf16)  # [T, H, 128]
    return x


def bytes_per_copy(case):
    """Bytes of one copy, both sides (bf16), counting the per-request path's cuDNN copies."""
    T, S, H = sum(case.q_lens), sum(case.k_lens), case.heads
    mlakit_side = T * H * (DQK + DV) + S * H * (NOPE + DV) + S * ROPE  # q, out; k_nope, v; k_pe
    cudnn_side = T * H * (DQK + DV) + S * H * (DQK + DV)  # q; SDPA's out; k with k_pe; v
    return 2 * (mlakit_side + cudnn_side)


def cudnn_inputs(case, x, path, torch):
    """SDPA's operands built from copy x: k = [k_nope | k_pe broadcast to every head]."""
    S, H = sum(case.k_lens), case.heads
    k = torch.cat([x.k_nope, x.k_pe[:, None, :].expand(S, H, ROPE)], dim=-1)  # [S, H, 192]
    if path == "nested":  # one ragged call: jagged tensors over the token-major buffers
        offsets = cumulative(case.q_lens, torch, x.q.device, torch.int64)  # [B + 1], lq == lk

        def jagged(values):  # [T, H, D] -> [B, H, j, D]
            return torch.nested.nested_tensor_from_jagged(
                values, offsets, min_seqlen=min(case.q_lens), max_seqlen=max(case.q_lens)
            ).transpose(1, 2)

        return [(jagged(x.q), jagged(k), jagged(x.v))]
    parts = []  # dense: one [B, H, L, D] batch; loop: one [1, H, L_b, D] batch per request
    B = len(case.q_lens)
    groups = [(0, B)] if path == "dense" else [(b, b + 1) for b in range(B)]
    cq, ck = x.cu_q.tolist(), x.cu_k.tolist()
    for first, last in groups:
        G, lq, lk = last - first, case.q_lens[first], case.k_lens[first]  # G requests of lq, lk

        def bhld(t, lo, n, width):  # rows [lo, lo + G n) of [tokens, H, width] -> [G, H, n, width]
            return t[lo:lo + G * n].view(G, n, H, width).transpose(1, 2).contiguous()

        parts.append((bhld(x.q, cq[first], lq, DQK), bhld(k, ck[first], lk, DQK),
                      bhld(x.v, ck[first], lk, DV)))
    return parts


def run_mlakit(case, x, mlakit):
    # lse=None: SDPA without grad computes no LSE either, so both do the same work.
    mlakit.mla_prefill(x.q, x.k_nope, x.k_pe, x.v, x.cu_q, x.cu_k, max(case.q_lens),
                       max(case.k_lens), SCALE, case.causal, x.out)
    return x.out  # [T, H, 128]


def run_sdpa(case, parts, F):
    return [F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, scale=SCALE)
            for q, k, v in parts]  # each [B, H, L, 128] (nested: [B, H, j, 128])


def as_tokens(outs, path, torch):
    """SDPA's outputs as one [T, H, 128] tensor, mlakit's layout."""
    if path == "nested":
        return outs[0].transpose(1, 2).values()  # [T, H, 128]
    return torch.cat([o.transpose(1, 2).reshape(-1, o.shape[1], DV) for o in outs])


def rel_l2(mine, ref):
    """||mine - ref|| / ||ref|| over [T, H, 128], summed in f32 chunks (NaN stays NaN)."""
    num = den = 0.0
    for s in range(0, mine.shape[0], CHECK_CHUNK):
        a, b = mine[s:s + CHECK_CHUNK].float(), ref[s:s + CHECK_CHUNK].float()
        num += (a - b).square().sum().item()
        den += b.square().sum().item()
    return math.sqrt(num / den) if den > 0 else float("nan")


def median_ms(fn, copies, warmup, reps, torch, cuda):
    """Median ms of `reps` calls of fn(copy), each on the next copy, after `warmup` calls. CUDA:
    events around each call on the current stream, one synchronisation at the end."""
    n = len(copies)
    times = []
    if cuda:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for i in range(warmup):  # no synchronisation after: the GPU stays busy into the timed
            fn(copies[i % n])    # calls, so the host's launch time is hidden from the first too
        for i, (start, end) in enumerate(events):
            x = copies[(warmup + i) % n]
            start.record()
            fn(x)
            end.record()
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) for start, end in events]
    else:
        for i in range(warmup):
            fn(copies[i % n])
        for i in range(reps):
            x = copies[(warmup + i) % n]
            t0 = time.perf_counter()
            fn(x)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def free_bytes(torch, cuda):
    if cuda:
        return torch.cuda.mem_get_info()[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def bench_case(case, args, torch, F, mlakit, backend, sdpa_kernel):
    cuda = args.device == "cuda"
    fit = int(free_bytes(torch, cuda) * MEMORY_SHARE) // bytes_per_copy(case)
    n_copies = max(1, min(COPIES, fit))
    copies = [make_inputs(case, torch, args.device, seed) for seed in range(n_copies)]
    notes = []
    if n_copies < COPIES:
        notes.append(f"{n_copies} input copies (memory)")

    # The check run on copy 0 (also the first warm-up of both).
    mine = run_mlakit(case, copies[0], mlakit)
    if cuda:
        mlakit.check_device_errors(args.device)  # a skipped request would leave NaN rows
    # cuDNN's candidate paths: one [B, H, L, D] batch ("dense"); varlen: a ragged call ("nested",
    # the jagged offsets serve q and k) and one call per request ("loop"), the faster counting.
    paths = ["dense"]
    if not case.dense:
        ragged = args.cudnn_varlen != "loop" and case.q_lens == case.k_lens
        paths = (["nested"] if ragged else []) + (["loop"] if args.cudnn_varlen != "nested" else [])
    with sdpa_kernel(backend):
        times, err = {}, float("nan")
        for candidate in paths:
            try:
                parts = [cudnn_inputs(case, x, candidate, torch) for x in copies]
                ref = as_tokens(run_sdpa(case, parts[0], F), candidate, torch)
            except Exception as e:  # torch without the ragged path for these operands
                if candidate != "nested" or args.cudnn_varlen == "nested":
                    raise
                reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:100]
                notes.append(f"ragged SDPA refused ({reason})")
                continue
            if math.isnan(err):  # the outputs are compared with the first path that ran
                err = rel_l2(mine, ref)
            del ref
            if len(paths) > 1:  # several paths: timed once each to pick cuDNN's faster one
                times[candidate] = median_ms(lambda p: run_sdpa(case, p, F), parts, args.warmup,
                                             args.reps, torch, cuda)
            del parts
        path = min(times, key=times.get) if times else paths[-1]
        # Rounds: mlakit, then cuDNN's path, alternately, on the same copies.
        parts = [cudnn_inputs(case, x, path, torch) for x in copies]
        mlakit_times, ref_times = [], []
        for _ in range(args.rounds):
            mlakit_times.append(median_ms(lambda x: run_mlakit(case, x, mlakit), copies,
                                          args.warmup, args.reps, torch, cuda))
            ref_times.append(median_ms(lambda p: run_sdpa(case, p, F), parts, args.warmup,
                                       args.reps, torch, cuda))
        del parts
    mlakit_ms, ref_ms = statistics.median(mlakit_times), statistics.median(ref_times)
    ratio = statistics.median(m / r for m, r in zip(mlakit_times, ref_times))
    if args.rounds > 1:
        notes.append("rounds (mlakit / cuDNN ms): " +
                     ", ".join(f"{m:.3f} / {r:.3f}" for m, r in zip(mlakit_times, ref_times)))
    if len(times) > 1:
        notes.append("cuDNN path choice " + ", ".join(f"{k} {v:.3f} ms" for k, v in times.items()))
    if path == "loop":
        notes.append(f"{len(case.q_lens)} SDPA calls per run")
    tflops = case.flops() / (mlakit_ms * 1e-3) / 1e12
    row = {
        "shape": case.label,
        "mlakit_ms": round(mlakit_ms, 4),
        "cudnn_ms": round(ref_ms, 4),
        "tflops": round(tflops, 2 if tflops < 10 else 1),
        "ratio": round(ratio, 3),  # the median of the rounds' ratios
        "rel_l2": None if math.isnan(err) else float(f"{err:.3e}"),  # JSON has no NaN
        "commit": args.commit,
        "cudnn_path": path if cuda else f"{path} (cpu, math backend)",
    }
    return row, notes, err


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="write the rows to PATH as a JSON list")
    parser.add_argument("--commit", default=os.environ.get("MLAKIT_COMMIT", "unknown"),
                        help="commit recorded in every row (default: $MLAKIT_COMMIT or unknown)")
    parser.add_argument("--quick", action="store_true",
                        help=f"lengths / {QUICK_DIVISOR}, 1 warm-up, 3 repetitions")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: CPU tensors and SDPA's math backend, to check the logic")
    parser.add_argument("--cudnn-varlen", choices=["auto", "nested", "loop"], default="auto",
                        help="varlen batch through cuDNN: ragged (nested) call, one call per "
                             "request (loop), or both with the faster counting (auto)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 3)")
    parser.add_argument("--reps", type=int, default=None, help="timed calls (default 10)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternating rounds of mlakit and cuDNN timings (default 3)")
    args = parser.parse_args()
    # Full runs: 3 warm-ups (module loading, cuDNN plan building), median of 10 (>= 5).
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.reps = args.reps if args.reps is not None else (3 if args.quick else 10)
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if args.warmup < 0 or args.reps < 1 or args.rounds < 1:
        die(f"--warmup must be >= 0, --reps and --rounds >= 1; got {args.warmup}, {args.reps} "
            f"and {args.rounds}")

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        die(f"needs PyTorch with torch.nn.attention (>= 2.3): {e}")
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        die("no CUDA device visible to torch; `--device cpu` checks the script's logic on CPU")
    if cuda and not torch.backends.cudnn.is_available():
        die("torch has no cuDNN: the cuDNN SDPA backend cannot run")
    try:
        import mlakit
    except ImportError as e:
        die(f"cannot import mlakit (pip install ./python, or PYTHONPATH=python with "
            f"MLAKIT_LIBRARY=.../libmlakit_c.so): {e}")
    if cuda and not mlakit.build_info()["cuda"]:
        die(f"{mlakit.library_path} was built without CUDA (MLAKIT_CUDA=ON pip install ./python)")

    backend = SDPBackend.CUDNN_ATTENTION if cuda else SDPBackend.MATH
    ref_name = "cuDNN" if cuda else "math"  # the SDPA backend mlakit is compared with
    if cuda:
        where = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
                 f"cuDNN {torch.backends.cudnn.version()}")
    else:
        where = f"CPU ({os.cpu_count()} cores), torch {torch.__version__}, SDPA math backend"
    print(f"# mlakit prefill vs SDPA ({ref_name} backend): {where}")
    print(f"mlakit {mlakit.version()} ({mlakit.library_path}), commit {args.commit}; bf16, d_qk "
          f"{DQK} (k_pe shared by the heads in mlakit, broadcast for SDPA), d_v {DV}, scale "
          f"1/sqrt({DQK}); median of {args.reps} after {args.warmup} warm-up, {args.rounds} "
          f"alternating rounds (medians; ratio: median of the rounds'), up to {COPIES} "
          f"input copies rotated{', CUDA events' if cuda else ', wall clock'}; TF/s is mlakit's "
          f"(useful causal work)")
    print()
    print(f"| shape | mlakit ms | {ref_name} ms | mlakit / {ref_name} | TF/s | rel L2 |")
    print("|---|---|---|---|---|---|", flush=True)

    rows, all_notes, failed = [], [], []
    with torch.no_grad():
        for case in make_cases(args.quick):
            row, notes, err = bench_case(case, args, torch, F, mlakit, backend, sdpa_kernel)
            bad = not err <= TOLERANCE  # NaN counts as bad
            flag = f" **FAIL > {TOLERANCE:g}**" if bad else ""
            print(f"| {row['shape']} | {row['mlakit_ms']:.3f} | {row['cudnn_ms']:.3f} | "
                  f"{row['ratio']:.2f} | {row['tflops']:.3g} | {err:.1e}{flag} |",
                  flush=True)
            rows.append(row)
            all_notes += [f"{case.label}: {n}" for n in notes]
            if not case.dense:
                all_notes.append(f"{case.label}: lengths seed {VARLEN_SEED}, T = "
                                 f"{sum(case.q_lens)}, {min(case.q_lens)}..{max(case.q_lens)}, "
                                 f"{ref_name} path: {row['cudnn_path']}")
            if bad:
                failed.append(case.label)
            if cuda:
                torch.cuda.empty_cache()  # the next case's copies need the memory back

    print()
    for note in all_notes:
        print(f"- {note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
            f.write("\n")
        print(f"- rows written to {args.json}")
    if failed:
        print(f"prefill_vs_cudnn: outputs disagree (rel L2 > {TOLERANCE:g}) for: "
              f"{', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

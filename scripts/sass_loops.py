#!/usr/bin/env python3
"""Instruction counts of the loops of a kernel's SASS, on a machine without a GPU.

Why: the tensor-core loops of the sm90 kernels issue their wgmma (HGMMA) operand descriptors from
uniform registers; when the compiler cannot prove a value warp-uniform it computes the descriptor
in vector registers and moves it over (R2UR) before every HGMMA, which lengthens the loop. Counting
HGMMA, R2UR and uniform-datapath (U*) instructions per loop shows such a change before any device
time is spent (docs/perf-notes.md, prefill: the persistent kernel's per-tile cost).

Needs cuobjdump and nvdisasm of CUDA 13 (not in the nvcc-only toolkit of the CI machine kind):
  python3 -m pip install --target /tmp/cudatools nvidia-cuda-cuobjdump==13.5.37 \
      nvidia-cuda-nvdisasm==13.5.37
  PATH=/tmp/cudatools/nvidia/cu13/bin:$PATH python3 scripts/sass_loops.py OBJECT [NAME_REGEX]
OBJECT: an object file or binary with sm_90a code (e.g. the .cu.o of a kernel's instantiation,
build/cuda/src/CMakeFiles/mlakit.dir/cuda/prefill/instantiations/bf16.cu.o). Prints, for each
function whose mangled name matches NAME_REGEX (default: all), its instruction count and every
loop (a backward branch and its target) that holds an HGMMA.
"""
import re
import subprocess
import sys

INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH_TARGET = re.compile(r"BRA\s.*?(0x[0-9a-f]+)")
UNIFORM_OP = re.compile(r"(@\S+\s+)?U[A-Z]")


def functions(sass):
    """(mangled name, [(address, instruction text)]) of each function in cuobjdump's output."""
    for part in sass.split("Function : ")[1:]:
        lines = part.split("\n")
        code = [(int(m.group(1), 16), m.group(2)) for m in map(INSTRUCTION.match, lines) if m]
        yield lines[0].strip(), code


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    pattern = re.compile(sys.argv[2] if len(sys.argv) == 3 else ".")
    sass = subprocess.run(["cuobjdump", "-sass", sys.argv[1]], capture_output=True, text=True,
                          check=True).stdout
    for name, code in functions(sass):
        if not pattern.search(name):
            continue
        index = {address: i for i, (address, _) in enumerate(code)}
        print(f"{name}: {len(code)} instructions, {sum('R2UR' in t for _, t in code)} R2UR")
        for end, (address, text) in enumerate(code):
            target = BRANCH_TARGET.search(text)
            if not target or int(target.group(1), 16) >= address:
                continue
            start = index.get(int(target.group(1), 16))
            if start is None:
                continue
            body = [t for _, t in code[start:end + 1]]
            hgmma = sum("HGMMA" in t for t in body)
            if hgmma:
                print(f"  loop {code[start][0]:#x}-{address:#x}: {len(body)} instructions, "
                      f"{hgmma} HGMMA, {sum('R2UR' in t for t in body)} R2UR, "
                      f"{sum(UNIFORM_OP.match(t) is not None for t in body)} uniform")


if __name__ == "__main__":
    main()

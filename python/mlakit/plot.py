"""Charts of ``mlakit bench --json`` results: ``python -m mlakit.plot results.json out.png``.

Left: the roofline of the measured ceilings (memory bandwidth, GEMM rate) with every case at its
arithmetic intensity and achieved GFLOP/s. Right: each case's time beside its roofline time.
Needs matplotlib (``pip install './python[plot]'``).
"""

import argparse
import json

# One marker per kind of case.
_MARKERS = {"decode": "o", "prefill": "s", "forward": "^"}


def plot_results(results, png_path):
    """Draws a bench result dict (the JSON ``mlakit bench`` writes) into png_path."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    ceilings = results["ceilings"]
    memory_gbs, gemm_gflops = ceilings["memory_gbs"], ceilings["gemm_gflops"]
    cases = results["results"]
    fig, (roof_ax, time_ax) = plt.subplots(1, 2, figsize=(15, 6))

    intensities = [c["flops"] / c["bytes"] for c in cases]
    low, high = min(intensities + [1.0]) / 4, max(intensities + [gemm_gflops / memory_gbs]) * 4
    ridge = gemm_gflops / memory_gbs
    roof_ax.plot([low, ridge, high], [memory_gbs * low, gemm_gflops, gemm_gflops], color="black",
                 label=f"roofline: {memory_gbs:.1f} GB/s, {gemm_gflops:.1f} GFLOP/s")
    for kind, marker in _MARKERS.items():
        points = [(i, c) for i, c in zip(intensities, cases) if c["kind"] == kind]
        if not points:
            continue
        roof_ax.scatter([i for i, _ in points], [c["gflops"] for _, c in points], marker=marker,
                        label=kind, zorder=3)
        for i, c in points:
            roof_ax.annotate(c["case"], (i, c["gflops"]), fontsize=7, xytext=(4, -10),
                             textcoords="offset points")
    roof_ax.set_xscale("log")
    roof_ax.set_yscale("log")
    roof_ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    roof_ax.set_ylabel("GFLOP/s")
    roof_ax.set_title(f"mlakit {results['mlakit_version']} on {results['device']}: "
                      f"{results['model']}, {results['dtype']}")
    roof_ax.grid(True, which="both", alpha=0.3)
    roof_ax.legend(fontsize=8)

    labels = [f"{c['kind']}: {c['case']}" for c in cases]
    rows = range(len(cases))
    time_ax.barh([r + 0.2 for r in rows], [c["time_s"] * 1e3 for c in cases], height=0.4,
                 label="measured")
    time_ax.barh([r - 0.2 for r in rows], [c["roofline_s"] * 1e3 for c in cases], height=0.4,
                 label="roofline")
    for r, c in zip(rows, cases):
        time_ax.annotate(f"{100 * c['roofline_fraction']:.0f} %", (c["time_s"] * 1e3, r + 0.2),
                         fontsize=7, xytext=(3, -3), textcoords="offset points")
    time_ax.set_yticks(list(rows))
    time_ax.set_yticklabels(labels, fontsize=8)
    time_ax.invert_yaxis()
    time_ax.set_xscale("log")
    time_ax.set_xlabel("ms per call (log); % = roofline time / measured time")
    time_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m mlakit.plot", description=__doc__.split("\n")[0])
    parser.add_argument("results", help="JSON written by mlakit bench --json")
    parser.add_argument("png", help="image to write")
    args = parser.parse_args(argv)
    with open(args.results, encoding="utf-8") as f:
        plot_results(json.load(f), args.png)


if __name__ == "__main__":
    main()

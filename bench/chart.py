"""The bench results as a bar chart (matplotlib, optional): every system's speed over HF-alone."""

from __future__ import annotations

from pathlib import Path


def write_chart(results: dict, out_dir: Path) -> str:
    """A PNG of every system's speed over HF-alone per workload; returns its path or a note."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "chart skipped: matplotlib is not installed (`pip install matplotlib`)"
    bars = [
        (f"{w}\n{name}", figs["ratio_vs_hf_alone"])
        for w, block in results["workloads"].items()
        if w != "W5"
        for name, figs in block["systems"].items()
        if isinstance(figs.get("ratio_vs_hf_alone"), (int, float)) and name != "hf_alone"
    ]
    if not bars:
        return "chart skipped: no ratios to plot"
    fig, ax = plt.subplots(figsize=(max(6, len(bars) * 1.1), 4))
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color="tab:blue")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("speed vs HF-alone (x, log)")
    ax.set_title(
        f"sgl_lite bench ({results['env']['torch_threads']} threads, medians of "
        f"{results['env']['repeats']})"
    )
    for i, (_, value) in enumerate(bars):
        ax.text(i, value, f"{value:.2g}x", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    path = out_dir / "bench_ratios.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)

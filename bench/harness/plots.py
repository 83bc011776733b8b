"""PNG plots of the load generators' level summaries (matplotlib, the bench extra): closed loop (latency,
throughput and the server's stage times per concurrency) and open loop (latency and refusals per offered rate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_closed(closed: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    closed = dict(sorted(closed.items(), key=lambda kv: int(kv[0])))
    cs = [int(c) for c in closed]
    rows = list(closed.values())
    base = next((r["baseline"] for r in rows if r.get("baseline")), None)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax = axes[0]
    for key, color in (("p50_ms", "C0"), ("p95_ms", "C1"), ("p99_ms", "C3")):
        ax.plot(cs, [r[key] if r[key] is not None else np.nan for r in rows], "o-", color=color,
                label=f"service {key[:-3]}")
        if base and base.get(key):
            ax.axhline(base[key], color=color, ls="--", lw=1, label=f"baseline {key[:-3]} (sequential)")
    ax.set(yscale="log", xlabel="concurrent callers C", ylabel="latency (ms)", title="latency")
    _log2_x(ax, cs)
    _plain_log_y(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(cs, [r["qps"] for r in rows], "o-", color="C0", label="service")
    ceiling = [r.get("client_ceiling_qps") for r in rows]
    if any(ceiling):
        ax.plot(cs, [v or np.nan for v in ceiling], "s:", color="grey", label="client ceiling (health Check)")
    if base and base.get("qps"):
        ax.axhline(base["qps"], color="C3", ls="--", label="baseline (sequential)")
    ax.set(yscale="log", xlabel="concurrent callers C", ylabel="OK requests / s", title="throughput")
    _log2_x(ax, cs)
    _plain_log_y(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    _plot_stages(axes[2], closed)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _log2_x(ax: Any, cs: list[int]) -> None:
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.xaxis.set_minor_locator(NullLocator())


def _plain_log_y(ax: Any) -> None:
    """Log-scale y ticks as plain numbers (20, 50, 100), not powers of ten; denser when the data span little.
    Call after plotting (the span is read from the axis limits)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    lo, hi = ax.get_ylim()
    span = hi / lo if lo > 0 else 1000.0
    subs = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if span < 30 else (1.0, 2.0, 5.0) if span < 2000 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _plot_stages(ax: Any, closed: dict[str, dict]) -> None:
    """Stacked mean stage times per level, the mean total as a marker: bm25 runs alongside embed + dense, so
    the stack can exceed the total; queue waits (``*_queue``) are inside their stage and not stacked."""
    stages = sorted({k for r in closed.values() for k in r["stage_ms"] if k != "total" and not k.endswith("_queue")})
    x = np.arange(len(closed))
    bottom = np.zeros(len(closed))
    for i, st in enumerate(stages):
        vals = np.array([r["stage_ms"].get(st, 0.0) for r in closed.values()])
        ax.bar(x, vals, bottom=bottom, color=f"C{i % 10}", label=st)
        bottom += vals
    totals = [r["stage_ms"].get("total", np.nan) for r in closed.values()]
    ax.scatter(x, totals, marker="_", s=1500, linewidths=2.5, color="black", zorder=3, label="total (server)")
    ax.set_xticks(x, list(closed))
    ax.set(xlabel="concurrent callers C", ylabel="mean ms per request", title="server stage times (bm25 ∥ embed+dense)")
    ax.legend(fontsize=7, markerscale=0.3)


def plot_open(opened: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    opened = dict(sorted(opened.items(), key=lambda kv: float(kv[0])))
    rates = [float(r) for r in opened]
    rows = list(opened.values())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    ax = axes[0]
    for key, color in (("p50_ms", "C0"), ("p95_ms", "C1"), ("p99_ms", "C3")):
        ax.plot(rates, [r[key] if r[key] is not None else np.nan for r in rows], "o-", color=color,
                label=f"OK {key[:-3]}")
    rej = [r["rejected_p50_ms"] if r["rejected_p50_ms"] is not None else np.nan for r in rows]
    if not all(np.isnan(rej)):
        ax.plot(rates, rej, "x--", color="grey", label="RESOURCE_EXHAUSTED p50")
    ax.set(yscale="log", xlabel="offered requests / s", ylabel="latency (ms)", title="latency of admitted requests")
    _plain_log_y(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(rates, rates, ":", color="grey", label="offered")
    ax.plot(rates, [r["ok_rps"] for r in rows], "o-", color="C0", label="OK / s")
    ax.set(xlabel="offered requests / s", ylabel="requests / s", title="throughput and refusals")
    ax.grid(True, alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(rates, [100 * r["rejected_share"] for r in rows], "s--", color="C3", label="rejected %")
    ax2.set_ylabel("rejected (RESOURCE_EXHAUSTED) %")
    ax2.set_ylim(0, 100)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scale(sizes: dict[int, dict[str, Any]], path: Path, title: str) -> None:
    """The scale bench's curves, corpus size on a log x axis: build time and its split, the build's peak RSS, disk
    bytes per passage by part, the server's RSS per passage, Retrieve p50/p99 per concurrency, the stage split at
    one caller, the dense stage's recall@100 against exact. Sizes built on synthesised (perturbed) vectors are
    drawn with open markers and named so on the x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = {n: e for n, e in sorted(sizes.items()) if "build" in e}
    if not sizes:
        return
    ns = list(sizes)
    rows = list(sizes.values())
    synthetic = [r["build"]["vectors"].get("synthesised", 0) > 0 for r in rows]

    def line(ax: Any, ys: list[Any], label: str, color: str, style: str = "-") -> None:
        ys = [np.nan if y is None else y for y in ys]
        ax.plot(ns, ys, style, color=color, label=label)
        for x, y, s in zip(ns, ys, synthetic, strict=True):
            ax.plot([x], [y], "o", color=color, mfc="white" if s else color, ms=6)

    fig, axes = plt.subplots(2, 4, figsize=(20, 9))
    ax = axes[0][0]
    line(ax, [r["build"]["wall_s"] for r in rows], "build (wall)", "black")
    stages = sorted({k for r in rows for k in r["build"]["timings"]})
    for i, st in enumerate(stages):
        line(ax, [r["build"]["timings"].get(st) for r in rows], st, f"C{i % 10}", "--")
    proj = [r["build"].get("embed_projected_s") for r in rows]
    if any(proj):
        line(ax, proj, "embed, projected (model wp/s)", "grey", ":")
    ax.set(xscale="log", yscale="log", ylabel="seconds", title="build time and its split")
    ax = axes[0][1]
    line(ax, [r["build"]["peak_rss_mib"] for r in rows], "peak RSS (ru_maxrss)", "C3")
    for key, label, color in (("peak_anon_mib", "peak anonymous (sampled)", "C0"),
                              ("peak_file_mib", "peak file-backed (sampled)", "C1")):
        if any(r["build"].get(key) for r in rows):
            line(ax, [r["build"].get(key) for r in rows], label, color, "--")
    ax.set(xscale="log", yscale="log", ylabel="MiB", title="build peak memory")
    ax = axes[0][2]
    parts = sorted({k for r in rows for k in r["disk"]["parts_per_passage"]})
    for i, part in enumerate(parts):
        line(ax, [r["disk"]["parts_per_passage"].get(part, 0) / 1024 for r in rows], part, f"C{i % 10}")
    line(ax, [r["disk"]["bytes_per_passage"] / 1024 for r in rows], "total", "black", "--")
    ax.set(xscale="log", yscale="log", ylabel="KiB per passage", title="disk per passage by part")
    ax = axes[0][3]
    for key, color in (("rss", "black"), ("anon", "C0"), ("file", "C1")):
        line(ax, [r["serving"]["rss_per_passage_bytes"][key] / 1024 for r in rows], f"VmRSS {key}" if key != "rss"
             else "VmRSS", color)
        above = [(r["serving"].get("rss_above_smallest_per_passage_bytes") or {}).get(key) for r in rows]
        if any(v is not None and v > 0 for v in above):
            line(ax, [None if v is None or v <= 0 else v / 1024 for v in above], f"{key}, above the smallest size",
                 color, ":")
    ax.set(xscale="log", yscale="log", ylabel="KiB per passage", title="serving RSS per passage (warm)")
    ax = axes[1][0]
    levels = sorted({c for r in rows for c in r["serving"]["levels"]}, key=int)
    for i, c in enumerate(levels):
        line(ax, [r["serving"]["levels"].get(c, {}).get("p50_ms") for r in rows], f"p50, {c} caller(s)", f"C{i}")
        line(ax, [r["serving"]["levels"].get(c, {}).get("p99_ms") for r in rows], f"p99, {c} caller(s)", f"C{i}",
             ":")
    ax.set(xscale="log", yscale="log", ylabel="ms", title="Retrieve latency")
    ax = axes[1][1]
    c1 = levels[0] if levels else "1"
    st = sorted({k for r in rows for k in r["serving"]["levels"].get(c1, {}).get("stage_ms", {})
                 if not k.endswith("_queue")})
    for i, k in enumerate(st):
        line(ax, [r["serving"]["levels"].get(c1, {}).get("stage_ms", {}).get(k) for r in rows], k,
             "black" if k == "total" else f"C{i % 10}", "--" if k == "total" else "-")
    ax.set(xscale="log", yscale="log", ylabel="mean ms", title=f"stage split, {c1} caller(s)")
    ax = axes[1][2]
    line(ax, [r["recall"].get("recall") for r in rows], "dense recall@100 vs exact", "C2")
    ax.set(xscale="log", ylabel="recall@100", title="dense stage against exact search")
    ax.set_ylim(min(0.8, *[r["recall"].get("recall") or 1 for r in rows]) - 0.02, 1.005)
    ax = axes[1][3]
    line(ax, [r["serving"]["load_s"] for r in rows], "server start to SERVING", "C4")
    ax.set(xscale="log", yscale="log", ylabel="seconds", title="server load time")
    labels = [f"{n:,}" + ("\n(perturbed)" if s else "") for n, s in zip(ns, synthetic, strict=True)]
    for ax in axes.flat:
        ax.set_xticks(ns, labels, fontsize=7)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_xlabel("passages")
    fig.suptitle(title + " (open markers: synthesised vectors, cost only)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

"""Figures for the report (matplotlib + seaborn), each returned as a base64 PNG."""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from reports.run_data import RunData  # noqa: E402
from reports.tables import wan_requests  # noqa: E402


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def ttft_cdf(run: RunData) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, s in run.systems.items():
        ok = s.records[s.records["status"] == "ok"]
        ttft = np.sort((ok["first_token"] - ok["arrival"]).dropna().to_numpy())
        if len(ttft):
            ax.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), label=name)
    ax.set(xlabel="time to first token (s)", ylabel="share of requests", title="TTFT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


def _cdf(ax, values, label: str) -> None:
    v = np.sort(np.asarray(values, float))
    if len(v):
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)


def itl_e2e_cdfs(run: RunData) -> str:
    """Inter-token (every gap between a request's tokens) and end-to-end CDFs."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.4))
    for name, s in run.systems.items():
        ok = s.records[s.records["status"] == "ok"]
        gaps = [g for t in ok["token_times"] for g in np.diff(np.asarray(t, float))]
        _cdf(axes[0], gaps, name)
        _cdf(axes[1], (ok["finish"] - ok["arrival"]).dropna(), name)
    for ax, what in zip(axes, ("inter-token latency (s)", "end-to-end latency (s)"), strict=True):
        ax.set(xlabel=what, ylabel="share", title=f"{what.split(' (')[0]} CDF")
        ax.grid(alpha=0.3)
    axes[0].set_xscale("log")
    axes[1].legend()
    return _png(fig)


def latency_over_time(run: RunData) -> str:
    """Each request's TTFT at its arrival time (seconds from the system's first)."""
    fig, ax = plt.subplots(figsize=(9.6, 3.4))
    for name, s in run.systems.items():
        ok = s.records[(s.records["status"] == "ok") & s.records["first_token"].notna()]
        if ok.empty:
            continue
        t = ok["arrival"] - s.records["arrival"].min()
        ax.scatter(t, ok["first_token"] - ok["arrival"], s=10, alpha=0.7, label=name)
    ax.set(xlabel="arrival (s into the run)", ylabel="TTFT (s)", title="TTFT over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def ttft_vs_uncached(run: RunData) -> str:
    """TTFT against the prompt tokens the first decoder's prefill did not find cached."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, s in run.systems.items():
        r = s.records
        ok = r[(r["status"] == "ok") & r["first_token"].notna() & r["prompt_tokens"].notna()]
        if ok.empty:
            continue
        cached = ok["cached_tokens_prefill"].fillna(0) if "cached_tokens_prefill" in ok else 0
        ax.scatter(ok["prompt_tokens"] - cached, ok["first_token"] - ok["arrival"], s=10,
                   alpha=0.7, label=name)  # fmt: skip
    ax.set(xlabel="uncached prompt tokens (at prefill)", ylabel="TTFT (s)",
           title="TTFT against uncached tokens")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def latency_boxes(run: RunData) -> str:
    rows = []
    for name, s in run.systems.items():
        ok = s.records[s.records["status"] == "ok"]
        for t in ok["token_times"]:
            gaps = np.diff(np.asarray(t, float))
            rows += [{"system": name, "metric": "inter-token (s)", "value": g} for g in gaps]
        rows += [
            {"system": name, "metric": "end-to-end (s)", "value": v}
            for v in (ok["finish"] - ok["arrival"]).dropna()
        ]
    frame = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, metric in zip(axes, ("inter-token (s)", "end-to-end (s)"), strict=True):
        part = frame[frame["metric"] == metric] if not frame.empty else frame
        if not part.empty:
            sns.boxplot(data=part, x="system", y="value", ax=ax, showfliers=False)
        ax.set(title=metric, xlabel="", ylabel="s")
        ax.tick_params(axis="x", rotation=20)
    return _png(fig)


def wan_bytes_scatter(run: RunData) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, s in run.systems.items():
        wan, _ = wan_requests(s)
        if wan.empty:
            continue
        per_token = s.manifest.get("kv_bytes_per_token", 0)
        minimum = (wan["prompt_tokens"] - wan["held"]) * per_token
        ax.scatter(minimum / 1e6, wan["kv_bytes"] / 1e6, s=12, label=name)
    lim = ax.get_xlim()[1] if ax.has_data() else 1
    ax.plot([0, lim], [0, lim], "k--", lw=1, label="(1 − hit) × full KV")
    ax.set(
        xlabel="minimum: KV the decode side lacked (MB)",
        ylabel="KV sent over the WAN (MB)",
        title="WAN bytes per request",
    )
    ax.legend()
    return _png(fig)


def utilisation(frame: pd.DataFrame) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    if not frame.empty:
        sns.lineplot(data=frame, x="t_s", y="utilisation", hue="system", ax=ax)
    ax.set(
        xlabel="time since the first transfer (s)",
        ylabel="share of WAN rate",
        title="WAN utilisation by KV transfers",
        ylim=(0, 1.1),
    )
    return _png(fig)


def hit_bins(frame: pd.DataFrame) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    if not frame.empty:
        bins = [c for c in frame.columns if c.endswith("%")]
        long = frame.melt(id_vars="system", value_vars=bins, var_name="hit bin", value_name="share")
        sns.barplot(data=long, x="hit bin", y="share", hue="system", ax=ax)
    ax.set(title="Prefix-hit ratio of requests, PDD's seven bins")
    return _png(fig)


def sweep_lines(frame: pd.DataFrame, x: str, facet: str | None, y: str, title: str) -> str:
    """``y`` against the swept ``x``, a line per system, a panel per value of ``facet``."""
    facets = sorted(frame[facet].unique()) if facet else [None]
    fig, axes = plt.subplots(1, len(facets), figsize=(4.2 * len(facets), 3.4), squeeze=False)
    for ax, value in zip(axes[0], facets, strict=True):
        part = frame if value is None else frame[frame[facet] == value]
        sns.lineplot(data=part, x=x, y=y, hue="system", marker="o", ax=ax)
        ax.set(title=f"{title}" + (f" ({facet} = {value})" if facet else ""), xlabel=x)
        if part[x].min() > 0 and part[x].max() / part[x].min() >= 8:
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
    return _png(fig)


def bathtub(model: pd.DataFrame, measured: pd.DataFrame | None = None) -> str:
    """Modelled throughput and benefit per unit cost against the hit ratio (relative to
    no hit); hits where the tail chunk is small are marked; measured points, if any,
    are drawn on the same relative scale."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    small = model[(model["tail_tokens"] > 0) & (model["tail_tokens"] < 1024)]
    panels = (
        (axes[0], "throughput_per_cost", "throughput per unit cost"),
        (axes[1], "benefit_per_cost", "benefit (revenue) per unit cost"),
    )
    for ax, col, title in panels:
        ax.plot(model["hit"], model[col], label="modelled (roofline)", color="tab:blue")
        ax.scatter(
            small["hit"],
            small[col],
            s=12,
            color="tab:red",
            label="tail chunk < 1024 tokens",
            zorder=3,
        )
        if measured is not None and col in measured and not measured.empty:
            ax.plot(measured["hit"], measured[col], "o--", color="tab:green", label="measured")
        ax.set(title=title, xlabel="prefix-hit ratio", ylabel="relative to hit = 0")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    return _png(fig)


def ttft_parts(breakdown: pd.DataFrame) -> str | None:
    """Stacked bars: per system and TTFT percentile, where the first-token time went."""
    from protocol.metrics import TtftPart

    if breakdown.empty:
        return None
    frame = breakdown.set_index(breakdown["system"] + " " + breakdown["percentile"])
    shown = [p for p in TtftPart if frame[p.value].abs().sum() > 0]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(max(6.4, 0.55 * len(frame)), 3.8))
    bottom = np.zeros(len(frame))
    for part in shown:
        values = frame[part.value].clip(lower=0).to_numpy()
        ax.bar(frame.index, values, bottom=bottom, label=part.label)
        bottom += values
    ax.set(ylabel="s", title="TTFT by part, requests near each percentile")
    ax.tick_params(axis="x", rotation=60)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)

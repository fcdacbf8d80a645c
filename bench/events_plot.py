"""``lookahead-rag-bench events``'s PNG: event-to-visible lag per phase, values on the bars."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.plot_common import LABEL_FONT, figure, grouped_bars, known, save, title

MS_PER_S = 1000.0
LAGS = {"lag_p50_s": "p50", "lag_p99_s": "p99", "lag_max_s": "max"}


def _ms(value: float | None) -> float | None:
    return None if value is None else value * MS_PER_S


def plot(data: dict[str, Any], path: str) -> None:
    """Lag p50 / p99 / max of the steady and the kill phase; lost, applied twice and kills under each."""
    phases = data.get("phases") or []
    fig, (ax,) = figure(1)
    groups = [f"{p['phase']}\nlost {known(p.get('lost'))}, applied twice {known(p.get('applied_twice'))}, "
              f"kills {known(p.get('kills'))}" for p in phases]
    grouped_bars(ax, groups, {label: [_ms(p.get(k)) for p in phases] for k, label in LAGS.items()})
    ax.set_ylabel("lag, event created -> applied by the consumer (ms)")
    ax.set_xlabel("phase")
    ax.tick_params(axis="x", labelsize=LABEL_FONT)
    ax.set_title(f"{known(data.get('events'))} events a phase at {known(data.get('rate'))}/s, "
                 f"{known(data.get('partitions'))} partitions, kill every {known(data.get('kill_every'))} "
                 f"({known(data.get('kill_mode'))}); broker {known(data.get('broker'))}", fontsize=LABEL_FONT)
    what = "Kafka feedback loop: lag, lost and applied-twice events"
    save(fig, path, title(data, what, "the steady phase (no kills)", threads="n/a (no torch)",
                          model="none (events only)"))

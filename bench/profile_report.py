"""The step profile (``--profile``) in a result: a printed table (one row per mode or load level, ms per step
by phase) and a stacked-bar PNG beside the result's own."""

from __future__ import annotations

from typing import Any

from lookahead_rag.bench.common import print_table
from lookahead_rag.bench.plot import plot_result


def print_profile(reports: dict[str, dict[str, Any]]) -> None:
    """``reports``: {label: PhaseTimes.report()} (``flatten`` of the engines' StepProfiles)."""
    if not reports:
        return
    phases = list(next(iter(reports.values()))["ms_per_step"])
    rows = [{"label": label, "steps": r["steps"], "tok_fwd": r["tokens_per_forward"], "tok_step": r["emitted_per_step"],
             **{p: r["ms_per_step"][p] for p in phases}, "total": sum(r["ms_per_step"].values())}
            for label, r in reports.items()]
    print("\nstep profile (ms per step):")
    print_table(rows, [("label", "run", "s"), ("steps", "steps", "d"), ("tok_fwd", "tok/fwd", ".1f"),
                       ("tok_step", "tok/step", ".2f"), *[(p, p, ".2f") for p in phases], ("total", "total", ".2f")])
    print_floor(reports)


def print_floor(reports: dict[str, dict[str, Any]]) -> None:
    """Each run's forward against the memory-bandwidth floor (reports without a ``floor`` are skipped)."""
    rows = [{"label": label, **r["floor"]} for label, r in reports.items() if r.get("floor")]
    if not rows:
        return
    print("\nforward against the bandwidth floor (per step; the machine's read GB/s measured at start-up):")
    print_table(rows, [("label", "run", "s"), ("weights_mb", "weights MB", ".0f"), ("kv_mb", "KV MB", ".1f"),
                       ("forward_ms", "forward ms", ".2f"), ("gb_per_s", "GB/s", ".1f"),
                       ("machine_gb_per_s", "machine GB/s", ".1f"), ("floor_ms", "floor ms", ".2f"),
                       ("x_floor", "x floor", ".2f")])


def flatten(profiles: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{label: StepProfile} -> {"label decode" / "label prefill": its report} (the JSON's "profile")."""
    return {f"{label} {kind}": rep for label, prof in profiles.items() for kind, rep in prof.report().items()}


def report_profile(data: dict[str, Any], png: str | None) -> None:
    """Print ``data``'s profile (if it has one) and draw it next to ``png`` as ``*_profile.png``."""
    if "profile" not in data:
        return
    print_profile(data["profile"])
    if png:
        profile_png = png.removesuffix(".png") + "_profile.png"
        plot_result(data, profile_png, kind="profile")
        print(f"wrote {profile_png}")

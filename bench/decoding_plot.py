"""``lookahead-rag-bench decoding``'s PNG: speedup per mode (values on the bars) and the forward-cost curve."""

from __future__ import annotations

from typing import Any

REFERENCE = "reference"  # the reference sampler (lookahead_core.sampling): the baseline mode when sampling


def baseline_label(data: dict[str, Any]) -> str:
    """The baseline the speedups divide, in words (greedy: HF generate or the engine's one-token path)."""
    if data.get("baseline") == REFERENCE:
        top_k = f", top-k {data['top_k']}" if data.get("top_k") else ""
        return (f"reference sampler (plain sampling, T={data['temperature']:g}, top-p {data['top_p']:g}{top_k}, "
                f"seed {data['seed']} for every question)")
    which = "HF generate" if data["greedy_baseline"] == "hf" else "engine one-token (none)"
    return f"greedy, the faster of HF generate and none: {which}"


def plot(data: dict[str, Any], path: str, machine_desc: str) -> None:
    """Speedup per mode (value on every bar, exact match under its name) and the forward-cost curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ref = REFERENCE if data.get("baseline") == REFERENCE else "greedy"
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
    modes = list(data["modes"])
    values = [data["modes"][m][f"speedup_vs_{ref}"] or 0 for m in modes]
    exact = [data["modes"][m][f"exact_match_vs_{ref}"] for m in modes]
    names = [m if e is None else f"{m}\nexact {e:.2f}" for m, e in zip(modes, exact, strict=True)]
    bars = a.bar(names, values, color="tab:blue")
    a.bar_label(bars, labels=[f"{v:.2f}x" for v in values], fontsize=8, padding=2)
    a.axhline(1.0, color="gray", lw=0.8)
    a.set_ylabel(f"speedup vs {ref} (wall)")
    a.set_title(f"{data['scenario']}: {data['questions']} questions, {data['max_new_tokens']} new tokens",
                fontsize=9)
    a.margins(y=0.12)
    a.tick_params(axis="x", labelsize=8)
    measured = data["kernels"]["measured_s"]
    for kernel, seconds in measured["seconds"].items():
        b.plot(measured["token_counts"], [s * 1000.0 for s in seconds], marker="o", label=kernel)
    b.axvline(data["decoding_length"] + 1, color="tab:red", ls="--", lw=0.8, label="chosen tree size")
    b.set_xlabel("tokens in the verification forward")
    b.set_ylabel("ms / forward")
    b.legend()
    fig.suptitle(f"{data['model']} on {machine_desc}, threads={data['threads']}, engine {data['engine']}\n"
                 f"baseline: {baseline_label(data)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

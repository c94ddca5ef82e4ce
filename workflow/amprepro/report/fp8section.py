"""The report's FP8 section: each FP8 cell against compiled bf16 (where FP8 pays and where it does not), the gaps
over seeds and the table, from amprepro.analysis.fp8's numbers and words, through the templates fp8.html.j2 and
fp8_table.html.j2."""

from __future__ import annotations

from amprepro import precisions
from amprepro.analysis import fp8
from amprepro.analysis.paired import pct
from amprepro.memory import GIB
from amprepro.report.reporthtml import render
from amprepro.report.reporthtml import section_html as _section

TITLE = "FP8 against compiled bf16"
EMPTY = "no FP8 cell in this run: the fp8 preset has them (`--config preset=fp8`, docs/fp8.md)"
INTRO = (f"torchao float8 training on the qualifying nn.Linear layers ({precisions.FP8_FILTER}), torch.compile on, "
         "bf16 autocast for the rest, against bf16 AMP compiled the same way: speedup and memory are compiled "
         "against compiled. Loss gap: relative to the compiled bf16 cell, step by step over the same batches; "
         "on synthetic data (one fixed batch) it shows numerical agreement, not convergence, and where the "
         "batch was memorised (the loss near zero) the absolute gap says more than the relative one. MFU of an "
         "FP8 cell counts all its model FLOPs against the FP8 peak, although attention and the layers kept in "
         "bf16 do not run in FP8.")
HEAD = ["model", "precision", "seed", "status", "throughput", "vs baseline", "speedup", "peak GiB",
        "memory vs baseline", "final loss gap", "final gap (nats)", "max step gap", "steps compared",
        "held-out gap", "non-finite steps", "weights in FP8", "MFU (measured peak)", "MFU (datasheet)"]


def _num(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def table_row(c: dict) -> list:
    """One cell's values under HEAD, as text (a missing value blank)."""
    peak = c.get("peak_allocated_bytes")
    return [c["model"], precisions.label(c["precision"]), c["seed"], c["status"],
            f"{_num(c.get('throughput_per_s'), '.1f')} {c.get('throughput_unit') or ''}".strip(),
            precisions.label(c["baseline_precision"]) if c.get("baseline_precision") else "",
            _num(c.get("speedup_vs_baseline"), ".3f"), _num(peak / GIB if peak else None, ".1f"),
            _num(c.get("memory_ratio_vs_baseline"), ".2f"), pct(c.get("loss_gap_final_vs_baseline"), True),
            _num(c.get("loss_gap_final_abs_vs_baseline"), "+.4f"), pct(c.get("loss_gap_max_vs_baseline")),
            c.get("loss_gap_steps") or "", pct(c.get("heldout_gap_final_vs_baseline"), True),
            "" if c.get("nonfinite_steps") is None else c["nonfinite_steps"],
            pct(c.get("fp8_weight_fraction")), pct(c.get("mfu_vs_measured_peak")), pct(c.get("mfu_vs_datasheet"))]


def table_html(rows: list[dict]) -> str:
    return render("fp8_table.html.j2", head=HEAD, rows=[table_row(c) for c in rows])


def section_data(summary: dict) -> dict | None:
    """What the section shows: the FP8 cells and their baselines, a verdict per FP8 cell and the gaps over seeds;
    None where the run has no FP8 cell."""
    rows = fp8.fp8_rows(summary)
    if not rows:
        return None
    return {"rows": rows, "said": fp8.verdicts(rows),
            "over_seeds": [fp8.seed_gap_text(entry) for entry in fp8.seed_gaps(rows)]}


def section_html(summary: dict) -> str:
    data = section_data(summary)
    if data is None:
        return _section(TITLE, "", EMPTY)
    body = render("fp8.html.j2", said=data["said"], over_seeds=data["over_seeds"], seeds_intro=fp8.SEEDS_INTRO,
                  table=table_html(data["rows"]))
    return _section(TITLE, body, "", INTRO)

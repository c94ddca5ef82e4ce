"""Execute the report notebook with papermill (real parameters) and render self-contained HTML without code.

The HTML uses the template in workflow/report/nbconvert/amprepro: JupyterLab's markup with the report's own CSS and no
script at all (nbconvert's lab template adds require.js, MathJax and a mermaid `<script type="module">` that imports
from a CDN). Before the file is written, `check_offline` refuses any <script>, any external resource and any image
that is not embedded, so the report opens offline, error-free.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "report" / "nbconvert"
TEMPLATE_NAME = "amprepro"
SCRIPT = re.compile(r"<script\b", re.IGNORECASE)
EXTERNAL = re.compile(r"""<(?:link|img|iframe|embed|object|source|audio|video|input)\b"""
                      r"""[^>]*?\b(?:src|href|data)\s*=\s*["']?"""
                      r"""\s*(?!data:|#)([a-z][a-z0-9+.-]*:|//)""", re.IGNORECASE)
PENDING_FIGURE = re.compile(r"amprepro-figure-\d+-pending")  # amprepro.report.figurepool.TOKEN
CSS_URL = re.compile(r"""(?:url\(\s*["']?\s*(?!data:|#)[^)"'\s]+|@import)""", re.IGNORECASE)


class RenderError(RuntimeError):
    pass


def parse_params(pairs: list[str]) -> dict:
    params = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        params[name] = value
    return params


def execute(notebook: str, executed: str, params: dict) -> None:
    import papermill

    Path(executed).parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(notebook, executed, parameters=params, kernel_name="python3", cwd=os.getcwd(),
                               progress_bar=False)


def cell_seconds(nb) -> list[tuple[float, int]]:
    """(seconds, index) of each code cell the executed notebook records a papermill duration for, slowest first."""
    timed = [((cell.get("metadata") or {}).get("papermill") or {}).get("duration") for cell in nb.get("cells", [])]
    return sorted(((round(d, 2), i) for i, d in enumerate(timed) if isinstance(d, (int, float))), reverse=True)


def check_offline(html: str) -> list[str]:
    """Why this HTML would not open offline and error-free (empty when it is fine)."""
    problems = []
    if SCRIPT.search(html):
        problems.append("contains a <script> element")
    for match in EXTERNAL.finditer(html):
        problems.append(f"loads an external resource: {match.group(0)[:120]}")
    for match in CSS_URL.finditer(html):
        problems.append(f"CSS fetches a resource: {match.group(0)[:120]}")
    return problems


def strip_stderr(nb) -> list[str]:
    """Move stderr streams (warnings) out of the report into the job log; return them."""
    moved = []
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        kept = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                moved.append(output.get("text", ""))
            else:
                kept.append(output)
        cell["outputs"] = kept
    return moved


def to_html(executed: str, html_path: str):
    """The HTML of the executed notebook, checked offline, written atomically; returns the notebook it read."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(executed, as_version=4)
    for text in strip_stderr(nb):
        print(f"report: notebook stderr (kept out of the HTML): {text.strip()}", file=sys.stderr)
    exporter = HTMLExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(TEMPLATE_DIR)],
                            exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb)
    problems = check_offline(body)
    if PENDING_FIGURE.search(body):  # the notebook ended before show.finish() put every figure in place
        problems.append("a figure is still pending (the notebook's last cell, show.finish(), did not run)")
    if problems:
        raise RenderError("report.html would not be self-contained: " + "; ".join(problems[:5]))
    tmp = Path(html_path).with_suffix(".tmp")
    tmp.write_text(body)
    os.replace(tmp, html_path)
    return nb


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--notebook", required=True)
    parser.add_argument("--executed", required=True)
    parser.add_argument("--html", required=True)
    parser.add_argument("--param", action="append", default=[], help="name=value, passed to papermill")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    execute(args.notebook, args.executed, parse_params(args.param))
    executed = time.perf_counter()
    timed = cell_seconds(to_html(args.executed, args.html))
    slowest = ", ".join(f"cell {i} {d:.1f} s" for d, i in timed[:3])
    # where the report's time goes (its log), e.g. a first import building matplotlib's font cache on a fresh machine
    print(f"report: notebook {executed - started:.1f} s (its cells {sum(d for d, _ in timed):.1f} s; slowest: "
          f"{slowest}), HTML {time.perf_counter() - executed:.1f} s", file=sys.stderr)
    print(f"report: {args.html}")


if __name__ == "__main__":
    main()

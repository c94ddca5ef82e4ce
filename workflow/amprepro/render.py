"""Execute the report notebook with papermill (real parameters) and render self-contained HTML without code."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

EXTERNAL_SCRIPT = re.compile(r"<script[^>]*\bsrc=\"https?://[^\"]*\"[^>]*>\s*</script>", re.IGNORECASE)
MATHJAX_CONFIG = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.DOTALL)


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


def offline_html(html: str) -> str:
    """Drop the CDN scripts nbconvert adds (require.js, MathJax): the report must open offline, error-free."""
    return EXTERNAL_SCRIPT.sub("", MATHJAX_CONFIG.sub("", html))


def to_html(executed: str, html_path: str) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nbformat.read(executed, as_version=4))
    tmp = Path(html_path).with_suffix(".tmp")
    tmp.write_text(offline_html(body))
    os.replace(tmp, html_path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--notebook", required=True)
    parser.add_argument("--executed", required=True)
    parser.add_argument("--html", required=True)
    parser.add_argument("--param", action="append", default=[], help="name=value, passed to papermill")
    args = parser.parse_args(argv)
    execute(args.notebook, args.executed, parse_params(args.param))
    to_html(args.executed, args.html)
    print(f"report: {args.html}")


if __name__ == "__main__":
    main()

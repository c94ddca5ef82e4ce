"""Reporting: the summary table, claims, the reference check (verify) and the report's data and HTML."""


def print_summary_lines(argv, description: str, lines) -> None:
    """A report module's command line, `python -m amprepro.report.<module> [--summary FILE]`: lines(summary), one per
    line, from the run's own results/summary/summary.json unless --summary names another."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--summary", default="results/summary/summary.json")
    args = parser.parse_args(argv)
    for line in lines(json.loads(Path(args.summary).read_text())):
        print(line)

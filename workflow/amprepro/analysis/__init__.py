"""Analysis: the summary table, the claims' verdicts, the FP8 and convergence statistics and the memory regimes.

Statistics and judgements only: nothing here draws a chart or writes HTML (amprepro.report does, from what these
modules compute), so the summary's code digest covers only the code that computes it."""


def print_summary_lines(argv, description: str, lines) -> None:
    """An analysis module's command line, `python -m amprepro.analysis.<module> [--summary FILE]`: lines(summary),
    one per line, from the run's own results/summary/summary.json unless --summary names another."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--summary", default="results/summary/summary.json")
    args = parser.parse_args(argv)
    for line in lines(json.loads(Path(args.summary).read_text())):
        print(line)

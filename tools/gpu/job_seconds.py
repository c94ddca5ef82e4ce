"""Wall seconds of every Snakemake job, read from what Snakemake printed (job start stamps and `Finished jobid`).

    python tools/gpu/job_seconds.py make-run.log [more logs of the same run, in order]
"""
import datetime as dt
import re
import sys

STAMP = re.compile(r"^\[(\w{3} \w{3}\s+\d+ \d\d:\d\d:\d\d \d{4})\]$")
RULE = re.compile(r"^local(rule|checkpoint) (\w+):")
JOBID = re.compile(r"\s+jobid: (\d+)")
WILDCARDS = re.compile(r"\s+wildcards: (.*)")
FINISHED = re.compile(r"Finished jobid: (\d+) \(Rule: (\w+)\)")


def parse(paths):
    """(rule, wildcards, seconds) of every job that finished, over the logs of one run."""
    return [(rule, wildcards, (end - begin).total_seconds()) for rule, wildcards, begin, end in spans(paths)]


def spans(paths):
    """(rule, wildcards, start, end) of every job that finished, over the logs of one run: Snakemake's stamps, whole
    seconds of the machine's local time."""
    start, rows = {}, []
    for p in paths:
        with open(p) as log:
            parse_log(p, log, start, rows)
    return rows


def parse_log(p, log, start, rows):
    ts, cur = None, None
    for raw in log:
        line = raw.rstrip("\n")
        if m := STAMP.match(line):
            ts = dt.datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := RULE.match(line):
            cur = {"rule": m.group(2), "t0": ts, "wc": ""}
        elif (m := JOBID.match(line)) and cur:
            start[(p, m.group(1))] = cur
            cur["id"] = m.group(1)
        elif (m := WILDCARDS.match(line)) and cur:
            cur["wc"] = m.group(1)
        elif (m := FINISHED.match(line)) and (p, m.group(1)) in start:
            s = start[(p, m.group(1))]
            rows.append((s["rule"], s["wc"], s["t0"], ts))


def main():
    rows = parse(sys.argv[1:])
    tr = [r for r in rows if r[0] == "train"]
    print(len(tr), "train jobs, sum", sum(r[2] for r in tr), "s, mean", sum(r[2] for r in tr) / max(1, len(tr)))
    for r in sorted(rows, key=lambda r: -r[2])[:60]:
        print(r)


if __name__ == "__main__":
    main()

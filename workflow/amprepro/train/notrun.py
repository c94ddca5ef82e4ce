"""A cell the launcher does not start (amprepro.plan.launcher: this job has fewer GPUs or nodes than the cell asks
for), written as skipped with the reason. The launcher runs it in a child of the cell server where make run started
one, so the record costs no fresh import of torch (3-5 s a job on the H200 box; the paper preset's two 2-GPU cells
took 5 s each to say they were skipped on one GPU, results-reference/perf/443ae11).

    python -m amprepro.train.notrun --cause machine --needs "2 GPUs" --reason "..." -- <train args>
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cause", required=True, help="the skip's cause, as train.not_run_record takes it")
    parser.add_argument("--needs", required=True, help="what the cell needs that this job lacks")
    parser.add_argument("--reason", required=True, help="the sentence the record and the report show")
    parser.add_argument("train", nargs=argparse.REMAINDER, help="-- then the train job's arguments")
    args = parser.parse_args(argv)
    train_args = args.train[1:] if args.train[:1] == ["--"] else args.train
    from amprepro.train import train

    train.write_not_run(train_args, args.cause, args.needs, args.reason)


if __name__ == "__main__":
    main()

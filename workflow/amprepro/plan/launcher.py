"""The launcher a train job runs, before any worker exists (the in-cell side, the process group, is
amprepro.train.distributed):

    python -m amprepro.plan.launcher --per-node P --nodes N --device cuda|cpu -- TRAIN ARGUMENTS

checks that the job has what the cell needs (N nodes of a Slurm allocation; with --device cuda, P CUDA devices that
torch can see), and otherwise writes the cell as skipped, with the reason, without starting a worker. Then it runs
the cell: forked from the cell server (amprepro.plan.cellserver) or plain python for one process, `torchrun
--standalone` for P processes on one node, and for N nodes one torchrun per node under `srun`, which meet at the first
node of the allocation (amprepro.plan.launcher --node).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

from amprepro.plan.cellserver import ENTRIES

TRAIN = ["-m", "amprepro.train.train"]
PORT_BASE, PORT_SPAN = 20000, 20000  # the rendezvous port: from the Slurm job id, so two jobs on a node differ



def slurm_job(env: dict) -> dict[str, str]:
    """Slurm's record of the job this process runs in (`scontrol show job`), or {} outside Slurm. Not the SLURM_*
    variables: the Snakemake job step runs as a one-node step (srun -n1) whose variables describe that step."""
    if not env.get("SLURM_JOB_ID"):
        return {}
    out = subprocess.run(["scontrol", "-o", "show", "job", env["SLURM_JOB_ID"]], capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


def slurm_nodes(job: dict[str, str]) -> int:
    """Nodes of the Slurm allocation; 0 outside Slurm."""
    return int(job.get("NumNodes", "0"))


def cuda_devices_visible(env: dict) -> int:
    """The CUDA devices a worker will see, without importing torch (seconds per cell on some GPU boxes): the GPUs
    `nvidia-smi -L` lists, narrowed by CUDA_VISIBLE_DEVICES the way CUDA reads it (up to its first invalid entry)."""
    from amprepro.gpuslots import visible_gpus

    names, how = visible_gpus(env)
    if how == "no nvidia-smi on PATH":  # a container with the driver but not the tool: ask CUDA through torch
        import torch

        return torch.cuda.device_count()
    listed = len(names)
    shown = env.get("CUDA_VISIBLE_DEVICES")
    if shown is None:
        return listed
    count = 0
    for entry in (part.strip() for part in shown.split(",")):
        if not ((entry.isdigit() and int(entry) < listed) or entry.startswith(("GPU-", "MIG-"))):
            break
        count += 1
    return min(count, listed)


def shortfall(per_node: int, nodes: int, device: str, env: dict, job: dict, cuda_count) -> tuple[str, str] | None:
    """(what is missing, reason) when this job has fewer nodes or GPUs than the cell needs, else None."""
    have_nodes = slurm_nodes(job)
    if nodes > 1 and have_nodes < nodes:
        where = f"a Slurm allocation of {have_nodes} node(s)" if have_nodes else "no Slurm allocation"
        return (f"{nodes} nodes", f"this cell asks for {nodes} nodes; it runs in {where} (multi-node cells run "
                "through the Slurm profile: docs/slurm.md)")
    if device == "cuda" and (count := cuda_count()) < per_node:
        shown = env.get("CUDA_VISIBLE_DEVICES")
        return (f"{per_node} GPUs" if per_node > 1 else "a CUDA GPU",
                f"this cell asks for {per_node} GPU(s) per node; this job sees {count} "
                f"(CUDA_VISIBLE_DEVICES={shown if shown is not None else 'unset'})")
    return None


def torchrun() -> list[str]:
    """The torchrun command of the job's own Python. The `torchrun` first on PATH, unless it is the console script of
    another Python (its `#!` line names another python than sys.executable): then `python -m torch.distributed.run`.
    A venv that reaches torch through a .pth file has no torchrun of its own, and the image's one ran the ranks in the
    image's Python, not the run's (H200 x2, 2026-12-04: the summary refused transformer_ddp's records)."""
    found = shutil.which("torchrun")
    if found:
        try:
            with open(found, "rb") as script:
                first = script.readline(300).decode(errors="replace")
        except OSError:
            first = ""
        words = first[2:].split() if first.startswith("#!") else []
        if not (words and re.search(r"python[0-9.]*$", words[0])) or words[0] == sys.executable:
            return [found]
    return [sys.executable, "-m", "torch.distributed.run"]


def torchrun_single_node(per_node: int) -> list[str]:
    return [*torchrun(), "--standalone", "--nproc_per_node", str(per_node)]


def srun_per_node(per_node: int, nodes: int, device: str, job: dict[str, str]) -> list[str]:
    """One task per node of this job's allocation, each starting one torchrun (amprepro.plan.launcher --node) that
    meets the others at the allocation's first node. --overlap: the Snakemake job step holds the CPUs and GPUs."""
    gpus = ["--gpus-per-node", str(per_node)] if device == "cuda" else []
    port = PORT_BASE + int(job["JobId"]) % PORT_SPAN
    return ["srun", "--overlap", "--kill-on-bad-exit=1", "--nodes", str(nodes), "--ntasks", str(nodes),
            "--ntasks-per-node", "1", *gpus, sys.executable, "-m", "amprepro.plan.launcher", "--node",
            "--per-node", str(per_node), "--nodes", str(nodes), "--master-addr", first_node_address(job["NodeList"]),
            "--master-port", str(port)]


def allocation_env(env: dict, job: dict[str, str]) -> dict:
    """The environment for srun: the whole allocation. Inside the Snakemake job step (srun -n1), the SLURM_* node
    variables describe that one-node step, and srun would refuse a second node ("Only allocated 1 nodes")."""
    if not job:
        return env
    return {**env, "SLURM_JOB_NODELIST": job["NodeList"], "SLURM_NODELIST": job["NodeList"],
            "SLURM_JOB_NUM_NODES": job["NumNodes"], "SLURM_NNODES": job["NumNodes"]}


def command(per_node: int, nodes: int, device: str, job: dict[str, str], train_args: list[str]) -> list[str]:
    if nodes > 1:
        return [*srun_per_node(per_node, nodes, device, job), "--", *train_args]
    if per_node > 1:
        return [*torchrun_single_node(per_node), *TRAIN, *train_args]
    return [sys.executable, *TRAIN, *train_args]


def first_node_address(nodelist: str) -> str:
    """The address Slurm reaches the allocation's first node at (NodeAddr): the rendezvous host."""
    first = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                           text=True, check=True).stdout.split()[0]
    record = subprocess.run(["scontrol", "-o", "show", "node", first], capture_output=True, text=True).stdout
    match = re.search(r"\bNodeAddr=(\S+)", record)
    return match.group(1) if match else first


def torchrun_on_node(args: argparse.Namespace, env: dict) -> list[str]:
    """This node's torchrun: static rendezvous at the first node, node rank from srun (SLURM_NODEID)."""
    return [*torchrun(), "--nnodes", str(args.nodes), "--node_rank", env["SLURM_NODEID"], "--nproc_per_node",
            str(args.per_node), "--master_addr", args.master_addr, "--master_port", str(args.master_port)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Launcher options, then `--`, then amprepro.train.train's arguments (passed on as they are)."""
    if "--" not in argv:
        raise SystemExit("amprepro.plan.launcher: give amprepro.train.train's arguments after --")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-node", type=int, required=True, help="processes (GPUs) per node")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cpu",
                        help="cuda: the cell needs --per-node CUDA devices on each node")
    parser.add_argument("--entry", choices=sorted(ENTRIES), default="train",
                        help="batchsearch: a largest-batch search (one process, which records its own skips)")
    parser.add_argument("--node", action="store_true", help="run this node's torchrun (srun starts one per node)")
    parser.add_argument("--master-addr", help="--node: the rendezvous host")
    parser.add_argument("--master-port", type=int, help="--node: the rendezvous port")
    args = parser.parse_args(argv[:split])
    args.train = argv[split + 1:]
    if args.entry != "train" and (args.per_node, args.nodes, args.node) != (1, 1, False):
        parser.error(f"--entry {args.entry} runs one process: --per-node 1 --nodes 1")
    return args


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    if args.node:
        run = [*torchrun_on_node(args, env), *TRAIN, *args.train]
        os.execvp(run[0], run)
    if args.entry != "train":  # one process, forked from the cell server where there is one
        from amprepro.plan import cellserver

        cellserver.run_entry(args.entry, args.train, env)
    job = slurm_job(env) if args.nodes > 1 else {}
    missing = shortfall(args.per_node, args.nodes, args.device, env, job, lambda: cuda_devices_visible(env))
    if missing:
        print(f"amprepro.plan.launcher: not starting the cell: {missing[1]}", file=sys.stderr, flush=True)
        from amprepro.plan import cellserver

        # the record in a child of the cell server where there is one (torch already imported), else here
        code = cellserver.run_cell(["--cause", "machine", "--needs", missing[0], "--reason", missing[1], "--",
                                    *args.train], env, "notrun")
        if code is not None:
            sys.exit(code)
        from amprepro.train import train

        train.write_not_run(args.train, "machine", *missing)
        return
    if args.per_node == 1 and args.nodes == 1:
        from amprepro.plan import cellserver

        code = cellserver.run_cell(args.train, env)  # a child of the preloaded server, when make run started one
        if code is not None:
            sys.exit(code)
    run = command(args.per_node, args.nodes, args.device, job, args.train)
    print(f"amprepro.plan.launcher: {' '.join(run[:24])} ...", file=sys.stderr, flush=True)
    os.execvpe(run[0], run, allocation_env(env, job))


if __name__ == "__main__":
    main()

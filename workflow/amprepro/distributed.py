"""Data parallel training through torchrun: one process per GPU (gloo on CPU, for tests), rank 0 writes results.

The launcher a train job runs, before any worker exists:

    python -m amprepro.distributed --per-node P --nodes N --device cuda|cpu -- TRAIN ARGUMENTS

checks that the job has what the cell needs (N nodes of a Slurm allocation; with --device cuda, P CUDA devices that
torch can see), and otherwise writes the cell as skipped, with the reason, without starting a worker. Then it runs
the cell: plain python for one process, `torchrun --standalone` for P processes on one node, and for N nodes one
torchrun per node under `srun`, which meet at the first node of the allocation (amprepro.distributed --node).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, field

import torch

TRAIN = ["-m", "amprepro.train"]
PORT_BASE, PORT_SPAN = 20000, 20000  # the rendezvous port: from the Slurm job id, so two jobs on a node differ


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    nodes: int = 1
    hosts: list = field(default_factory=lambda: [node_name()])  # the node of each rank

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self) -> torch.device:
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def shard(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous slice of the global batch: together the ranks see exactly the global batch."""
        if not self.active:
            return tensor
        size = tensor.shape[0] // self.world
        return tensor[self.rank * size : (self.rank + 1) * size]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return value
        value = value.detach().clone()
        torch.distributed.all_reduce(value)
        return value / self.world

    def wrap(self, model, device: torch.device, sync_batchnorm: bool):
        if not self.active:
            return model
        if sync_batchnorm:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def close(self) -> None:
        if self.active:
            torch.distributed.destroy_process_group()


def node_name() -> str:
    """The Slurm node this process runs on (two node daemons can share a host), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def setup() -> Dist:
    """Join the torchrun process group when launched by torchrun; a single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    torch.distributed.init_process_group(backend)
    hosts = [None] * world
    torch.distributed.all_gather_object(hosts, node_name())
    return Dist(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")),
                int(os.environ.get("GROUP_WORLD_SIZE", "1")), hosts)


# ---- the launcher ----------------------------------------------------------------------------------------------


def slurm_nodes(env: dict) -> int:
    """Nodes of the Slurm allocation this process runs in; 0 outside Slurm."""
    return int(env.get("SLURM_JOB_NUM_NODES", "1")) if env.get("SLURM_JOB_ID") else 0


def shortfall(per_node: int, nodes: int, device: str, env: dict, cuda_count) -> tuple[str, str] | None:
    """(what is missing, reason) when this job has fewer nodes or GPUs than the cell needs, else None."""
    have_nodes = slurm_nodes(env)
    if nodes > 1 and have_nodes < nodes:
        where = f"a Slurm allocation of {have_nodes} node(s)" if have_nodes else "no Slurm allocation"
        return (f"{nodes} nodes", f"this cell asks for {nodes} nodes; it runs in {where} (multi-node cells run "
                "through the Slurm profile: docs/slurm.md)")
    if device == "cuda" and (count := cuda_count()) < per_node:
        shown = env.get("CUDA_VISIBLE_DEVICES")
        return (f"{per_node} GPUs" if per_node > 1 else "a CUDA GPU",
                f"this cell asks for {per_node} GPU(s) per node; torch sees {count} "
                f"(CUDA_VISIBLE_DEVICES={shown if shown is not None else 'unset'})")
    return None


def torchrun_single_node(per_node: int) -> list[str]:
    return ["torchrun", "--standalone", "--nproc_per_node", str(per_node)]


def srun_per_node(per_node: int, nodes: int, device: str) -> list[str]:
    """One task per node of this job's allocation, each starting one torchrun (amprepro.distributed --node).
    --overlap: the job's own step (the Snakemake job step) holds the allocation's CPUs and GPUs already."""
    gpus = ["--gpus-per-node", str(per_node)] if device == "cuda" else []
    return ["srun", "--overlap", "--kill-on-bad-exit=1", "--nodes", str(nodes), "--ntasks", str(nodes),
            "--ntasks-per-node", "1", *gpus, sys.executable, "-m", "amprepro.distributed", "--node",
            "--per-node", str(per_node), "--nodes", str(nodes)]


def command(per_node: int, nodes: int, device: str, train_args: list[str]) -> list[str]:
    if nodes > 1:
        return [*srun_per_node(per_node, nodes, device), "--", *train_args]
    if per_node > 1:
        return [*torchrun_single_node(per_node), *TRAIN, *train_args]
    return [sys.executable, *TRAIN, *train_args]


def first_node_address(env: dict) -> str:
    """The address Slurm reaches the allocation's first node at (NodeAddr): the rendezvous host."""
    first = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True,
                           text=True, check=True).stdout.split()[0]
    record = subprocess.run(["scontrol", "-o", "show", "node", first], capture_output=True, text=True).stdout
    match = re.search(r"\bNodeAddr=(\S+)", record)
    return match.group(1) if match else first


def torchrun_on_node(per_node: int, nodes: int, env: dict) -> list[str]:
    """This node's torchrun: static rendezvous at the first node, node rank from Slurm."""
    port = PORT_BASE + int(env["SLURM_JOB_ID"]) % PORT_SPAN
    return ["torchrun", "--nnodes", str(nodes), "--node_rank", env["SLURM_NODEID"], "--nproc_per_node",
            str(per_node), "--master_addr", first_node_address(env), "--master_port", str(port)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Launcher options, then `--`, then amprepro.train's arguments (passed on as they are)."""
    if "--" not in argv:
        raise SystemExit("amprepro.distributed: give amprepro.train's arguments after --")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-node", type=int, required=True, help="processes (GPUs) per node")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cpu",
                        help="cuda: the cell needs --per-node CUDA devices on each node")
    parser.add_argument("--node", action="store_true", help="run this node's torchrun (srun starts one per node)")
    args = parser.parse_args(argv[:split])
    args.train = argv[split + 1:]
    return args


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    if args.node:
        run = [*torchrun_on_node(args.per_node, args.nodes, env), *TRAIN, *args.train]
        os.execvp(run[0], run)
    missing = shortfall(args.per_node, args.nodes, args.device, env, torch.cuda.device_count)
    if missing:
        from amprepro import train

        print(f"amprepro.distributed: not starting the cell: {missing[1]}", file=sys.stderr, flush=True)
        train.write_not_run(args.train, "machine", *missing)
        return
    run = command(args.per_node, args.nodes, args.device, args.train)
    print(f"amprepro.distributed: {' '.join(run[:12])} ...", file=sys.stderr, flush=True)
    os.execvp(run[0], run)


if __name__ == "__main__":
    main()

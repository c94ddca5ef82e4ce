"""Data parallel training through torchrun, inside the cell: one process per GPU (gloo on CPU, for tests), rank 0
writes results. The launcher that starts those processes is amprepro.plan.launcher."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch



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
        import torch

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
        import torch.distributed

        value = value.detach().clone()
        torch.distributed.all_reduce(value)
        return value / self.world

    def total(self, value: float | None, device: torch.device) -> float | None:
        """The sum of every rank's value (energy of each rank's GPU, its peak); None when any rank has none."""
        if not self.active:
            return value
        import torch.distributed

        pair = torch.tensor([value or 0.0, value is None], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(pair)
        return None if pair[1] else float(pair[0])

    def wrap(self, model, device: torch.device, sync_batchnorm: bool):
        if not self.active:
            return model
        import torch

        if sync_batchnorm:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def close(self) -> None:
        if self.active:
            import torch.distributed

            torch.distributed.destroy_process_group()


def node_name() -> str:
    """The Slurm node this process runs on (two node daemons can share a host), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def setup() -> Dist:
    """Join the torchrun process group when launched by torchrun; a single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    import torch.distributed

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():  # before the first collective: NCCL puts each rank on its current device
        torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    hosts = [None] * world
    torch.distributed.all_gather_object(hosts, node_name())
    return Dist(int(os.environ["RANK"]), world, local_rank,
                int(os.environ.get("GROUP_WORLD_SIZE", "1")), hosts)

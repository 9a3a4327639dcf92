"""The plug-in under torch.distributed: the process group a Scaler agrees over, and the collectives
gradscale's data-parallel reductions call (lib/dist/communicator.h) run on it (docs/pytorch.md,
"Data-parallel")."""
from __future__ import annotations

import hashlib
from typing import Any, Optional

import torch


def group_of(process_group: Any) -> Optional[Any]:
    """The process group the verdict is agreed over, or None (one process, or process_group=False)."""
    if process_group is False or not torch.distributed.is_available():
        return None
    if not torch.distributed.is_initialized():
        return None
    group = process_group or torch.distributed.group.WORLD
    return group if torch.distributed.get_world_size(group) > 1 else None


def own_group(group):
    """For the world: a new process group of every rank, same backend, for the Scaler's own
    collectives. torch's new_group must be entered by every rank of the world in the same order, which
    holds for the world's Scaler (each rank makes it at its first scale()) but not for a subgroup (ranks
    of other subgroups would enter other calls): a subgroup's collectives stay on the subgroup."""
    dist = torch.distributed
    if dist.get_world_size(group) != dist.get_world_size():
        return group
    return dist.new_group(ranks=list(range(dist.get_world_size())), backend=dist.get_backend(group))


def collective_device(group) -> torch.device:
    """Where a collective's buffer goes: NCCL reduces CUDA tensors only, the other backends host ones."""
    if torch.distributed.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def collective(group, size: int):
    """The collectives gradscale's data-parallel reductions need, on `group`: what the core's Reducer
    calls with (op, values) and expects the result of."""
    dist = torch.distributed
    device = collective_device(group)
    ops = {"sum_int": (torch.int64, dist.ReduceOp.SUM), "sum_float": (torch.float32, dist.ReduceOp.SUM),
           "max": (torch.float64, dist.ReduceOp.MAX)}

    def run(op: str, values: list) -> list:
        if op == "barrier":
            dist.barrier(group=group)
            return []
        if op == "gather":
            mine = torch.tensor(values, dtype=torch.float64, device=device)
            every = [torch.empty_like(mine) for _ in range(size)]
            dist.all_gather(every, mine, group=group)
            return torch.cat(every).tolist()
        if op not in ops:
            raise ValueError(f"gradscale.torch: unknown collective {op!r}")
        dtype, reduce_op = ops[op]
        buf = torch.tensor(values, dtype=dtype, device=device)
        dist.all_reduce(buf, op=reduce_op, group=group)
        return buf.tolist()
    return run


def reducer(core_module, process_group: Any) -> Optional[Any]:
    """The core's Reducer over the process group (None without one): the core then reduces every
    statistic a scale is chosen from over the group as soon as it is computed (docs/pytorch.md,
    "Data-parallel"), so every rank takes the same S0, local scales and join targets."""
    group = group_of(process_group)
    if group is None:
        return None
    size = torch.distributed.get_world_size(group)
    # A group of their own for the reductions inside backward: they never queue behind (or among)
    # DDP's bucket all-reduces, which run on the model's group while backward goes on.
    own = own_group(group)
    return core_module.Reducer(torch.distributed.get_rank(own), size, collective(own, size))


def check_same_graph(signature, group) -> None:
    """Raises on every rank when the ranks' passes meet different layers or joins: with agree_scales
    the statistics are reduced layer by layer inside backward, so every rank must make the same
    reductions in the same order (a data-dependent branch would pair one rank's layer with another's,
    or hang). One collective of two numbers per pass."""
    digest = hashlib.sha256(repr(signature).encode()).digest()
    h = float(int.from_bytes(digest[:6], "little"))  # 48 bits: exact in a double
    buf = torch.tensor([h, -h], dtype=torch.float64, device=collective_device(group))
    torch.distributed.all_reduce(buf, op=torch.distributed.ReduceOp.MAX, group=group)
    if buf[0].item() != -buf[1].item():
        raise RuntimeError("gradscale.torch: scale(): the ranks' backward passes meet different layers "
                           f"(this rank's: {len(signature) - 1} layer boundaries). With agree_scales=True (the "
                           "default) the statistics are reduced layer by layer inside backward, so every rank "
                           "must run the same layers in the same way; give Scaler(..., agree_scales=False) for a "
                           "model whose branches depend on the data (each rank then chooses its own scales; the "
                           "verdict is still the group's)")


def agree(core, group) -> None:
    """One all-reduce per step: every rank takes the verdict of the group, so no rank applies a step
    another skips, and every rank charges the same overflows to the same layers (SPEC §6.5)."""
    verdict = core.agreement_buffer()
    overflows = core.overflow_buffer()
    buf = torch.tensor(verdict + overflows, dtype=torch.float64, device=collective_device(group))
    torch.distributed.all_reduce(buf, group=group)
    summed = buf.tolist()
    core.agree(summed[:len(verdict)])
    core.agree_overflows(summed[len(verdict):])

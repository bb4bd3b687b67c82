"""Do the replicas still hold the same model? Checked at the end of every run.

Each rank sums its local shard; summing over its shard group gives the full model's checksum
for that replica; every rank's figure is gathered and compared. Identical replicas give
bit-identical sums (same shard layout, same reduction order), so the tolerance is tight.
This is what catches a strategy that silently stops synchronising.
"""

from __future__ import annotations

RELATIVE_TOLERANCE = 1e-9


def replica_checksums(strategy, device) -> list[list[float]]:
    import torch
    import torch.distributed as dist

    local = torch.zeros(3, dtype=torch.float64, device=device)
    with torch.no_grad():
        for tensor in strategy.local_tensors():
            t = tensor.detach().to(torch.float64)
            local += torch.stack([t.sum(), (t * t).sum(), t.abs().sum()]).to(device)
    if strategy.shard_group is not None and strategy.shard_group_size > 1:
        dist.all_reduce(local, group=strategy.shard_group)
    gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return [g.tolist() for g in gathered]


def replicas_agree(checksums: list[list[float]]) -> bool:
    reference = checksums[0]
    for row in checksums[1:]:
        if len(row) != len(reference):  # a rank holding other tensors is not a replica
            return False
        for a, b in zip(row, reference, strict=True):
            if abs(a - b) > RELATIVE_TOLERANCE * max(abs(a), abs(b), 1e-30):
                return False
    return True

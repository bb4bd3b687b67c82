"""Launch: who this process is (rank, world, nodes, device) under torchrun, srun, mpirun or alone,
and how it leaves; signals that stop a run."""

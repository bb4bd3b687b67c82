"""One launch (a study's run, the check's workers) -> the commands that start its ranks, as argument lists
(nothing goes through a shell).

  srun        inside an allocation: one srun step, one task per rank (MPI: the same with --mpi)
  torchrun-slurm  inside an allocation: one torchrun per node, started by srun
  torchrun    without Slurm: one torchrun per emulated node on this machine
  standalone  a GPU machine without Slurm: one torchrun --standalone with a process per GPU
  mpi-local   mpirun on this machine, one app context per emulated node
  processes   the local CPU profile without Slurm: one process per rank with torch's env:// variables
  single      one rank: the trainer itself, no launcher
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field


@dataclass
class Launch:
    kind: str
    commands: list  # [(argv, extra environment), ...], started side by side
    env: dict = field(default_factory=dict)  # for every command (MASTER_ADDR, MASTER_PORT)

    def shown(self) -> list[str]:
        """Each command as one could paste it into a shell."""
        lines = []
        for argv, extra in self.commands:
            prefix = [f"{k}={v}" for k, v in extra.items()]
            lines.append(show_command((["env", *prefix] if prefix else []) + list(argv)))
        return lines

    def log_header(self) -> str:
        """What the launch's log opens with: when, the environment it adds, and each command (with
        a `&` when several start side by side), so that the log alone says how to start it again."""
        many = len(self.commands) > 1
        return (
            f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} "
            + " ".join(f"{k}={v}" for k, v in self.env.items())
            + "\n"
            + "".join(f"# {line}{' &' if many else ''}\n" for line in self.shown())
        )


SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=:,+@%{}-")


def show_command(argv) -> str:
    return " ".join(a if a and set(a) <= SAFE else shlex.quote(a) for a in map(str, argv))


def describe(kind: str, system, ranks_per_node: int) -> str:
    """The launcher as the study's header names it."""
    return {
        "srun": f"srun {system.srun_flags.replace('{ranks_per_node}', str(ranks_per_node))}".rstrip(),
        "torchrun-slurm": "torchrun, one per node",
        "torchrun": "torchrun, one per emulated node (no Slurm)",
        "mpi": f"srun {system.mpi_flags}, mpi4py bootstrap".replace("srun , ", "srun, "),
        "mpi-local": "mpirun, mpi4py bootstrap (no Slurm)",
        "processes": f"processes started here, {ranks_per_node} per emulated node (no Slurm)",
        "standalone": "torchrun --standalone on this machine, one process per GPU (no Slurm)",
        "single": "one process (one rank)",
    }[kind]


def launch_kind(launcher: str, use_slurm: bool, one_machine: bool, ranks: int) -> str:
    if ranks == 1 and not use_slurm:
        return "single"
    if one_machine:
        return "standalone"
    if use_slurm:
        return "torchrun-slurm" if launcher == "torchrun" else launcher
    return {"srun": "processes", "mpi": "mpi-local", "torchrun": "torchrun"}[launcher]


def build(
    kind: str,
    python: str,
    args: list,
    *,
    system,
    nodes: int,
    ranks_per_node: int,
    nodelist: str,
    master_addr: str,
    master_port,
    time_limit_min: int | None,
    grace_s: int,
    rdzv_id: str,
    as_root: bool = False,
    program: tuple = ("-m", "vit_scale", "train"),
) -> Launch:
    """The commands of one run; `args` are the trainer's KEY=VALUE. `program`: what each rank runs
    (vit-scale check starts its worker module through the same launchers)."""
    ranks = nodes * ranks_per_node
    train = list(program)
    # the records say whether emulated nodes shared this machine (an isolated emulation overrides it)
    shared = {"VIT_SCALE_EMULATED": "shared"} if getattr(system, "emulation", None) is not None else {}
    rendezvous = {"MASTER_ADDR": str(master_addr), "MASTER_PORT": str(master_port)}
    where = [f"--nodelist={nodelist}"] if nodelist else []

    def flags(text: str) -> list:
        return text.replace("{ranks_per_node}", str(ranks_per_node)).split()

    # srun steps: a rank that fails does not take the others down at once (they write the end
    # record), --wait ends the step that long after the first task ended, --time is the run's limit
    tail = ["--kill-on-bad-exit=0", f"--wait={grace_s}"] + ([f"--time={time_limit_min}"] if time_limit_min else [])
    if kind in ("srun", "mpi"):
        mpi = flags(system.mpi_flags) if kind == "mpi" else []
        argv = [
            "srun",
            f"--nodes={nodes}",
            f"--ntasks={ranks}",
            *where,
            *flags(system.srun_flags),
            *mpi,
            *tail,
            python,
            *train,
            f"system.launcher={kind}",
            *args,
        ]
        return Launch(kind, [(argv, {})], rendezvous)
    torchrun = [python, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc_per_node={ranks_per_node}"]
    if kind == "torchrun-slurm":
        argv = [
            "srun",
            f"--nodes={nodes}",
            f"--ntasks={nodes}",
            *where,
            *flags(system.torchrun_srun_flags),
            *tail,
            *torchrun,
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={master_addr}:{master_port}",
            f"--rdzv_id={rdzv_id}",
            *train,
            "system.launcher=torchrun",
            *args,
        ]
        return Launch(kind, [(argv, {})], rendezvous)
    if kind == "torchrun":
        commands = [
            (
                [
                    *torchrun,
                    f"--node_rank={i}",
                    f"--master_addr={master_addr}",
                    f"--master_port={master_port}",
                    *train,
                    "system.launcher=torchrun",
                    *args,
                ],
                {"VIT_SCALE_NODE_NAME": f"local{i}", **shared},
            )
            for i in range(nodes)
        ]
        return Launch(kind, commands, rendezvous)
    if kind == "standalone":
        argv = [
            python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes=1",
            f"--nproc_per_node={ranks_per_node}",
            *train,
            "system.launcher=torchrun",
            *args,
        ]
        return Launch(kind, [(argv, {})])
    if kind == "mpi-local":
        argv = ["mpirun", *(["--allow-run-as-root"] if as_root else []), "--oversubscribe"]
        for i in range(nodes):  # MPMD: one app context per emulated node, each with its node name
            argv += ([":"] if i else []) + [
                "-np",
                str(ranks_per_node),
                "env",
                f"VIT_SCALE_NODE_NAME=local{i}",
                *[f"{k}={v}" for k, v in shared.items()],
                python,
                *train,
                "system.launcher=mpi",
                *args,
            ]
        return Launch(kind, [(argv, {})])
    if kind == "processes":
        # what torchrun would give each rank (env://), without torchrun's agent processes
        commands = []
        for i in range(ranks):
            commands.append(
                (
                    [python, *train, "system.launcher=torchrun", *args],
                    {
                        "RANK": str(i),
                        "WORLD_SIZE": str(ranks),
                        "LOCAL_RANK": str(i % ranks_per_node),
                        "LOCAL_WORLD_SIZE": str(ranks_per_node),
                        "GROUP_RANK": str(i // ranks_per_node),
                        # the rendezvous too, so that each command as shown (dry run, log) is complete
                        "GROUP_WORLD_SIZE": str(nodes),
                        **rendezvous,
                        "VIT_SCALE_NODE_NAME": f"local{i // ranks_per_node}",
                        **shared,
                    },
                )
            )
        return Launch(kind, commands, rendezvous)
    if kind == "single":
        return Launch(kind, [([python, *train, "system.launcher=single", *args], dict(shared))])
    raise ValueError(kind)

"""One launch (a study's run, the check's workers) -> the commands that start its ranks, as argument lists
(nothing goes through a shell).

  srun        inside an allocation: one srun step, one task per rank (MPI: the same with --mpi)
  torchrun-slurm  inside an allocation: one torchrun per node, started by srun
  torchrun    without Slurm: one torchrun per emulated node on this machine (the nodelist's names, when
              one is given: local0,local1,local3 leaves local2 out; else local0 .. local<n-1>)
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
    if kind not in _BUILDERS:
        raise ValueError(kind)
    run = _Run(
        python=python,
        args=list(args),
        system=system,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        nodelist=nodelist,
        master_addr=str(master_addr),
        master_port=master_port,
        time_limit_min=time_limit_min,
        grace_s=grace_s,
        rdzv_id=rdzv_id,
        as_root=as_root,
        train=list(program),
    )
    return _BUILDERS[kind](run, kind)


@dataclass
class _Run:
    """What every launcher needs to know about the run it starts."""

    python: str
    args: list
    system: object
    nodes: int
    ranks_per_node: int
    nodelist: str
    master_addr: str
    master_port: object
    time_limit_min: int | None
    grace_s: int
    rdzv_id: str
    as_root: bool
    train: list  # what each rank runs after python

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def shared(self) -> dict:
        # the records say whether emulated nodes shared this machine (an isolated emulation overrides it)
        return {"VIT_SCALE_EMULATED": "shared"} if getattr(self.system, "emulation", None) is not None else {}

    @property
    def rendezvous(self) -> dict:
        return {"MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}

    @property
    def names(self) -> list[str]:
        """The emulated nodes' names on this machine: the nodelist's (a run that leaves some out, e.g.
        local0,local1,local3), else local0 .. local<nodes-1>."""
        if not self.nodelist:
            return [f"local{i}" for i in range(self.nodes)]
        names = [n.strip() for n in self.nodelist.split(",") if n.strip()]
        if len(names) < self.nodes:
            raise ValueError(f"nodelist {self.nodelist!r} names fewer than {self.nodes} nodes")
        return names[: self.nodes]

    @property
    def where(self) -> list:
        return [f"--nodelist={self.nodelist}"] if self.nodelist else []

    def flags(self, text: str) -> list:
        return text.replace("{ranks_per_node}", str(self.ranks_per_node)).split()

    @property
    def tail(self) -> list:
        # srun steps: a rank that fails does not take the others down at once (they write the end
        # record), --wait ends the step that long after the first task ended, --time is the run's limit
        limit = [f"--time={self.time_limit_min}"] if self.time_limit_min else []
        return ["--kill-on-bad-exit=0", f"--wait={self.grace_s}", *limit]

    @property
    def torchrun(self) -> list:
        return [
            self.python,
            "-m",
            "torch.distributed.run",
            f"--nnodes={self.nodes}",
            f"--nproc_per_node={self.ranks_per_node}",
        ]


def _srun(run: _Run, kind: str) -> Launch:
    """srun, mpi: one srun step, one task per rank."""
    mpi = run.flags(run.system.mpi_flags) if kind == "mpi" else []
    argv = [
        "srun",
        f"--nodes={run.nodes}",
        f"--ntasks={run.ranks}",
        *run.where,
        *run.flags(run.system.srun_flags),
        *mpi,
        *run.tail,
        run.python,
        *run.train,
        f"system.launcher={kind}",
        *run.args,
    ]
    return Launch(kind, [(argv, {})], run.rendezvous)


def _torchrun_slurm(run: _Run, kind: str) -> Launch:
    """One srun step of one task per node, each a torchrun agent meeting at the c10d rendezvous."""
    argv = [
        "srun",
        f"--nodes={run.nodes}",
        f"--ntasks={run.nodes}",
        *run.where,
        *run.flags(run.system.torchrun_srun_flags),
        *run.tail,
        *run.torchrun,
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={run.master_addr}:{run.master_port}",
        f"--rdzv_id={run.rdzv_id}",
        *run.train,
        "system.launcher=torchrun",
        *run.args,
    ]
    return Launch(kind, [(argv, {})], run.rendezvous)


def _torchrun(run: _Run, kind: str) -> Launch:
    """One torchrun per emulated node on this machine, each with its node rank and node name."""
    commands = [
        (
            [
                *run.torchrun,
                f"--node_rank={i}",
                f"--master_addr={run.master_addr}",
                f"--master_port={run.master_port}",
                *run.train,
                "system.launcher=torchrun",
                *run.args,
            ],
            {"VIT_SCALE_NODE_NAME": name, **run.shared},
        )
        for i, name in enumerate(run.names)
    ]
    return Launch(kind, commands, run.rendezvous)


def _standalone(run: _Run, kind: str) -> Launch:
    argv = [
        run.python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc_per_node={run.ranks_per_node}",
        *run.train,
        "system.launcher=torchrun",
        *run.args,
    ]
    return Launch(kind, [(argv, {})])


def _mpi_local(run: _Run, kind: str) -> Launch:
    argv = ["mpirun", *(["--allow-run-as-root"] if run.as_root else []), "--oversubscribe"]
    for i, name in enumerate(run.names):  # MPMD: one app context per emulated node, each with its node name
        argv += ([":"] if i else []) + [
            "-np",
            str(run.ranks_per_node),
            "env",
            f"VIT_SCALE_NODE_NAME={name}",
            *[f"{k}={v}" for k, v in run.shared.items()],
            run.python,
            *run.train,
            "system.launcher=mpi",
            *run.args,
        ]
    return Launch(kind, [(argv, {})])


def _processes(run: _Run, kind: str) -> Launch:
    """What torchrun would give each rank (env://), without torchrun's agent processes."""
    commands, names = [], run.names
    for i in range(run.ranks):
        env = {
            "RANK": str(i),
            "WORLD_SIZE": str(run.ranks),
            "LOCAL_RANK": str(i % run.ranks_per_node),
            "LOCAL_WORLD_SIZE": str(run.ranks_per_node),
            "GROUP_RANK": str(i // run.ranks_per_node),
            # the rendezvous too, so that each command as shown (dry run, log) is complete
            "GROUP_WORLD_SIZE": str(run.nodes),
            **run.rendezvous,
            "VIT_SCALE_NODE_NAME": names[i // run.ranks_per_node],
            **run.shared,
        }
        commands.append(([run.python, *run.train, "system.launcher=torchrun", *run.args], env))
    return Launch(kind, commands, run.rendezvous)


def _single(run: _Run, kind: str) -> Launch:
    # the node named when the run is given one (a ladder's one-node rung that leaves local0 out)
    named = {"VIT_SCALE_NODE_NAME": run.names[0]} if run.nodelist else {}
    return Launch(kind, [([run.python, *run.train, "system.launcher=single", *run.args], {**named, **run.shared})])


_BUILDERS = {
    "srun": _srun,
    "mpi": _srun,
    "torchrun-slurm": _torchrun_slurm,
    "torchrun": _torchrun,
    "standalone": _standalone,
    "mpi-local": _mpi_local,
    "processes": _processes,
    "single": _single,
}

"""`vit-scale COMMAND ...`: each command is a module with a main(argv), imported only when it runs."""

from __future__ import annotations

import sys

COMMANDS = {
    "train": "one run: one model under one strategy on the launched ranks",
    "plan": "what fits where: memory per device and communication per step",
    "finetune": "fine-tune on real images: evaluation, pretrained weights, checkpoints",
    "study": "a study: many runs launched, supervised, recorded, resumed, then analysed",
    "sweep": "a study across Slurm jobs: one per node count, then the analysis job",
    "prepare": "build the JIT kernels a study's strategies need, before any clock starts",
    "check": "preflight: environment, interconnect, every strategy, the meter; check.json",
}


def _main_of(command: str):
    """The command's main, imported here (not by name) so the import contracts see each arrow."""
    if command == "train":
        from vit_scale.recipes.train import main
    elif command == "plan":
        from vit_scale.plan import main
    elif command == "finetune":
        from vit_scale.recipes.finetune import main
    elif command == "study":
        from vit_scale.study.cli import main
    elif command == "sweep":
        from vit_scale.study.sweep import main
    elif command == "prepare":
        from vit_scale.study.prepare import main
    else:
        from vit_scale.check.cli import main
    return main


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: vit-scale {{{','.join(COMMANDS)}}} ...\n")
        for name, text in COMMANDS.items():
            print(f"  {name:8} {text}")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"vit-scale: error: unknown command '{command}'; allowed: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return _main_of(command)(rest)


if __name__ == "__main__":
    sys.exit(main())

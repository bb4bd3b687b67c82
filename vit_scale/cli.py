"""`vit-scale COMMAND ...`: each command is a module with a main(argv)."""

from __future__ import annotations

import sys

COMMANDS = {
    "train": ("vit_scale.recipes.train", "one run: one model under one strategy on the launched ranks"),
    "plan": ("vit_scale.plan", "what fits where: memory per device and communication per step"),
    "finetune": ("vit_scale.recipes.finetune", "fine-tune on real images: evaluation, pretrained weights, checkpoints"),
    "study": ("vit_scale.study.cli", "a study: many runs launched, supervised, recorded, resumed, then analysed"),
    "sweep": ("vit_scale.study.sweep", "a study across Slurm jobs: one per node count, then the analysis job"),
    "prepare": ("vit_scale.study.prepare", "build the JIT kernels a study's strategies need, before any clock starts"),
    "check": ("vit_scale.check.cli", "preflight: environment, interconnect, every strategy, the meter; check.json"),
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: vit-scale {{{','.join(COMMANDS)}}} ...\n")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:8} {text}")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"vit-scale: error: unknown command '{command}'; allowed: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    import importlib

    return importlib.import_module(COMMANDS[command][0]).main(rest)


if __name__ == "__main__":
    sys.exit(main())

"""`vit-scale prepare`: build or load every JIT kernel a study's strategies need, once per venv and
device kind, before any run's clock starts; clear a build lock left by a build that was killed.

    vit-scale prepare                                  # every strategy, this machine's device kind
    vit-scale prepare --strategies ZERO3,CAI_GEMINI    # what these need
    srun -N 1 -n 1 --gpus=1 vit-scale prepare          # on a GPU node: kernels are built for its GPUs

jobs/weak_scaling.sh runs it on a compute node before the first timed run. On a CUDA machine it
first checks that the CUDA toolkit that would build (CUDA_HOME, or nvcc on PATH) has torch's CUDA
major version, and otherwise says in one line what to load and builds nothing. Exit code 0 when
every kernel is ready, 1 when one could not be built or the toolkit does not fit (the runs that
need it will say why), 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

PROG = "vit-scale prepare"  # the name its messages start with


def device_kind() -> str:
    import torch

    if torch.cuda.is_available():
        return "rocm" if torch.version.hip else "cuda"
    return "cpu"


def torch_cuda_version() -> str | None:
    import torch

    return torch.version.cuda  # None on CPU and ROCm builds


def main(argv=None) -> int:
    from vit_scale.cluster.options import take_prog
    from vit_scale.distributed import all_labels, parse_strategy
    from vit_scale.errors import UserError

    # a job script names itself with --prog, as for study and check
    prog, argv = take_prog(sys.argv[1:] if argv is None else argv, PROG)
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default="", help="comma-separated labels (default: every strategy)")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda", "rocm"),
        default="auto",
        help="device kind to build for (default: what torch sees here)",
    )
    args = parser.parse_args(argv)
    labels = [s for s in args.strategies.replace(",", " ").split() if s] or all_labels()
    labels = [label.replace("HYBRID_<g>GPU", "HYBRID_1GPU") for label in labels]
    try:
        for label in labels:
            parse_strategy(label)
    except UserError as exc:
        print(f"{prog}: --strategies: {str(exc).split(': ', 1)[1]}", file=sys.stderr)
        return 2
    from vit_scale.distributed.kernels import kernels_for, toolkit_problem_here

    kind = device_kind() if args.device == "auto" else args.device
    kernels = kernels_for(labels, kind)
    if not kernels:
        print(f"{prog}: nothing to build for {', '.join(labels)} on {kind}")
        return 0
    problem = toolkit_problem_here(kernels, kind, torch_cuda_version())
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return 1
    print(f"{prog}: {len(kernels)} kernel(s) for {kind}: {', '.join(k.key for k in kernels)}", flush=True)
    failed = 0
    for kernel in kernels:
        try:
            lock = kernel.stale_lock()
            if lock:
                os.remove(lock)
                print(
                    f"  {kernel.key}: removed a build lock nobody was working under ({lock}); a build "
                    f"killed half-way leaves one, and every later build would wait on it",
                    flush=True,
                )
            before = kernel.built_at()
            started = time.monotonic()
            if before is None:
                print(f"  {kernel.key}: building in {kernel.build_dir()} ...", flush=True)
            kernel.load()
            seconds = time.monotonic() - started
            # torch rebuilds a kernel whose sources or flags changed (another torch, another compiler)
            what = "built" if before is None else "loaded, built before" if kernel.built_at() == before else "rebuilt"
            print(f"  {kernel.key}: {what} in {seconds:.1f} s", flush=True)
        except ImportError as exc:
            print(
                f"  {kernel.key}: its package is not installed ({exc.name}); the strategies that need it "
                f"cannot run here",
                flush=True,
            )
            failed += 1
        except Exception as exc:  # a compiler error: say which kernel, go on with the others
            print(f"  {kernel.key}: FAILED: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

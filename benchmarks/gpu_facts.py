"""The GPU and software a set of figures was measured on, as one JSON object: device name, count and
memory, torch, CUDA or ROCm/HIP, NCCL/RCCL, the kernel driver, timm, DeepSpeed, ColossalAI.

    python benchmarks/gpu_facts.py [--out PATH]      (stdout without --out)

The versions are the run record's (vit_scale.record.versions) and the driver the check's (read from
the file the driver publishes), so that these facts say what a run's record and check.json say.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vit_scale.check.environment import driver_version
from vit_scale.record.versions import software_versions


def facts() -> dict:
    import torch

    gpu = torch.cuda.is_available()
    device_type = ("rocm" if torch.version.hip else "cuda") if gpu else "cpu"
    versions = software_versions()
    versions["driver"] = driver_version(device_type)
    device = {"type": device_type, "count": torch.cuda.device_count() if gpu else 0, "name": None, "memory_gib": None}
    if gpu:
        props = torch.cuda.get_device_properties(0)
        device.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 2))
    return {"device": device, "versions": versions}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    found = facts()
    text = json.dumps(found, indent=1)
    print(text, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

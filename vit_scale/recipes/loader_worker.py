"""What a data-loader worker needs, loaded once per rank by the loaders' fork server.

Loader workers do not start by forking the training process (datasets.make_loader): that process
runs gloo's or NCCL's threads and the signal watcher's, and a child forked from a process with
threads can block forever on a lock one of them held at the fork (seen here: rank 1 of a 2-rank
DDP fine-tuning run stuck at an epoch's first batch until rank 0's collective timed out). The fork
server is a fresh single-threaded process; it imports this module once, and every worker is forked
from it with torch, torchvision (through the CPU shim) and the dataset code already loaded.
"""

from vit_scale.compat import ensure_torchvision_importable

ensure_torchvision_importable()

import torchvision.transforms  # noqa: E402,F401 - unpickling a worker's transforms needs it

from vit_scale.recipes import datasets  # noqa: E402,F401

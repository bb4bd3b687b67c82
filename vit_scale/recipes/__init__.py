"""Recipes: what differs between runs. `train` benchmarks on synthetic batches; `finetune` trains
on real images with evaluation and checkpoints."""

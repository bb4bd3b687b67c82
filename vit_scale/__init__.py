"""vit-scale: weak-scaling studies of Vision Transformer training on HPC clusters."""

__version__ = "0.1.0"

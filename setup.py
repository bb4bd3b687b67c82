from setuptools import find_packages, setup

setup(
    name="vit-scale",
    version="0.1.0",
    description="Weak-scaling studies of Vision Transformer training (DDP, FSDP, DeepSpeed ZeRO, ColossalAI) on HPC clusters",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["vit_scale", "vit_scale.*"]),
    # torch is not pinned here: the right build (CUDA, ROCm, CPU) is the site's choice and
    # env/setup_venv.sh installs it first; everything else is installed against it.
    install_requires=[
        "torch>=2.4",
        "torchvision",
        "timm>=1.0",
        "numpy",
        "pyyaml",
        "pandas",
        "matplotlib",
    ],
    extras_require={
        "deepspeed": ["deepspeed>=0.16"],
        # ColossalAI pins an old torch: env/setup_venv.sh installs it with --no-deps plus what it imports
        "colossalai": ["colossalai"],
        "mpi": ["mpi4py"],
        "test": ["pytest", "pytest-timeout", "scikit-learn", "pillow", "jsonschema"],
    },
    entry_points={"console_scripts": ["vit-scale=vit_scale.cli:main"]},
)

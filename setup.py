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
        # What ColossalAI imports. ColossalAI itself pins torch<=2.5.1, so it is installed apart with
        # `pip install --no-deps colossalai==0.5.0` (env/setup_venv.sh --extras colossalai does both)
        "colossalai": ["transformers==4.51.3", "peft==0.13.2", "galore-torch", "bitsandbytes"],
        "mpi": ["mpi4py"],
        # finetune.lora: peft's adapters (the release ColossalAI's extra installs too)
        "lora": ["peft==0.13.2", "transformers==4.51.3"],
        # tracking.backend: TensorBoard event files in the run directory, or W&B (offline by default)
        "tensorboard": ["tensorboard"],
        "wandb": ["wandb"],
        # HolisticTraceAnalysis: tests/test_traces_hta.py checks analysis/traces.py against it; exact pin,
        # since the test compares with this release's definitions (analysis/ itself never imports it)
        "test": ["pytest", "pytest-timeout", "scikit-learn", "pillow", "jsonschema", "tensorboard",
                 "HolisticTraceAnalysis==0.5.0"],
    },
    entry_points={"console_scripts": ["vit-scale=vit_scale.cli:main"]},
)

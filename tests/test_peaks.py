"""MFU's denominator (issue 18, item 6): the device a run reports is matched to its own datasheet
peak, and train.tf32 picks the TF32 figure both in the trainer and in the study's system profile."""

import dataclasses
import os

import pytest

from conftest import ROOT
from vit_scale.cluster import systems
from vit_scale.run.peaks import math_precision, peak_tflops
from vit_scale.study.plan import make_plan


@pytest.mark.parametrize(
    "name, precision, expected",
    [
        # names as torch.cuda.get_device_name reports them
        ("NVIDIA H100 NVL", "bf16", 835.5),
        ("NVIDIA H200 NVL", "bf16", 835.5),
        ("NVIDIA H100 NVL", "tf32", 417.5),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA GH200 480GB", "fp32", 66.9),
        ("AMD Instinct MI250X", "bf16", 191.5),
    ],
)
def test_each_card_gets_its_own_datasheet_peak(name, precision, expected):
    value, source = peak_tflops(name, precision)
    assert value == expected, source


def test_tf32_is_the_arithmetic_only_of_fp32_runs_on_a_gpu():
    assert math_precision("fp32", True, "cuda") == "tf32"
    assert math_precision("fp32", True, "cpu") == "fp32"
    assert math_precision("bf16", False, "cuda") == "bf16"
    assert math_precision("fp32", False, "cuda") == "fp32"


def _peaks_of_runs(sets, profile):
    study = make_plan(
        os.path.join(ROOT, "configs", "studies", "local.yaml"),
        {"models": "vit_micro", "strategies": "DDP", "nodes": "1", "precision": "fp32", "repeat": "1"},
        sets,
        profile,
        ranks_per_node=1,
        alloc_nodes=0,
    )
    return [setting for run in study.runs for setting in run.system_settings]


def test_the_study_gives_tf32_runs_the_profiles_tf32_peak():
    gpu_profile = dataclasses.replace(
        systems.read_system("cuda"), backend="nccl", peak_tflops={"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}
    )
    assert _peaks_of_runs([], gpu_profile) == ["system.peak_tflops=66.9"]
    assert _peaks_of_runs(["train.tf32=true"], gpu_profile) == ["system.peak_tflops=494.7"]
    assert _peaks_of_runs(["train.tf32=on", "train.tf32=false"], gpu_profile) == ["system.peak_tflops=66.9"]
    # a profile without a TF32 figure (MI250X has no TF32) claims none: the trainer then says so
    no_tf32 = dataclasses.replace(gpu_profile, peak_tflops={"fp32": 47.9, "bf16": 191.5})
    assert _peaks_of_runs(["train.tf32=true"], no_tf32) == []

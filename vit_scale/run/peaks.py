"""Peak dense TFLOP/s per device, for MFU. Vendor datasheet figures, no sparsity.

Matched by a substring of the device name torch reports. A GCD of an MI250X is one device to
torch, so its entry is half the MI250X package figure. Override with `system.peak_tflops`.
"""

from __future__ import annotations

# name substring -> {precision: TFLOP/s}; fp32 is the plain (non-TF32) vector/matrix figure, tf32
# the dense TF32 matrix figure (train.tf32); a device without TF32 has none
PEAK_TFLOPS = {
    "MI250X": {"bf16": 191.5, "fp16": 191.5, "fp32": 47.9},
    "MI250": {"bf16": 181.0, "fp16": 181.0, "fp32": 45.3},
    "MI300X": {"bf16": 1307.4, "fp16": 1307.4, "fp32": 163.4, "tf32": 653.7},
    "MI300A": {"bf16": 980.6, "fp16": 980.6, "fp32": 122.6, "tf32": 490.3},
    # the first key contained in the name wins, so the PCIe and NVL cards (lower clocks and power)
    # come before the SXM parts whose names they contain: "NVIDIA H100 NVL" is no 989-TFLOP/s H100
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0, "tf32": 417.5},
    "H200 NVL": {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0, "tf32": 417.5},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "fp32": 51.2, "tf32": 378.0},
    "GH200": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9, "tf32": 494.7},  # before H200: its name contains it
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9, "tf32": 494.7},
    "H100": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9, "tf32": 494.7},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5, "tf32": 156.0},
    "V100": {"bf16": None, "fp16": 125.0, "fp32": 15.7},
    "L40S": {"bf16": 362.1, "fp16": 362.1, "fp32": 91.6, "tf32": 183.0},
}


def math_precision(precision: str, tf32: bool, device_type: str) -> str:
    """The arithmetic a run's matmuls use, which picks its MFU peak: train.tf32 (fp32 runs only)
    makes them TF32 on a GPU; a CPU has no TF32."""
    return "tf32" if tf32 and precision == "fp32" and device_type != "cpu" else precision


def peak_tflops(device_name: str, precision: str, override: float | None = None) -> tuple[float | None, str]:
    """(peak, where it came from); none is claimed for a CPU or an unknown device."""
    if override is not None:
        return override, "config system.peak_tflops"
    for key, table in PEAK_TFLOPS.items():
        if key.lower() in device_name.lower():
            value = table.get(precision)
            if value is None:
                return None, f"no {precision} figure for {key}"
            return value, f"datasheet {key} {precision} dense"
    return None, f"no peak known for '{device_name}'; set system.peak_tflops"

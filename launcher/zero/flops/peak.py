"""A card's peak TFLOP/s (bf16, dense) and the progress line's model TFLOP/s and MFU.

MFU = the model FLOPs a rank does per second / the card's peak. The peak comes from
``DSLAUNCH_PEAK_TFLOPS`` (any card, or to compare against another precision's peak) or from the
table below, by the device's name; where neither knows it, the progress line shows neither figure.
"""
from __future__ import annotations

# (substring of torch.cuda.get_device_name(), peak dense bf16 TFLOP/s per the vendor's data sheets);
# the first match wins, so a specific form factor comes before the family's default.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100", 989.0),    # SXM ("NVIDIA H100 80GB HBM3")
    ("A100", 312.0),    # SXM and PCIe alike
)

PEAK_ENV = "DSLAUNCH_PEAK_TFLOPS"


def peak_tflops(environ: dict[str, str], device_name: str | None) -> float | None:
    """The peak per card: ``DSLAUNCH_PEAK_TFLOPS`` if set (a positive number), else the table; None if unknown."""
    given = environ.get(PEAK_ENV, "").strip()
    if given:
        try:
            value = float(given)
        except ValueError:
            value = 0.0
        return value if value > 0 else None
    if not device_name:
        return None
    for needle, tflops in PEAK_BF16_TFLOPS:
        if needle.lower() in device_name.lower():
            return tflops
    return None


def throughput_fields(flops_per_step: float | None, steps_per_second: float, peak: float | None) -> dict[str, str]:
    """``{"tflop/s": ..., "mfu": ...}`` for the progress line (per rank); empty unless both figures are known."""
    if not flops_per_step or peak is None or steps_per_second <= 0:
        return {}
    achieved = flops_per_step * steps_per_second / 1e12
    return {"tflop/s": f"{achieved:.4g}", "mfu": f"{100.0 * achieved / peak:.1f}%"}

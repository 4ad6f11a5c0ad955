"""The torch device a `device` setting names (generation.device, trainer.device), and why it cannot be had.

"auto" means a CUDA GPU when this process sees one, else the CPU, so one config runs on a laptop and on a
GPU box alike; naming "cuda" where there is none is refused before any model loads.
"""

from __future__ import annotations

import torch


def torch_device(setting: str) -> torch.device:
    """The device `setting` names ("auto", "cpu", "cuda", "cuda:N"); "auto" resolves in this process."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def device_problem(field: str, setting: str) -> str | None:
    """One sentence with the way out when this process cannot use the device `setting` names, else None."""
    device = torch_device(setting)
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return f'{field}="{setting}" needs a CUDA GPU (this process sees none); {field}="auto" uses the CPU here.'
    if device.index is not None and device.index >= torch.cuda.device_count():
        return (f'{field}="{setting}": this process sees {torch.cuda.device_count()} CUDA GPU(s), '
                f"cuda:0 to cuda:{torch.cuda.device_count() - 1}.")
    return None

"""What every config section shares: unknown fields are errors and a resolved config is frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# where a model runs: "auto" is the first CUDA GPU the process sees (cuda:0; under Ray, its own), else the CPU
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"

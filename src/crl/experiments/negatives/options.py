"""The options of ``crl study negatives``, typed and checked before any run trains
(their meaning: :class:`~crl.experiments.negatives.study.NegativesStudy`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator

from crl.experiments.metrics import METRICS
from crl.experiments.negatives.tolerance import tolerance_option
from crl.experiments.study import StudyOptions
from crl.models.config import ModelKind

#: Presets whose study runs the verify stage (``--verify``) and the control arm
#: (``--control``) unless told otherwise.
VERIFY_PRESETS = ("full",)
CONTROL_PRESETS = ("full",)
#: The seeds a verify stage trains by default, whatever the grid's: the recommendation is read
#: from these runs, and with 3 seeds an exact seed resample has 10 distinct draws, so the
#: interval is little more than the spread of 3 values (the full preset's 3 seeds gave
#: independent m* 5,966 [5,189, 6,909] where 4 seeds of the same runs and one more gave 4,734
#: [4,256, 5,250]: docs/negatives.md, "The verify stage"). 5 seeds give 126; presets with
#: fewer grid seeds than this then train the same seeds at the target n.
VERIFY_SEEDS = 5
#: Where a study directory keeps the verify stage's plan.
VERIFY_FILE = "verify.json"


class NegativesOptions(StudyOptions):
    """The options of ``crl study negatives`` (their meaning: :class:`NegativesStudy`), typed
    and checked before any run trains; ``study.json`` records them."""

    data: str = "pycode"
    config: str | None = None
    model: ModelKind | None = None
    metric: str | None = None
    tolerance: float | str = 0.01
    temperature: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    ns: list[int] | None = None
    fractions: list[float] | None = None
    seeds: list[int] | None = None
    budget: int | None = None
    batch_size: int | None = None
    device: str | None = None
    target_n: int | None = None
    refine_runs: int | None = None
    target_epochs: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    target_samples: Annotated[int, Field(ge=1)] | None = None
    verify: bool | None = None
    verify_seeds: Annotated[int, Field(ge=3)] | None = None
    control: bool | None = None
    control_n: Annotated[int, Field(ge=2)] | None = None
    loss: str | None = None

    @field_validator("ns", "fractions", "seeds", mode="before")
    @classmethod
    def _as_list(cls, value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else value

    @field_validator("tolerance", mode="before")
    @classmethod
    def _tolerance(cls, value: Any) -> float | str:
        """:func:`~crl.experiments.negatives.tolerance.tolerance_option`."""
        return tolerance_option(value)

    @field_validator("metric")
    @classmethod
    def _declared(cls, value: str | None) -> str | None:
        if value is not None and value not in METRICS:
            raise ValueError("has no declared direction; choose one of "
                             + ", ".join(sorted(METRICS)))
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str | None) -> str | None:
        from crl.train.config import TrainOptions

        if value is not None:
            try:
                TrainOptions(device=value)  # the runs' own rule for a device
            except ValidationError:
                raise ValueError("must be cpu, cuda or cuda:N") from None
        return value

    def recorded(self) -> dict[str, Any]:
        """``data``, ``metric`` and ``tolerance`` always, the others when given."""
        return {k: v for k, v in self.model_dump().items()
                if k in ("data", "metric", "tolerance") or v is not None}

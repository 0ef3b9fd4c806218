"""Typed configuration of the data sets (the ``data`` section of a run config).

Every field has its default here and nowhere else; unknown keys are errors (``extra="forbid"``).

Example:
    >>> cfg = DataConfig(name="digits", digits={"imbalance_ratio": 10})
    >>> cfg.digits.imbalance_ratio, cfg.val_fraction, cfg.test_fraction
    (10.0, 0.1, 0.2)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


class SyntheticConfig(BaseModel):
    """The closed-form models of docs/theory.md §2, sampled into a fixed pool of pairs.

    Attributes:
        model: ``gaussian_mean_shift`` (``x ~ N(0, I)``, ``y ~ N(a x, sigma^2 I)``),
            ``correlated_gaussian`` (``y | x ~ N(rho x, (1 - rho^2) I)``) or ``latent_classes``
            (disjoint classes of ``items_per_class`` items each; ``x`` and its positive ``y`` are
            items of the same class, one-hot encoded; labels are the classes).
        num_samples: Size of the pool of pairs, split into train/val/test.
        dim: Dimension of ``x`` and ``y`` for the Gaussian models (the mean-shift model's
            formulas, docs/theory.md §2, assume 2).
        a, sigma: Mean-shift parameters.
        rho: Correlation of the correlated Gaussian, in (-1, 1).
        class_probs: Class prior ``pi`` of the latent-class model (sums to 1).
        items_per_class: Items per latent class.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: Literal["gaussian_mean_shift", "correlated_gaussian", "latent_classes"] = (
        "gaussian_mean_shift"
    )
    num_samples: int = Field(4096, ge=4)
    dim: int = Field(2, ge=1)
    a: float = 1.0
    sigma: float = Field(1.0, gt=0)
    rho: float = Field(0.8, gt=-1, lt=1)
    class_probs: list[float] = Field(default_factory=lambda: [0.25, 0.25, 0.25, 0.25])
    items_per_class: int = Field(4, ge=1)

    @model_validator(mode="after")
    def _check_classes(self) -> SyntheticConfig:
        if len(self.class_probs) < 2 or any(p <= 0 for p in self.class_probs):
            raise ValueError(
                f"class_probs must hold at least 2 positive numbers; got {self.class_probs}"
            )
        if abs(sum(self.class_probs) - 1.0) > 1e-6:
            raise ValueError(f"class_probs must sum to 1; got sum {sum(self.class_probs)}")
        return self


class DigitsConfig(BaseModel):
    """scikit-learn's 8x8 digits with two augmented views per image.

    Attributes:
        augment: If False both views are the clean image (for debugging and probes).
        crop_scale: Range of the zoom of the random resized crop (1 = no zoom; < 1 zooms in).
        max_shift: Largest translation, as a fraction of the image side.
        max_rotation: Largest rotation in degrees (uniform in ``[-max_rotation, max_rotation]``).
        noise_std: Standard deviation of the added Gaussian pixel noise (pixels are in [0, 1]).
        cutout_prob: Probability of zeroing one ``cutout_size`` square.
        cutout_size: Side of the cutout square in pixels.
        imbalance_ratio: Most/least frequent class size in the training split (1 = balanced);
            class ``c`` keeps ``n_max * r^(-c / (C - 1))`` images, so class 0 is the most frequent.
            Validation and test splits stay balanced.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    augment: bool = True
    crop_scale: tuple[float, float] = (0.75, 1.0)
    max_shift: float = Field(0.125, ge=0, le=0.5)
    max_rotation: float = Field(15.0, ge=0, le=180)
    noise_std: float = Field(0.05, ge=0)
    cutout_prob: float = Field(0.5, ge=0, le=1)
    cutout_size: int = Field(3, ge=1, le=8)
    imbalance_ratio: float = Field(1.0, ge=1)

    @model_validator(mode="after")
    def _check_scale(self) -> DigitsConfig:
        low, high = self.crop_scale
        if not (0 < low <= high <= 1):
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1; got {self.crop_scale}")
        return self


class PycodeConfig(BaseModel):
    """Docstring-to-code pairs mined from Python sources on this machine.

    Attributes:
        roots: Directories to mine. None: the standard library plus the installed torch, numpy,
            scipy and scikit-learn packages.
        include_tests: Also mine test directories (``test``, ``tests``, ``idle_test``) and
            ``test_*.py`` files; off by default (test functions rarely have useful docstrings).
        min_doc_words: Docstrings whose first paragraph has fewer words are dropped.
        max_code_chars: Code is cut to this many characters.
        cache_dir: Where the mined pairs are cached (None: ``$CRL_CACHE_DIR`` or ``~/.cache/crl``).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    roots: list[str] | None = None
    include_tests: bool = False
    min_doc_words: int = Field(3, ge=1)
    max_code_chars: int = Field(2000, ge=40)
    cache_dir: str | None = None


class ColumnsConfig(BaseModel):
    """Which columns of a table of texts hold what (docs/data.md, "Your own files").

    Attributes:
        a: The column of view ``a`` (queries, anchors).
        b: The column of view ``b`` (documents, positives).
        label: An integer class column (None: the column ``label`` when the file has one).
        negatives: Columns of hard negatives (a text, or a list of texts, per cell): ``H``
            view-b texts per row, extra candidates for that row's anchor only.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    a: str = Field("a", min_length=1)
    b: str = Field("b", min_length=1)
    label: str | None = None
    negatives: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)

    @field_validator("b", "label", "negatives")
    @classmethod
    def _one_role(cls, value: Any, info: ValidationInfo) -> Any:
        """A column has one role: checked on the key that repeats an earlier one, so the error
        names it (fields are validated in order: a, b, label, negatives)."""
        if value is None:
            return value
        earlier = [info.data.get(k) for k in ("a", "b", "label") if k != info.field_name]
        names = [*(n for n in earlier if n), *(value if isinstance(value, list) else [value])]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"each column may have one role; {repeated} has several")
        return value


class FilesConfig(BaseModel):
    """A user's pairs: ``.npz`` (arrays ``a``, ``b``, optional ``labels``), or a table of texts
    (``.jsonl``, ``.csv``, ``.tsv``, ``.parquet``, a ``datasets`` ``save_to_disk`` directory)
    read through ``columns``.

    The split (docs/evaluation.md, "Which split"): by default ``val_fraction`` and
    ``test_fraction`` of ``path``, drawn with ``split_seed``. ``test_path`` (and ``val_path``)
    name files (same format and columns) that are the test (validation) split, the rest of
    ``path`` being split as before without that share; or ``split_column`` names a column of
    ``path`` whose cells say each row's split (``train``, ``val``/``validation``/``dev`` or
    ``test``), and the fractions are not used.

    Attributes:
        path: The pairs.
        val_path, test_path: Files holding the validation / test pairs (None: drawn from
            ``path``).
        split_column: A column naming each row's split (None: drawn).
        columns: The column map.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    path: str | None = None
    val_path: str | None = None
    test_path: str | None = None
    split_column: str | None = Field(None, min_length=1)
    columns: ColumnsConfig = Field(default_factory=ColumnsConfig)

    @model_validator(mode="after")
    def _one_split_source(self) -> FilesConfig:
        if self.split_column is not None and (self.val_path or self.test_path):
            raise ValueError("give split_column or val_path/test_path, not both: the column "
                             "already says which rows are validation and test")
        return self


class DataConfig(BaseModel):
    """Which data set, its splits and its own options.

    Attributes:
        name: The data set.
        seed: Seeds the order of the training split (so ``num_train`` takes nested subsets) and
            the augmentations.
        split_seed: Seeds the train/val/test split and the synthetic pool, kept apart from
            ``seed`` so runs with different seeds are evaluated on the same test set.
        num_train: Cap on the number of training pairs ``n``: the first ``num_train`` of a
            seeded permutation of the training split. None: all of it.
        val_fraction, test_fraction: Shares of the data held out (stratified by class when
            there are labels).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: Literal["synthetic", "digits", "pycode", "files"] = "synthetic"
    seed: int = Field(0, ge=0)
    split_seed: int = Field(0, ge=0)
    num_train: int | None = Field(None, ge=1)
    val_fraction: float = Field(0.1, ge=0, lt=1)
    test_fraction: float = Field(0.2, ge=0, lt=1)
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    digits: DigitsConfig = Field(default_factory=DigitsConfig)
    pycode: PycodeConfig = Field(default_factory=PycodeConfig)
    files: FilesConfig = Field(default_factory=FilesConfig)

    @model_validator(mode="after")
    def _check_fractions(self) -> DataConfig:
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError(
                "val_fraction + test_fraction must be < 1 to leave training data; got "
                f"{self.val_fraction} + {self.test_fraction}"
            )
        return self

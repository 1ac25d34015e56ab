"""FP8 recipes: which FP8 formats a training step uses and how it picks scales.

The names, fields, defaults and checks are Transformer Engine 2.x's, so that code
written against it (Lightning's ``TransformerEnginePrecision`` builds a
``DelayedScaling`` from a dict, Megatron-style code reads ``recipe.fp8_format``,
``recipe.delayed()`` ...) runs unchanged. A recipe only describes; the PyTorch and JAX
front ends carry it out, and refuse with NotImplementedError the recipes OpenTE does
not implement yet (the block-scaled ones).
"""

from __future__ import annotations

import warnings
from dataclasses import InitVar, dataclass, field
from enum import Enum
from typing import Any, Callable, NamedTuple, Optional, Union

__all__ = [
    "Format",
    "Recipe",
    "DelayedScaling",
    "Float8CurrentScaling",
    "MXFP8BlockScaling",
    "Float8BlockScaling",
    "NVFP4BlockScaling",
    "CustomRecipe",
    "QParams",
    "MMParams",
]


class _FormatHelper(NamedTuple):
    """The largest finite values of the forward and backward formats of a Format."""

    max_fwd: float
    max_bwd: float


class Format(Enum):
    """FP8 (and FP4) formats.

    E4M3: every FP8 tensor is E4M3 (largest value 448). E5M2: every FP8 tensor is E5M2
    (57344). HYBRID: E4M3 in the forward pass (activations, weights), E5M2 in the
    backward pass (gradients). E2M1: the FP4 format of NVFP4BlockScaling.
    """

    E2M1 = _FormatHelper(max_fwd=6.0, max_bwd=6.0)
    E4M3 = _FormatHelper(max_fwd=448.0, max_bwd=448.0)
    E5M2 = _FormatHelper(max_fwd=57344.0, max_bwd=57344.0)
    HYBRID = _FormatHelper(max_fwd=448.0, max_bwd=57344.0)


def _check_type(owner: str, name: str, value: Any, types, expected: str) -> None:
    # bool is an int in Python; a flag passed where a count is wanted is a mistake.
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise TypeError(f"{owner}: {name} must be {expected}, got {value!r}")
    if not isinstance(value, types):
        raise TypeError(f"{owner}: {name} must be {expected}, got {type(value).__name__} {value!r}")


def _check_format(owner: str, fp8_format: Any, allowed: tuple) -> None:
    _check_type(owner, "fp8_format", fp8_format, Format, "a transformer_engine.common.recipe.Format")
    if fp8_format not in allowed:
        names = ", ".join(f"Format.{f.name}" for f in allowed)
        raise ValueError(f"{owner}: fp8_format must be one of {names}, got Format.{fp8_format.name}"
                         + (" (pure E5M2 training is not supported)" if fp8_format is Format.E5M2 else ""))


def _check_flags(owner: str, recipe: Any, names: tuple) -> None:
    for name in names:
        _check_type(owner, name, getattr(recipe, name), bool, "a bool")


class Recipe:
    """Base class of the recipes; the predicates say which one an object is."""

    def delayed(self) -> bool:
        return isinstance(self, DelayedScaling)

    def float8_current_scaling(self) -> bool:
        return isinstance(self, Float8CurrentScaling)

    def float8_per_tensor_scaling(self) -> bool:
        return isinstance(self, (DelayedScaling, Float8CurrentScaling))

    def mxfp8(self) -> bool:
        return isinstance(self, MXFP8BlockScaling)

    def float8_block_scaling(self) -> bool:
        return isinstance(self, Float8BlockScaling)

    def nvfp4(self) -> bool:
        return isinstance(self, NVFP4BlockScaling)

    def custom(self) -> bool:
        return isinstance(self, CustomRecipe)


@dataclass()
class DelayedScaling(Recipe):
    """Per-tensor scales from the amax history of earlier steps.

    Each FP8 tensor keeps the amaxes of its last ``amax_history_len`` steps; after a
    step, the amax chosen by ``amax_compute_algo`` ("max" of the window, "most_recent",
    or a callable ``f(amax_history) -> amax``) sets the scale for the next step:
    ``scale = fp8_max / amax / 2**margin`` (or ``scaling_factor_compute_algo(amax,
    old_scale, fp8_max, recipe)``). An amax of 0 or not finite keeps the old scale.
    ``reduce_amax`` all-reduces the amaxes over the autocast's ``fp8_group``.
    ``fp8_dpa`` / ``fp8_mha``: FP8 attention (dot product / whole block).

    ``interval`` and ``override_linear_precision`` were removed from Transformer
    Engine; they are accepted as keywords and ignored, with a warning.
    """

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Union[str, Callable] = "max"
    scaling_factor_compute_algo: Optional[Callable] = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    interval: InitVar[Optional[int]] = None
    override_linear_precision: InitVar[Optional[tuple]] = None

    def __post_init__(self, interval, override_linear_precision):
        owner = "DelayedScaling"
        for name, value in (("interval", interval), ("override_linear_precision", override_linear_precision)):
            if value is not None:
                warnings.warn(f"{owner}: {name} was removed from Transformer Engine and is ignored",
                              UserWarning, stacklevel=3)
        _check_type(owner, "margin", self.margin, (int, float), "a number >= 0")
        if self.margin < 0:
            raise ValueError(f"{owner}: margin must be >= 0, got {self.margin}")
        _check_format(owner, self.fp8_format, (Format.E4M3, Format.HYBRID))
        _check_type(owner, "amax_history_len", self.amax_history_len, int, "an int >= 1")
        if self.amax_history_len < 1:
            raise ValueError(f"{owner}: amax_history_len must be >= 1, got {self.amax_history_len}")
        algo = self.amax_compute_algo
        if not callable(algo) and algo not in ("max", "most_recent"):
            raise ValueError(f"{owner}: amax_compute_algo must be 'max', 'most_recent' or a callable "
                             f"f(amax_history) -> amax, got {algo!r}")
        if self.scaling_factor_compute_algo is not None and not callable(self.scaling_factor_compute_algo):
            raise TypeError(f"{owner}: scaling_factor_compute_algo must be None or a callable, "
                            f"got {self.scaling_factor_compute_algo!r}")
        _check_flags(owner, self, ("reduce_amax", "fp8_dpa", "fp8_mha"))

    def __repr__(self) -> str:
        return (f"recipe_type={type(self).__name__}, margin={self.margin}, format={self.fp8_format}, "
                f"amax_history_len={self.amax_history_len}, reduce_amax={self.reduce_amax}, "
                f"fp8_dpa={self.fp8_dpa}, fp8_mha={self.fp8_mha}")


class QParams(NamedTuple):
    """How current scaling quantizes one kind of tensor: scales rounded down to powers
    of two or not, and the smallest amax a scale is computed from."""

    power_2_scale: bool = False
    amax_epsilon: float = 0.0


class MMParams(NamedTuple):
    """Options of one FP8 GEMM: accumulate in fp32 in slices (split accumulator)."""

    use_split_accumulator: bool = True


@dataclass()
class Float8CurrentScaling(Recipe):
    """Per-tensor scales from each tensor's own amax, computed just before it is cast
    (``scale = fp8_max / max(amax, amax_epsilon)``, optionally a power of two)."""

    fp8_format: Format = Format.HYBRID
    fp8_quant_fwd_inp: QParams = field(default_factory=QParams)
    fp8_quant_fwd_weight: QParams = field(default_factory=QParams)
    fp8_quant_bwd_grad: QParams = field(default_factory=QParams)
    fp8_gemm_fprop: MMParams = field(default_factory=lambda: MMParams(use_split_accumulator=False))
    fp8_gemm_dgrad: MMParams = field(default_factory=lambda: MMParams(use_split_accumulator=True))
    fp8_gemm_wgrad: MMParams = field(default_factory=lambda: MMParams(use_split_accumulator=True))
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        owner = "Float8CurrentScaling"
        _check_format(owner, self.fp8_format, (Format.E4M3, Format.HYBRID))
        for name in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
            _check_type(owner, name, getattr(self, name), QParams, "a recipe.QParams")
        for name in ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"):
            _check_type(owner, name, getattr(self, name), MMParams, "a recipe.MMParams")
        _check_flags(owner, self, ("fp8_dpa", "fp8_mha"))

    def __repr__(self) -> str:
        return (f"recipe_type={type(self).__name__}, format={self.fp8_format}, "
                f"fp8_quant_fwd_inp={self.fp8_quant_fwd_inp}, fp8_quant_fwd_weight={self.fp8_quant_fwd_weight}, "
                f"fp8_quant_bwd_grad={self.fp8_quant_bwd_grad}, fp8_dpa={self.fp8_dpa}, fp8_mha={self.fp8_mha}")


# The block-scaled recipes below can be built (clients import and construct them), but
# OpenTE does not carry them out yet: fp8_autocast refuses them with NotImplementedError.


@dataclass()
class MXFP8BlockScaling(Recipe):
    """MXFP8: E8M0 scales shared by blocks of 32 elements (Blackwell). Not implemented in OpenTE."""

    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        _check_format("MXFP8BlockScaling", self.fp8_format, (Format.E4M3, Format.HYBRID))


@dataclass()
class Float8BlockScaling(Recipe):
    """FP8 with fp32 scales per 1x128 / 128x128 blocks. Not implemented in OpenTE."""

    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        _check_format("Float8BlockScaling", self.fp8_format, (Format.E4M3, Format.HYBRID))


@dataclass()
class NVFP4BlockScaling(Recipe):
    """NVFP4: E2M1 values with scales per 16 elements (Blackwell). Not implemented in OpenTE."""

    fp4_format: Format = Format.E2M1
    fp8_dpa: bool = False
    fp8_mha: bool = False


@dataclass()
class CustomRecipe(Recipe):
    """A user-supplied quantizer factory. Not implemented in OpenTE."""

    qfactory: Optional[Callable] = None
    fp8_dpa: bool = False
    fp8_mha: bool = False

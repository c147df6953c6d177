"""Argument rules written beside the fields they guard.

An `Args` field states its accepted range in its annotation,

    learning_rate: Annotated[float, Positive] = 2.5e-4
    gamma: Annotated[float, Fraction] = 0.99
    hidden_sizes: Annotated[tuple[int, ...], AtLeastOne] = (64, 64)   # every element
    target_kl: Annotated[float | None, Positive] = None                # when not None

and `check_fields(args)` (called from each `Args.__post_init__`, so before
anything is built or compiled) refuses a value outside it with a ValueError
naming the field, the value and the accepted range. Every float field must be
finite (`nan` and `inf` are refused) whether or not it has a rule. tyro ignores
the annotation's extra metadata, so `--help` is unchanged.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """Accepted values: `> gt`, `>= ge`, `< lt`, `<= le` (each optional)."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def accepts(self, value: float) -> bool:
        return (
            (self.gt is None or value > self.gt)
            and (self.ge is None or value >= self.ge)
            and (self.lt is None or value < self.lt)
            and (self.le is None or value <= self.le)
        )

    def __str__(self) -> str:
        low = f"({self.gt:g}" if self.gt is not None else f"[{self.ge:g}" if self.ge is not None else None
        high = f"{self.lt:g})" if self.lt is not None else f"{self.le:g}]" if self.le is not None else None
        if low and high:
            return f"in {low}, {high}"
        if low:
            return f"{'>' if self.gt is not None else '>='} {low[1:]}"
        if high:
            return f"{'<' if self.lt is not None else '<='} {high[:-1]}"
        return "any finite value"


Positive = Range(gt=0)
NonNegative = Range(ge=0)
AtLeastOne = Range(ge=1)
Fraction = Range(ge=0, le=1)  # discounts, lambdas, probabilities
OpenFraction = Range(gt=0, le=1)  # Polyak tau, fractions that must move


def check_fields(args) -> None:
    """Raise ValueError for the first field of the dataclass `args` whose value
    breaks its annotated `Range` or is a non-finite float."""
    hints = typing.get_type_hints(type(args), include_extras=True)
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        rules = [m for m in getattr(hints.get(field.name), "__metadata__", ()) if isinstance(m, Range)]
        for item in value if isinstance(value, tuple) else (value,):
            if item is None or isinstance(item, (bool, str)):
                continue
            accepted = " and ".join(str(r) for r in rules) or "a finite number"
            where = (
                f"{field.name}={value!r}"
                if not isinstance(value, tuple)
                else f"{field.name}={value!r} (element {item!r})"
            )
            if isinstance(item, float) and not math.isfinite(item):
                raise ValueError(f"{where} is not a finite number; accepted: {accepted}")
            for rule in rules:
                if not rule.accepts(item):
                    raise ValueError(f"{where} is out of range; accepted: {rule}")

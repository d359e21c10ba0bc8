"""Kubernetes resource quantities ('500m', '1Gi', '2', '1.5G') read as the API server reads them (pure).

A quantity is a decimal number and an optional suffix: `m` (milli), the
decimal SI `k M G T P E`, or the binary `Ki Mi Gi Ti Pi Ei` (so `M` is mega
and `m` milli, unlike `sizing.parse_bytes`). The API server stores each one in
its canonical form (`resource.Quantity.String()`: 0.5 -> 500m, 1024Mi -> 1Gi,
2000m -> 2), so two spellings of one value are the same quantity:
`same_quantity` compares values, exactly (as fractions).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

# What the API server accepts as a quantity here (no exponents such as 1e3, no sign).
QUANTITY_PATTERN = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")

SUFFIX_FACTORS = {
    "": 1,
    "m": Fraction(1, 1000),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(quantity: str) -> Fraction:
    """The exact value of a quantity; ValueError for anything `QUANTITY_PATTERN` does not match."""
    match = QUANTITY_PATTERN.fullmatch(quantity) if isinstance(quantity, str) else None
    if match is None:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity (examples: 2Gi, 512Mi, 4G, 500m)")
    suffix = match.group(2) or ""
    return Fraction(quantity[: len(quantity) - len(suffix)]) * SUFFIX_FACTORS[suffix]


def quantity_bytes(quantity: str) -> int:
    """A memory quantity ('2Gi', '1.5G', '512M', '3000000000') -> bytes, rounded up to a whole byte."""
    return math.ceil(parse_quantity(quantity))


def whole_bytes(quantity: str | int) -> int:
    """A memory size given as a quantity (or an integer of bytes) -> bytes; ValueError unless a whole byte count.

    `spec.resources.gpuMemory` is read so: the API server warns that a
    fractional byte value is invalid, and one here would size a KV cache
    from a typo ('500m' is 0.5 bytes: m is milli; 500M is megabytes, 500Mi
    mebibytes), so it is refused rather than rounded.
    """
    if isinstance(quantity, bool) or not isinstance(quantity, (int, str)):
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity (examples: 80Gi, 81559Mi, 80G)")
    if isinstance(quantity, str) and quantity.endswith("B") and QUANTITY_PATTERN.fullmatch(quantity[:-1]):
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity: write {quantity[:-1]!r} (no B)")
    value = Fraction(quantity) if isinstance(quantity, int) else parse_quantity(quantity)
    if value.denominator != 1:
        hint = (
            " (m is milli; megabytes are M, mebibytes Mi)"
            if isinstance(quantity, str) and quantity.endswith("m")
            else ""
        )
        raise ValueError(f"{quantity!r} is {float(value):g} bytes, not a whole number of bytes{hint}")
    return int(value)


def same_quantity(a: object, b: object) -> bool:
    """Whether `a` and `b` are quantities of one value ('1Gi' and '1024Mi'); False when either is not one."""
    try:
        return parse_quantity(a) == parse_quantity(b)  # type: ignore[arg-type]
    except ValueError:
        return False

"""A setting's one home: its typed field on a frozen settings dataclass (`OptimConfig`, `run.settings`'s), which holds
its kind and range (`Number`, in the field's metadata: `setting(number=...)`) and its default, or none where the YAML
always sets it (the test in tests/test_settings_fields.py walks the fields and the composed configs to hold that).

The checks that run before anything is written (`run.config_checks.NUMBERS`) are built from these fields, and a
settings object checks its own fields as it is made (`check_fields`: one read back from a checkpoint too), so a range
cannot drift from the value it guards. A rule that relates two fields is code, in the `__post_init__` beside them.
Torch-free, as the settings are."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from lightbert.errors import ConfigError


@dataclass(frozen=True)
class Number:
    """What a number setting allows: its kind, its range, and whether null or `auto` stand for it."""

    kind: type = int
    minimum: float = 0  # value >= minimum
    positive: bool = False  # value > 0
    largest: float | None = None  # value <= largest
    below: float | None = None  # value < below
    nullable: bool = False  # null is a value (it means what the field's comment says)
    or_auto: bool = False  # "auto" is a value
    items: int | None = None  # a list of this many numbers, each in the range (optim.betas)
    example: str | None = None  # a value the message shows, where the kind is not obvious (a list)

    def check(self, key: str, value: Any) -> Any:
        """`value` as this kind (a list of them, for `items`), or one message naming `key`: a value of the wrong kind
        or out of range fails here, not in a traceback from deep in Lightning or the data code."""
        if (value is None and self.nullable) or (self.or_auto and value == "auto"):
            return value
        if self.items is not None:
            return self._check_items(key, value)
        number = as_number(value, self.kind)
        if number is None:
            what = ("an integer" if self.kind is int else "a number") + (" or auto" if self.or_auto else "")
            raise ConfigError(f"{key} must be {what}, got {value!r}")
        if not self.holds(number):
            raise ConfigError(f"{key} must be {self.bound}, got {value!r}")
        return self.kind(number)

    def _check_items(self, key: str, value: Any) -> tuple:
        values = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else None
        numbers = [as_number(v, self.kind) for v in values or []]
        if values is None or len(values) != self.items or any(n is None or not self.holds(n) for n in numbers):
            count = {2: "two", 3: "three"}.get(self.items, str(self.items))
            example = f" (e.g. {key}={self.example})" if self.example else ""
            raise ConfigError(f"{key} must be {count} numbers, each {self.bound}{example}, got {value!r}")
        return tuple(self.kind(n) for n in numbers)

    def holds(self, number: float) -> bool:
        return (
            number >= self.minimum
            and (not self.positive or number > 0)
            and (self.largest is None or number <= self.largest)
            and (self.below is None or number < self.below)
        )

    @property
    def bound(self) -> str:
        """The range in words, as the messages say it: `> 0`, `>= 0 and < 1`, `from 0 to 4294967295`."""
        low = "> 0" if self.positive else f">= {self.minimum:g}"
        if self.below is not None:
            return f"{low} and < {self.below:g}"
        if self.largest is None:
            return low
        return f"{low} and <= {self.largest:g}" if self.largest == 1 else f"from {self.minimum:g} to {self.largest:.0f}"


@dataclass(frozen=True)
class CountOrFile:
    """What a setting of a count of things or a file listing them allows (task.datamodule.add_words): null, a count
    (an int: `1e3`, `10.0` and `'40'` are counts too, as anything that reads as a whole number is), or the path of a
    file (any other text; a file named like a number is given as ./40)."""

    what: str  # what is counted, for the messages: "words"

    def check(self, key: str, value: Any) -> int | str | None:
        if value is None:
            return None
        text = value.strip() if isinstance(value, str) else None
        if text is not None and as_number(text, float) is None:
            if not text:
                what = self.what
                raise ConfigError(
                    f"{key} is empty: give a count of {what} (e.g. {key}=2000) or a file of {what}, one a line"
                )
            return text
        count = as_number(value, int)
        if count is None or count < 0:
            raise ConfigError(
                f"{key} must be a count of {self.what} (0 or more) or a file of {self.what}, got {value!r}"
            )
        return int(count)


def as_number(value: Any, kind: type) -> float | None:
    """`value` as a number of `kind` (a text that reads as one too: `'1e3'`), or None: a bool, a non-finite number, a
    fraction where an int is asked for."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    if kind is int and value != int(value):
        return None
    return value


def setting(
    default: Any = MISSING, *, number: Number | CountOrFile | None = None, key: str | None = None, **kwargs: Any
) -> Any:
    """A settings field: its default (none: the YAML always sets it, or the run cannot go without it), its kind and
    range (`number`), and its config key under the part's prefix where that is not the field's name (`key`)."""
    metadata = {"number": number, "key": key}
    return field(default=default, metadata=metadata, **kwargs)


def number_fields(cls: type) -> list[tuple[Field, Number | CountOrFile]]:
    """The fields of a settings class that are numbers, each with what it allows."""
    return [(f, f.metadata["number"]) for f in fields(cls) if f.metadata.get("number") is not None]


def config_key(part: str, f: Field) -> str:
    """A field's config key: `part` (`optim`, `trainer`; '' for the top level) and its name or its metadata's key."""
    name = f.metadata.get("key") or f.name
    return f"{part}.{name}" if part else name


def numbers_of(cls: type, part: str) -> dict[str, Number | CountOrFile]:
    """Each number field of `cls` by its config key under `part`: what `run.config_checks` checks it against."""
    return {config_key(part, f): number for f, number in number_fields(cls)}


def required(f: Field) -> bool:
    """Whether a field has no default: the YAML always sets it, or nothing could stand in for it."""
    return f.default is MISSING and f.default_factory is MISSING


def values_of(cls: type, part: str, checked: dict[str, Any]) -> dict[str, Any]:
    """The checked numbers (`run.config_checks.checked_numbers`) of `cls`'s number fields, by field name: a key the
    config does not hold is left out, so that the field's own default stands (the only one it has)."""
    return {f.name: checked[config_key(part, f)] for f, _ in number_fields(cls) if config_key(part, f) in checked}


def check_fields(settings: Any, part: str) -> None:
    """Each number field of a (frozen) settings object against its range, named by its config key, and held as its
    kind (`1` as 1.0 for a float, a list as a tuple): an object made in code or read back from a checkpoint is held
    to the rules a run's config is checked against, and the value checked is the value it keeps."""
    for f, number in number_fields(type(settings)):
        object.__setattr__(settings, f.name, number.check(config_key(part, f), getattr(settings, f.name)))

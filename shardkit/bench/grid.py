"""The benchmark grid: every requested loader setting, with the ones that do not apply marked N/A.

``torch.utils.data.DataLoader`` rejects ``prefetch_factor`` and ``persistent_workers=True`` when
``num_workers == 0`` (case 20, pytorch/pytorch#68576), and ``pin_memory`` does nothing without an
accelerator. Such a grid point is not run and not crashed on: it becomes an N/A row whose
``same_as`` names the row that measured the setting that really applies (for num_workers=0: one
run without prefetch_factor and without persistent workers).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from shardkit.errors import ConfigError

__all__ = ["Setting", "GridRow", "expand_grid", "parse_int_list", "parse_mode"]

MODES = {"on": (True,), "off": (False,), "both": (False, True)}


@dataclass(frozen=True)
class Setting:
    """One loader configuration. ``prefetch_factor`` None = not passed / not applicable."""

    data: str
    format: str | None
    decoder: str
    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return asdict(self)


@dataclass
class GridRow:
    """A grid point: ``status`` "run" (to be measured) or "n/a" (with ``note`` and ``same_as``).

    ``requested`` is the combination asked for; ``setting`` what runs (for a "run" row that drops
    an option that does not apply, the setting without it, and ``note`` says so).
    """

    id: int
    requested: Setting
    setting: Setting
    status: str
    note: str = ""
    same_as: int | None = None


def parse_int_list(text: str, name: str, *, minimum: int = 0, allow_none: bool = False
                   ) -> list[int | None]:
    """``"0,1,2,4"`` -> ``[0, 1, 2, 4]`` (order kept, duplicates dropped).

    ``"none"`` is accepted as None when ``allow_none``.

    Raises:
        ConfigError: an item is not an integer >= ``minimum`` (names the option and the item).
    """
    out: list[int | None] = []
    for item in (s.strip() for s in str(text).split(",")):
        if allow_none and item.lower() == "none":
            value = None
        else:
            try:
                value = int(item)
            except ValueError:
                raise ConfigError(f"{name}: {item!r} is not an integer; expected a comma-separated "
                                  f"list of integers >= {minimum}"
                                  + (" or 'none'" if allow_none else "")) from None
            if value < minimum:
                raise ConfigError(f"{name}: {value} < {minimum}; expected integers >= {minimum}")
        if value not in out:
            out.append(value)
    return out


def parse_mode(text: str, name: str) -> tuple[bool, ...]:
    """``"on"`` -> (True,), ``"off"`` -> (False,), ``"both"`` -> (False, True).

    Raises:
        ConfigError: any other value.
    """
    if text not in MODES:
        raise ConfigError(f"{name}={text!r}; expected one of {sorted(MODES)}")
    return MODES[text]


def expand_grid(datasets: list[tuple[str, str | None]], decoders: list[str],
                num_workers: list[int], prefetch_factors: list[int | None],
                pin_memory: tuple[bool, ...], persistent_workers: tuple[bool, ...], *,
                pin_available: bool, unavailable_decoders: dict[str, str] | None = None
                ) -> list[GridRow]:
    """Every combination, in order data > decoder > num_workers > prefetch > pin > persistent.

    Args:
        datasets: ``(path, format)`` pairs.
        decoders: decoder names.
        num_workers: worker counts (>= 0); prefetch_factors: ints >= 1 or None.
        pin_memory / persistent_workers: the values to try.
        pin_available: whether pinned memory has an effect (a CUDA device is present).
        unavailable_decoders: ``name -> reason`` for decoders that cannot run here (N/A rows).

    Returns:
        One :class:`GridRow` per requested combination; rows that do not apply are ``"n/a"``
        and point (``same_as``) at the row measuring the setting that applies, when there is one.
    """
    unavailable_decoders = unavailable_decoders or {}
    rows: list[GridRow] = []
    measured: dict[Setting, int] = {}
    for data, fmt in datasets:
        for dec in decoders:
            for nw in num_workers:
                for pf in prefetch_factors:
                    for pin in pin_memory:
                        for pers in persistent_workers:
                            asked = Setting(data, fmt, dec, nw, pf, pin, pers)
                            rows.append(_row(len(rows), asked, measured, pin_available,
                                             unavailable_decoders))
    return rows


def _row(idx: int, asked: Setting, measured: dict[Setting, int], pin_available: bool,
         unavailable: dict[str, str]) -> GridRow:
    if asked.decoder in unavailable:
        return GridRow(idx, asked, asked, "n/a", f"decoder {asked.decoder!r} cannot run here: "
                                          f"{unavailable[asked.decoder]}")
    notes = []
    applies = asked
    if asked.num_workers == 0:
        if asked.prefetch_factor is not None:
            notes.append(f"prefetch_factor={asked.prefetch_factor} does not apply with "
                         f"num_workers=0 (DataLoader rejects it)")
        if asked.persistent_workers:
            notes.append("persistent_workers=True does not apply with num_workers=0")
        applies = replace(applies, prefetch_factor=None, persistent_workers=False)
    if asked.pin_memory and not pin_available:
        notes.append("pin_memory has no effect without a CUDA device")
        applies = replace(applies, pin_memory=False)
    if applies in measured:
        return GridRow(idx, asked, applies, "n/a", "; ".join(notes) + f"; measured as row "
                       f"{measured[applies]}" if notes else f"duplicate of row {measured[applies]}",
                       same_as=measured[applies])
    if applies != asked:
        # The applicable setting has not been measured yet: this row measures it (recorded as
        # what really ran), and the note says what was dropped.
        measured[applies] = idx
        return GridRow(idx, asked, applies, "run", "; ".join(notes) + "; measured without it")
    measured[applies] = idx
    return GridRow(idx, asked, asked, "run")

"""The benchmark grid: every requested loader setting, with the ones that do not apply marked N/A.

``torch.utils.data.DataLoader`` rejects ``prefetch_factor`` and ``persistent_workers=True`` when
``num_workers == 0`` (case 20, pytorch/pytorch#68576), and ``pin_memory`` does nothing without an
accelerator. Such a grid point is not run and not crashed on: it becomes an N/A row whose
``same_as`` names the row that measured the setting that really applies (for num_workers=0: one
run without prefetch_factor and without persistent workers).

The ``backend`` dimension (``make_loader(backend="thread" | "process")``) adds two such rules:

- ``persistent_workers=True`` does not apply to the thread backend (its decoding threads live as
  long as the loader, across epochs): that row points at the thread row without it.
- With ``num_workers=0`` both backends build every batch in the calling process, the same work:
  the process row points at the thread row (when the thread backend is in the grid).

The ``cache`` dimension (``make_loader(cache="none" | "ram" | "disk:DIR" | "auto")``)
applies to every other setting; the runner fills a cached row's arena in one untimed epoch before
timing it (see :mod:`shardkit.bench.runner`).

The ``augment`` dimension (``make_loader(augment=SPEC)``, parsed by
:func:`shardkit.bench.augment.parse_augments`) applies to every other setting too, ``"none"``
first so the unaugmented twin of each augmented row is measured before it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from itertools import product

from shardkit.bench.augment import none_first
from shardkit.errors import ConfigError

__all__ = ["Setting", "GridRow", "expand_grid", "parse_int_list", "parse_mode",
           "parse_backends", "parse_caches", "BACKENDS"]

MODES = {"on": (True,), "off": (False,), "both": (False, True)}

#: ``make_loader`` backends, in the grid's (and the recommendation's cheapest-first) order.
BACKENDS = ("thread", "process")

PERSISTENT_THREAD_NOTE = ("persistent_workers does not apply to the thread backend: threads live "
                          "as long as the loader")


@dataclass(frozen=True)
class Setting:
    """One loader configuration. ``prefetch_factor`` None = not passed / not applicable.

    ``num_workers``: decoding threads (``backend="thread"``) or DataLoader worker processes
    (``backend="process"``); ``prefetch_factor``: batches in flight per thread / worker;
    ``cache``: the decoded cache (``"none"``, ``"ram"``, ``"disk:DIR"``, ``"auto"``);
    ``augment``: the augment spec's canonical text (a preset name, or an op list as JSON;
    :mod:`shardkit.bench.augment`).
    """

    data: str
    format: str | None
    decoder: str
    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    backend: str = "thread"
    cache: str = "none"
    augment: str = "none"

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


def parse_backends(text: str, name: str = "--backend") -> list[str]:
    """``"process,thread"`` -> ``["thread", "process"]``: the named backends, duplicates dropped,
    in :data:`BACKENDS` order (thread first, so a process row can point at its thread twin).

    Raises:
        ConfigError: an item is not one of :data:`BACKENDS` (names the option and the item).
    """
    items = [s.strip() for s in str(text).split(",")]
    for item in items:
        if item not in BACKENDS:
            raise ConfigError(f"{name}: {item!r} is not a backend; expected a comma-separated "
                              f"list of {', '.join(BACKENDS)}")
    return [b for b in BACKENDS if b in items]


def parse_caches(text: str, name: str = "--cache") -> list[str]:
    """``"ram,none"`` -> ``["none", "ram"]``: the named decoded-cache modes, duplicates dropped,
    ``"none"`` first (the uncached twin is measured before the cached rows), then as given.
    Each item is ``none``, ``ram``, ``auto`` or ``disk:DIR`` (DIR must not contain a comma).

    Raises:
        ConfigError: an item is not a cache mode (names the option and the item).
    """
    from shardkit.stream.cache import parse_cache

    items = [s.strip() for s in str(text).split(",")]
    for item in items:
        try:
            parse_cache(item)
        except ConfigError:
            raise ConfigError(f"{name}: {item!r} is not a cache mode; expected a comma-separated "
                              f"list of none, ram, auto, disk:DIR") from None
    items = list(dict.fromkeys(items))
    return (["none"] if "none" in items else []) + [c for c in items if c != "none"]


def expand_grid(datasets: list[tuple[str, str | None]], decoders: list[str],
                num_workers: list[int], prefetch_factors: list[int | None],
                pin_memory: tuple[bool, ...], persistent_workers: tuple[bool, ...], *,
                pin_available: bool, unavailable_decoders: dict[str, str] | None = None,
                backends: tuple[str, ...] | list[str] = ("thread",),
                caches: tuple[str, ...] | list[str] = ("none",),
                augments: tuple[str, ...] | list[str] = ("none",)) -> list[GridRow]:
    """Every combination, in order data > decoder > backend > cache > augment > num_workers >
    prefetch > pin > persistent.

    Args:
        datasets: ``(path, format)`` pairs.
        decoders: decoder names.
        num_workers: worker counts (>= 0: threads or processes, see ``backends``);
            prefetch_factors: batches in flight per worker, ints >= 1 or None (not passed).
        pin_memory / persistent_workers: the values to try.
        pin_available: whether pinned memory has an effect (a CUDA device is present).
        unavailable_decoders: ``name -> reason`` for decoders that cannot run here (N/A rows).
        backends: ``make_loader`` backends to try, from :data:`BACKENDS`; always expanded thread
            first whatever the order given.
        caches: decoded-cache modes to try (:func:`parse_caches` forms), ``"none"`` first.
        augments: canonical augment specs
            (:func:`shardkit.bench.augment.parse_augments`), expanded ``"none"`` first.

    Returns:
        One :class:`GridRow` per requested combination; rows that do not apply are ``"n/a"``
        and point (``same_as``) at the row measuring the setting that applies, when there is one:
        num_workers=0 with prefetch or persistent workers, pin_memory without CUDA,
        persistent_workers with the thread backend, and the process backend with num_workers=0
        (the thread row does the same work) when the thread backend is in the grid.

    Raises:
        ConfigError: an unknown backend.
    """
    unavailable_decoders = unavailable_decoders or {}
    backends = parse_backends(",".join(backends), "backends")
    caches = parse_caches(",".join(caches), "caches")
    augments = none_first(augments)
    rows: list[GridRow] = []
    measured: dict[Setting, int] = {}
    for data, fmt in datasets:
        for dec in decoders:
            for be in backends:
                for cache, aug in product(caches, augments):
                    for nw, pf, pin, pers in product(num_workers, prefetch_factors, pin_memory,
                                                     persistent_workers):
                        asked = Setting(data, fmt, dec, nw, pf, pin, pers, be, cache, aug)
                        rows.append(_row(len(rows), asked, measured, pin_available,
                                         unavailable_decoders, "thread" in backends))
    return rows


def _row(idx: int, asked: Setting, measured: dict[Setting, int], pin_available: bool,
         unavailable: dict[str, str], thread_in_grid: bool = False) -> GridRow:
    if asked.decoder in unavailable:
        return GridRow(idx, asked, asked, "n/a", f"decoder {asked.decoder!r} cannot run here: "
                                          f"{unavailable[asked.decoder]}")
    notes = []
    applies = asked
    if asked.num_workers == 0:
        if asked.prefetch_factor is not None:
            why = "DataLoader rejects it" if asked.backend == "process" else \
                "batches are built in the caller"
            notes.append(f"prefetch_factor={asked.prefetch_factor} does not apply with "
                         f"num_workers=0 ({why})")
        if asked.persistent_workers:
            notes.append("persistent_workers=True does not apply with num_workers=0")
        applies = replace(applies, prefetch_factor=None, persistent_workers=False)
        if asked.backend == "process" and thread_in_grid:
            notes.append("with num_workers=0 the process and thread backends are the same work "
                         "(every batch built in the calling process)")
            applies = replace(applies, backend="thread")
    elif asked.backend == "thread" and asked.persistent_workers:
        notes.append(PERSISTENT_THREAD_NOTE)
        applies = replace(applies, persistent_workers=False)
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

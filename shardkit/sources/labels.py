"""Class names, aliases and label indices.

A :class:`LabelMap` holds the ordered class list (label ``i`` is ``classes[i]``) and aliases
(other spellings that mean a class). It is built either from the class names found in the source
(``LabelMap(names)``, the order of :func:`shardkit.sources.layouts.class_order`, as
:func:`shardkit.packer.scan.resolve_labels` does) or from a YAML file
(:meth:`LabelMap.from_yaml`), in one of two shapes::

    classes: [daisy, dandelion, roses, sunflowers, tulips]     # order = label index
    aliases: {Sunflower: sunflowers, "向日葵": sunflowers}      # optional

    classes:                                                   # class -> its aliases
      daisy: []
      sunflowers: [Sunflower, 向日葵]

Every name is normalised with :func:`normalize_label` (Unicode NFC, surrounding whitespace
stripped), so ``"roses "`` and an NFD-spelled ``"Café"`` match. :meth:`LabelMap.resolve` tries,
in order: exact class, exact alias, then a case-insensitive (``str.casefold``) match on classes,
then on aliases; a case-insensitive match that could mean two classes is not guessed. Unknown
names raise :class:`~shardkit.errors.UnknownLabelError` listing *all* unknown names at once, each
with the closest known classes (``difflib.get_close_matches``, cutoff 0.6).
"""
from __future__ import annotations

import difflib
import os
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping

import yaml

from shardkit.errors import LabelError, UnknownLabelError
from shardkit.validate import is_int

__all__ = ["normalize_label", "LabelMap"]

_CLOSE_CUTOFF = 0.6
_CLOSE_COUNT = 3
_LISTED = 20  # names an error lists at most (a label map may hold 100,000 classes)
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser with PyYAML's safe constructor (the same documents and tags as
``yaml.safe_load``, ~20x faster: a 100,000-class map loads in about a second); the pure-Python
``SafeLoader`` where PyYAML was built without libyaml."""


def normalize_label(s: str) -> str:
    """Unicode NFC form of ``s`` with surrounding whitespace stripped.

    Raises:
        LabelError: ``s`` is not a str.
    """
    if not isinstance(s, str):
        raise LabelError(f"a label must be a string, got {s!r} ({type(s).__name__})")
    return unicodedata.normalize("NFC", s).strip()


def _name(value: object, where: str) -> str:
    """A class or alias name from YAML: a string, or an int (folder names like ``0``..``9``)."""
    if isinstance(value, str):
        return value
    if is_int(value):
        return str(value)
    raise LabelError(f"label map {where!r}: name {value!r} ({type(value).__name__}) is not a "
                     f"string; quote it in the YAML (yes/no/on/off/null and decimals are not "
                     f"read as text)")


class LabelMap:
    """Ordered classes plus aliases.

    Args:
        classes: class names; label ``i`` is ``classes[i]`` (after normalisation).
        aliases: alias -> class name (both normalised). An alias equal to its own class is
            accepted and dropped.

    Raises:
        LabelError: no classes, an empty or non-string name, duplicate classes (after
            normalisation), an alias to an unknown class, an alias that is another class's name.
    """

    def __init__(self, classes: Iterable[str], aliases: Mapping[str, str] | None = None):
        names = [normalize_label(c) for c in classes]
        if not names:
            raise LabelError("a label map needs at least one class, got none")
        if any(not n for n in names):
            raise LabelError(f"class names must not be empty, got {list(classes)!r}")
        dups = sorted(n for n, k in Counter(names).items() if k > 1)  # linear: 100k classes
        if dups:
            shown = dups[:_LISTED] + (["..."] if len(dups) > _LISTED else [])
            raise LabelError(f"duplicate class name(s) {shown} (after Unicode NFC + strip): "
                             f"{len(dups)} name(s) given more than once among {len(names)} "
                             "classes")
        self.classes: list[str] = names
        self._index = {n: i for i, n in enumerate(names)}
        self.aliases: dict[str, str] = {}
        unknown, clashing = [], []
        for alias, target in (aliases or {}).items():
            a, t = normalize_label(alias), normalize_label(target)
            if not a:
                raise LabelError(f"empty alias for class {target!r}")
            if t not in self._index:
                unknown.append(f"{alias!r} -> {target!r}")
            elif a in self._index and a != t:
                clashing.append(f"{alias!r} -> {target!r}")
            elif a != t:
                self.aliases[a] = t
        if unknown:
            raise LabelError(f"alias(es) to unknown classes: {', '.join(unknown)}; known "
                             f"classes: {names}")
        if clashing:
            raise LabelError(f"alias(es) equal to another class's name: {', '.join(clashing)}")
        self._fold_class = self._fold({n: n for n in names})
        self._fold_alias = self._fold(self.aliases)

    @staticmethod
    def _fold(table: Mapping[str, str]) -> dict[str, str | None]:
        """casefold(name) -> class, or None when two classes share the folded spelling."""
        out: dict[str, str | None] = {}
        for name, target in table.items():
            key = name.casefold()
            out[key] = target if out.get(key, target) == target else None
        return out

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> LabelMap:
        """Load ``classes`` (list, or mapping class -> aliases) and optional ``aliases``.

        Raises:
            LabelError: unreadable file, not UTF-8, invalid YAML, wrong structure, or an invalid
                map (see the class doc); the message names the file.
        """
        where = os.fspath(path)
        try:
            with open(where, encoding="utf-8") as f:
                doc = yaml.load(f, Loader=_SAFE_LOADER)
        except OSError as e:
            raise LabelError(f"cannot read label map {where!r}: {e}") from e
        except UnicodeDecodeError as e:
            bad = e.object[e.start]
            raise LabelError(f"label map {where!r} is not UTF-8 text (byte 0x{bad:02x} at offset "
                             f"{e.start}); save it as UTF-8") from None
        except yaml.YAMLError as e:
            raise LabelError(f"label map {where!r} is not valid YAML: {e}") from e
        if not isinstance(doc, dict) or "classes" not in doc:
            raise LabelError(f"label map {where!r} must be a mapping with a 'classes' key, got "
                             f"{type(doc).__name__}: {doc!r:.200}")
        extra = sorted(set(doc) - {"classes", "aliases"})
        if extra:
            raise LabelError(f"label map {where!r} has unknown key(s) {extra}; allowed: "
                             f"classes, aliases")
        raw_classes, raw_aliases = doc["classes"], doc.get("aliases") or {}
        if not isinstance(raw_aliases, dict):
            raise LabelError(f"label map {where!r}: 'aliases' must be a mapping alias -> class, "
                             f"got {raw_aliases!r:.200}")
        aliases = [(_name(a, where), _name(t, where)) for a, t in raw_aliases.items()]
        if isinstance(raw_classes, dict):
            classes = [_name(c, where) for c in raw_classes]
            for c, al in raw_classes.items():
                al = [] if al is None else [al] if isinstance(al, str) else al
                if not isinstance(al, list):
                    raise LabelError(f"label map {where!r}: aliases of class {c!r} must be a "
                                     f"list of names, got {al!r:.200}")
                aliases += [(_name(a, where), _name(c, where)) for a in al]
        elif isinstance(raw_classes, list):
            classes = [_name(c, where) for c in raw_classes]
        else:
            raise LabelError(f"label map {where!r}: 'classes' must be a list or a mapping, got "
                             f"{raw_classes!r:.200}")
        merged: dict[str, str] = {}
        conflicts = []
        for a, t in aliases:
            key = normalize_label(a)
            if key in merged and merged[key] != normalize_label(t):
                conflicts.append(f"{a!r} -> {merged[key]!r} and {t!r}")
            merged[key] = normalize_label(t)
        if conflicts:
            raise LabelError(f"label map {where!r}: alias(es) given to two classes: "
                             f"{'; '.join(conflicts)}")
        try:
            return cls(classes, merged)
        except LabelError as e:
            raise LabelError(f"label map {where!r}: {e}") from e

    def __len__(self) -> int:
        return len(self.classes)

    @property
    def num_classes(self) -> int:
        """Number of classes (labels are 0 .. num_classes - 1)."""
        return len(self.classes)

    def _lookup(self, name: str) -> int | None:
        n = normalize_label(name)
        if n in self._index:
            return self._index[n]
        if n in self.aliases:
            return self._index[self.aliases[n]]
        for table in (self._fold_class, self._fold_alias):
            target = table.get(n.casefold())
            if target is not None:
                return self._index[target]
        return None

    def closest(self, name: str) -> list[str]:
        """Up to 3 class names closest to ``name`` (via their names and aliases, caseless)."""
        spelled: dict[str, list[str]] = {}
        for spelling, target in [(c, c) for c in self.classes] + list(self.aliases.items()):
            spelled.setdefault(spelling.casefold(), []).append(target)
        hits = difflib.get_close_matches(normalize_label(name).casefold(), list(spelled),
                                         n=len(spelled), cutoff=_CLOSE_CUTOFF)
        return list(dict.fromkeys(c for h in hits for c in spelled[h]))[:_CLOSE_COUNT]

    def resolve(self, name: str) -> int:
        """Label index (0 .. num_classes - 1) of ``name``.

        Raises:
            UnknownLabelError: ``name`` matches no class or alias (lists the closest classes).
        """
        return self.resolve_all([name])[name]

    def resolve_all(self, names: Iterable[str]) -> dict[str, int]:
        """Map every given name (as given, duplicates collapsed) to its label index.

        Raises:
            UnknownLabelError: one or more names match nothing; all of them are listed, each
                with its closest known classes.
        """
        out: dict[str, int] = {}
        unknown: dict[str, list[str]] = {}
        for name in names:
            if name in out or name in unknown:
                continue
            idx = self._lookup(name)
            if idx is None:
                unknown[name] = self.closest(name)
            else:
                out[name] = idx
        if unknown:
            raise UnknownLabelError(unknown=unknown, known=list(self.classes))
        return out

    def to_dict(self) -> dict:
        """``{"classes": [...], "aliases": {...}}`` as stored in manifest.json."""
        return {"classes": list(self.classes), "aliases": dict(self.aliases)}

    def __repr__(self) -> str:
        return f"LabelMap(classes={self.classes!r}, aliases={self.aliases!r})"

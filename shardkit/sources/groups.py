"""Group rules by regex: which group (photographer, video, patient) a file belongs to, from its
relative path."""
from __future__ import annotations

import dataclasses
import re

from shardkit.errors import ConfigError, SourceError
from shardkit.sources.items import SourceItem, listing

def compile_group_regex(regex: str) -> tuple[re.Pattern, int | str]:
    """Compiles a group regex; returns ``(pattern, which)``, ``which`` being the capture group
    that holds the group value: ``"group"`` if the pattern names one, else ``1``.

    Raises:
        ConfigError: the pattern does not compile or has no capture group.
    """
    try:
        pattern = re.compile(regex)
    except (re.error, TypeError) as e:
        raise ConfigError(f"group regex {regex!r} does not compile: {e}") from e
    if "group" in pattern.groupindex:
        return pattern, "group"
    if pattern.groups >= 1:
        return pattern, 1
    raise ConfigError(f"group regex {regex!r} has no capture group; expected a named group "
                      f"(?P<group>...) or a first group (...)")


def match_group_regex(items: list[SourceItem], regex: str
                      ) -> tuple[list[SourceItem], list[SourceItem]]:
    """Sets each item's group from ``re.search(regex, relpath)``: the named group ``group`` if the
    pattern has one, else the first capture group; e.g. ``r"/(?P<group>[^/_]+)_\\d+\\.jpg$"``
    groups ``a/subjA_0001.jpg`` as "subjA".

    Returns:
        ``(grouped, unmatched)``: new items (input order) with ``group`` set, and the items the
        pattern gives no group (no match, or an empty group). An unmatched item is not an error
        here: the packer first checks whether it is an image at all, then raises
        :func:`unmatched_regex_error` for the images among them.

    Raises:
        ConfigError: the pattern does not compile or has no capture group.
    """
    pattern, which = compile_group_regex(regex)
    out, unmatched = [], []
    for item in items:
        m = pattern.search(item.relpath)
        value = m.group(which) if m else None
        if not value:
            unmatched.append(item)
            continue
        out.append(dataclasses.replace(item, group=value))
    return out, unmatched


def unmatched_regex_error(regex: str, relpaths: list[str]) -> SourceError:
    """The error for relpaths that ``regex`` gives no group (first 20 listed, with the count)."""
    return SourceError(f"group regex {regex!r} gives no group for {listing(relpaths)} path(s)")

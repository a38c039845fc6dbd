"""The one integer check of shardkit: every integer option and config field goes through it.

An integer is a Python ``int`` or a numpy integer scalar (``np.int64``, ``np.int32``,
``np.uint8``...: every type registered as :class:`numbers.Integral`). ``bool`` and ``np.bool_``
are refused (``True`` is not a count), and so are floats, even ``2.0``, strings and None (unless
the option is optional). Accepted values come back as Python ``int``, so a numpy integer never
reaches a JSON file or a frozen config.
"""
from __future__ import annotations

import numbers

from shardkit.errors import ConfigError

__all__ = ["is_int", "check_int"]


def is_int(value) -> bool:
    """True for a Python int or a numpy integer scalar; False for bool, ``np.bool_``, floats
    (also integral ones such as ``2.0``), strings and None."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None, *,
              optional: bool = False, message: str | None = None) -> int | None:
    """``value`` as a Python int, checked to be an integer (:func:`is_int`) in
    ``[minimum, maximum]`` (a bound of None is open; Python ints have no size limit).

    Args:
        name: the option's name, shown in the error. optional: None is allowed (returned as
            None). message: the error text to raise instead of the default, as a
            :meth:`str.format` template with ``{name}``, ``{value!r}``, ``{minimum}`` and
            ``{maximum}`` (for options whose message is documented in other words).

    Raises:
        ConfigError: default message ``"{name}={value!r}: expected an int >= {minimum}"``
            (``an int in [minimum, maximum]``, ``an int <= maximum`` or ``an int`` for the other
            bounds; ``None or an int ...`` when optional).
    """
    if value is None and optional:
        return None
    if is_int(value) and (minimum is None or value >= minimum) \
            and (maximum is None or value <= maximum):
        return int(value)
    if message is None:
        if minimum is not None and maximum is not None:
            expected = f"an int in [{minimum}, {maximum}]"
        elif minimum is not None:
            expected = f"an int >= {minimum}"
        elif maximum is not None:
            expected = f"an int <= {maximum}"
        else:
            expected = "an int"
        message = "{name}={value!r}: expected " + ("None or " if optional else "") + expected
    raise ConfigError(message.format(name=name, value=value, minimum=minimum, maximum=maximum))

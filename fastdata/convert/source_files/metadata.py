"""What a sample's metadata may hold, the same for every source kind (file lists, Hugging Face datasets,
WebDataset shards): JSON scalars (text, numbers, booleans, null) and lists of them (nested lists too), kept as
lists. A source's NaN and infinities become null (JSON has neither), dates and times ISO text, decimals floats,
tuples and numpy arrays lists; anything else (objects, bytes) is `NOT_JSON`, which the converter refuses or
leaves out, saying which."""

from __future__ import annotations

import math
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

NOT_JSON = object()  # what `json_value` returns for a value metadata cannot hold


def json_value(value: Any) -> Any:
    """`value` as metadata keeps it (see the module's docstring), or NOT_JSON."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if type(value).__module__ == "numpy":
        value = value.tolist()  # a numpy scalar or array: Python's own values
        if not isinstance(value, list):
            return json_value(value)
    if isinstance(value, (list, tuple)):
        items = [json_value(item) for item in value]
        return NOT_JSON if any(item is NOT_JSON for item in items) else items
    return NOT_JSON

"""A what-if spec as the user writes it, ``"window=256,sinks=4"``, read and checked without torch
(the command line checks ``--what-if`` before the model code loads); :mod:`.whatif` builds its mask."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WhatIfSpec", "read_what_if"]


@dataclass(frozen=True)
class WhatIfSpec:
    """Each query sees the last ``window`` tokens (itself included) and the first ``sinks``."""

    window: int
    sinks: int = 0

    @property
    def name(self) -> str:
        """How reports name it: ``window 256 + 4 sinks``."""
        return f"window {self.window}" + (f" + {self.sinks} sinks" if self.sinks else "")


def read_what_if(spec: str) -> WhatIfSpec:
    """``"window=256,sinks=4"`` -> WhatIfSpec(256, 4); ValueError with the expected form otherwise."""
    parts: dict[str, int] = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in ("window", "sinks") or not value.strip().isdigit():
            raise ValueError(f"a what-if spec looks like 'window=256,sinks=4' (window required, sinks optional); "
                             f"got {spec!r}")
        parts[key] = int(value)
    if "window" not in parts or parts["window"] < 1:
        raise ValueError(f"a what-if spec needs window=W with W >= 1; got {spec!r}")
    return WhatIfSpec(parts["window"], parts.get("sinks", 0))

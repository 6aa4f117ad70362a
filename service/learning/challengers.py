"""The challengers' spec (``--challengers averaged,pocket,margin:0.5``) read into ``(name, variant, margin)``.

One parser for the setting's check at start-up (:mod:`perceptron_stream.config`: a bad spec is a bad setting,
exit 2) and for the models that run the challengers (:class:`perceptron_stream.pipeline.models.ModelSet`): here,
on the ground floor, so that the settings import no pipeline module.

>>> parse_challengers("averaged, margin:0.5")
[('averaged', 'averaged', 0.0), ('margin:0.5', 'margin', 0.5)]
"""

from __future__ import annotations

import math

from perceptron_stream.learning.perceptron import VARIANTS


def parse_challengers(text: str) -> list[tuple[str, str, float]]:
    """``averaged,pocket,margin:0.5`` → [(name, variant, margin)]; ValueError naming what is wrong."""
    out, names = [], set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        variant, _, margin = part.partition(":")
        if variant not in VARIANTS:
            raise ValueError(f"challenger {part!r}: the variant must be one of {', '.join(VARIANTS)}")
        if variant == "margin":
            try:
                gamma = float(margin) if margin else 0.0
            except ValueError:
                raise ValueError(f"challenger {part!r}: the margin must be a number, as in margin:0.5") from None
            if not math.isfinite(gamma) or gamma < 0:
                raise ValueError(f"challenger {part!r}: the margin must be a finite number >= 0")
            name = f"margin:{margin}" if margin else "margin"
        elif margin:
            raise ValueError(f"challenger {part!r}: only the margin variant takes a parameter")
        else:
            name, gamma = variant, 0.0
        if name in names:
            raise ValueError(f"challenger {name} is named twice")
        names.add(name)
        out.append((name, variant, gamma))
    return out

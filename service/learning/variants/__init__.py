"""The perceptron's variants, one small class each: what the variant keeps beside the running weights, its fast path
for dense lists, and its batch form beside it.

:class:`~perceptron_stream.learning.Perceptron` holds what they share (the features, the counters, the state, the
one shared step every other event takes); ``Perceptron(variant)`` makes the class of :data:`CLASSES` the variant
names, so the choice is made once, at construction, and no event pays a dispatch.
"""

from __future__ import annotations

from perceptron_stream.learning.variants.averaged import Averaged
from perceptron_stream.learning.variants.plain import Plain
from perceptron_stream.learning.variants.pocket import Pocket

#: variant name -> its class (margin is plain with a threshold: ``margin=γ``)
CLASSES = {"plain": Plain, "margin": Plain, "averaged": Averaged, "pocket": Pocket}

__all__ = ["CLASSES", "Averaged", "Plain", "Pocket"]

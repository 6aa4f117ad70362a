"""A perceptron's state: what :meth:`~perceptron_stream.learning.Perceptron.to_state` writes and
:meth:`~perceptron_stream.learning.Perceptron.from_state` reads back, the whole model as plain JSON types.

One format for every variant (``format`` 1): the shared part here (features, running weights, bias, R, counters,
what ``predict_one`` answers in), and what a variant keeps beside the running weights under the variant's own key
(``"averaged"``, ``"pocket"``), which the variant's class writes and reads (``_save_kept``, ``_read_kept``). Every
number read back goes through :class:`~perceptron_stream.learning.state.Reader`: a damaged or forged state is a
:class:`~perceptron_stream.learning.state.StateError`, never a model.
"""

from __future__ import annotations

from typing import Any

from perceptron_stream.learning.state import MAX_STATE_MAGNITUDE, Reader, StateError, is_state_number

STATE_KIND = "perceptron"
STATE_FORMAT = 1

# The names state["labels"] takes: what predict_one answers in.
_SIGNED, _BOOL = "-1/+1", "bool"


class Saved:
    """The state methods of :class:`~perceptron_stream.learning.Perceptron` (a mixin: it reads the model's fields)."""

    # the Perceptron's fields, as this mixin reads and writes them
    features: list
    variant: str
    margin: float
    max_features: int | None
    _w: list[float]
    _b: float
    _xmax: float
    _bool_labels: bool
    seen: int
    _unlabeled: int
    mistakes: int
    updates: int
    dropped_features: int

    @classmethod
    def from_weights(
        cls: Any,  # the Perceptron (Perceptron(variant) makes the variant's class)
        weights: dict | list,
        bias: float = 0.0,
        variant: str = "plain",
        margin: float = 0.0,
        max_features: int | None = None,
    ) -> Any:
        """A perceptron that starts from the given weights instead of 0 (seed 002's θ, θ0).

        >>> from perceptron_stream.learning import Perceptron
        >>> p = Perceptron.from_weights([1.0, -1.0], bias=1.0)
        >>> p.step([1.0, 3.0], 1), p.weights, p.bias
        ((-1, -1.0, True), {0: 2.0, 1: 2.0}, 2.0)
        """
        p = cls(variant, margin, max_features)
        items = enumerate(weights) if isinstance(weights, list) else weights.items()
        values = list(weights) if isinstance(weights, list) else list(weights.values())
        if not all(map(is_state_number, values)) or not is_state_number(bias):
            raise StateError(
                f"weights and bias must be finite numbers of magnitude at most {MAX_STATE_MAGNITUDE:g}", "non_finite"
            )
        for k, v in items:
            i = p._add_feature(k)
            p._w[i] = float(v)
        p._b = float(bias)
        p._started()
        return p

    def _started(self) -> None:
        """The running weights were given (:meth:`from_weights`): what the variant keeps starts from them."""

    def to_state(self) -> dict:
        """Everything the model holds, as plain JSON types (floats round trip exactly).

        ``labels`` ("-1/+1" or "bool") is what :meth:`predict_one` answers in;
        :meth:`from_state` reads a state without it (written before it existed)
        as "-1/+1", so the format number did not change.  Likewise
        ``max_features`` (absent: None, no cap) and the ``dropped_features``
        counter (absent: 0).
        """
        for k in self.features:
            if type(k) not in (str, int):
                raise ValueError(f"cannot checkpoint feature name {k!r}: names must be str or int")
        state: dict[str, Any] = {
            "kind": STATE_KIND,
            "format": STATE_FORMAT,
            "variant": self.variant,
            "margin": self.margin,
            "max_features": self.max_features,
            "features": list(self.features),
            "weights": list(self._w),
            "bias": self._b,
            "max_norm": self._xmax,
            "labels": _BOOL if self._bool_labels else _SIGNED,  # what predict_one answers in
            "counters": {
                "seen": self.seen,
                "labeled": self.seen - self._unlabeled,
                "mistakes": self.mistakes,
                "updates": self.updates,
                "dropped_features": self.dropped_features,
            },
        }
        self._save_kept(state)
        return state

    def _save_kept(self, state: dict) -> None:
        """Add what the variant keeps to ``state`` (under the variant's own key)."""

    def _read_kept(self, st: Reader, n: int) -> None:
        """Read back what :meth:`_save_kept` wrote (``n`` features)."""

    @classmethod
    def from_state(cls: Any, state: dict) -> Any:
        """Rebuild exactly what :meth:`to_state` saved; ValueError on a wrong or corrupt state.

        >>> from perceptron_stream.learning import Perceptron
        >>> Perceptron.from_state({"kind": "perceptron", "format": 99})
        Traceback (most recent call last):
        ...
        perceptron_stream.learning.state.StateError: invalid perceptron state: format 99 is not supported (this version reads format 1)
        """
        st = Reader("perceptron state", state)
        st.header(STATE_KIND, STATE_FORMAT)
        variant, margin = st.get("variant"), st.get("margin")
        try:  # max_features: absent from the states written before it existed (no cap then)
            p = cls(variant, margin, st.state.get("max_features"))
        except ValueError as exc:
            st.fail(str(exc))
        keys = st.get("features")
        if not isinstance(keys, list) or any(type(k) not in (str, int) for k in keys):
            st.fail("features must be a list of str or int names")
        if len(set(keys)) != len(keys):
            st.fail("features has duplicate names")
        for k in keys:
            p._add_feature(k)
        n = len(keys)
        p._w, p._b, p._xmax = st.floats("weights", n), st.float("bias"), st.float("max_norm")
        counters = Reader("perceptron state counters", st.get("counters"))
        p.seen, labeled, p.mistakes, p.updates = (counters.count(c) for c in ("seen", "labeled", "mistakes", "updates"))
        if labeled > p.seen or p.mistakes > labeled:
            counters.fail("need mistakes <= labeled <= seen", "implausible")
        p._unlabeled = p.seen - labeled
        if "dropped_features" in counters.state:  # absent from the states written before it existed
            p.dropped_features = counters.count("dropped_features")
        labels = st.state.get("labels", _SIGNED)  # absent from the states written before it existed
        if labels not in (_SIGNED, _BOOL):
            st.fail(f"labels must be {_SIGNED!r} or {_BOOL!r}, got {labels!r}")
        p._bool_labels = labels == _BOOL
        p._read_kept(st, n)
        return p

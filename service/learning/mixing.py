"""Iterative parameter mixing: replicas that learn apart and share what they learned.

McDonald, Hall & Mann (NAACL 2010), "Distributed Training Strategies for the
Structured Perceptron", Figure 3: S shards each run the perceptron from the
same weights w; then w ← Σ_i μ_i·w_i, and the next round starts from there.
Their Theorem 3, for data separable with margin γ and radius R, and any
mixing weights μ_{i,n} ≥ 0 with Σ_i μ_{i,n} = 1:

    Σ_n Σ_i μ_{i,n} · k_{i,n}  ≤  (R/γ)²

where k_{i,n} is shard i's mistakes in round n. (The proof: each shard's
weights gain at least k·γ along the separator u and at most k·R² in squared
norm; a convex mix keeps the first by linearity and the second by Jensen.)
With error-weighted mixing, μ_{i,n} = k_{i,n} / Σ_j k_{j,n} (uniform when
nobody erred), shards that erred more count more, as the paper recommends.
Here R and γ are those of x' = (1, x): the bias is a weight.

This module is the merge (:func:`mix_states`: by feature name, so replicas
that met features in different orders mix correctly), the mixing weights
(:func:`mixing_weights`) and a synchronous simulation of S shards
(:func:`simulate`) that the property tests and ``bench/mixing.py`` run. The
service mixes asynchronously (each replica with the latest state every other
one published), where the theorem is not proven; README "Guarantees" says so.

What a mix means per model (the merge is defined for each one the service
allows in partition scope):

- plain and margin: w and b are mixed;
- averaged: the learning weights w are mixed, and so are the averaged
  (predicting) weights a = w − u/c; the replica keeps its own c and takes
  u = c·(w − a), so it predicts with the mixed average;
- pocket: refused (:data:`MIXABLE`): the pocket is the weights with the
  longest run of correct predictions on one replica's stream, and a mix of
  pockets has no run to keep;
- the StandardScaler in front (``--standardize``): the moments are pooled,
  weighted by each replica's count, and each replica keeps its own count, so
  repeated mixes never count an event twice.

>>> a = {"kind": "perceptron", "format": 1, "variant": "plain", "margin": 0.0, "features": ["x", "y"],
...      "weights": [2.0, 0.0], "bias": 1.0, "max_norm": 1.0, "counters": {"seen": 3, "labeled": 3, "mistakes": 1, "updates": 1}}
>>> b = dict(a, features=["y", "z"], weights=[4.0, 8.0], bias=-1.0)
>>> m = mix_states(a, [a, b], [0.5, 0.5])
>>> list(zip(m["features"], m["weights"])), m["bias"], m["counters"] == a["counters"]
([('x', 1.0), ('y', 2.0), ('z', 4.0)], 0.0, True)
>>> mixing_weights([0, 3, 1]), mixing_weights([0, 0])
([0.0, 0.75, 0.25], [0.5, 0.5])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from perceptron_stream.learning.factory import learner_from_state
from perceptron_stream.learning.perceptron import Perceptron

#: The variants whose state has a defined mix.
MIXABLE = ("plain", "margin", "averaged")


def mixing_weights(mistakes: Sequence[int]) -> list[float]:
    """Error-weighted μ: each state's share of the mistakes; uniform when there were none."""
    total = sum(mistakes)
    if total <= 0:
        return [1.0 / len(mistakes)] * len(mistakes)
    return [k / total for k in mistakes]


def _perceptron_part(state: dict) -> dict:
    """The perceptron's state inside a learner's (hashed → its model; scaled → its perceptron)."""
    if state.get("kind") == "hashed-perceptron":
        return _perceptron_part(state["model"])
    return state["perceptron"] if state.get("kind") == "scaled-perceptron" else state


def _named(p: dict, key: str) -> dict:
    return dict(zip(p["features"], p[key]))


def mix_states(own: dict, states: Sequence[dict], mu: Sequence[float]) -> dict:
    """``own`` (a learner's ``to_state()``) with its weights replaced by Σ μ_i·(weights of ``states[i]``).

    Matched by feature name; a feature a state lacks weighs 0 there. The
    result keeps ``own``'s counters, radius and labels: what the replica has
    seen is its own. The features come in ``own``'s order, then new ones in
    the order the states list them, up to ``own``'s ``max_features`` (the
    others' features beyond it are left out, as a labeled event's would be).
    ValueError for a variant with no mix.
    """
    if len(states) != len(mu) or not states:
        raise ValueError("one mixing weight per state, and at least one state")
    mine = _perceptron_part(own)
    variant = mine["variant"]
    if variant not in MIXABLE:
        raise ValueError(f"variant {variant} has no mix (mixable: {', '.join(MIXABLE)})")
    parts = [_perceptron_part(s) for s in states]
    for p in parts:
        if p["variant"] != variant or p.get("margin") != mine.get("margin"):
            raise ValueError(f"cannot mix a {p['variant']} perceptron into a {variant} one")
    order = dict.fromkeys(mine["features"])
    for p in parts:
        order.update(dict.fromkeys(p["features"]))
    names = list(order)
    cap = mine.get("max_features")
    if cap is not None and len(names) > cap:  # the replica's own features first, then the others' up to its cap
        names = names[: max(cap, len(mine["features"]))]

    def mixed(extract) -> tuple[list[float], float]:
        """Σ μ_i·(weights, bias) of every state, the weights as ``extract(state)`` names them."""
        total, bias = dict.fromkeys(names, 0.0), 0.0
        for p, m in zip(parts, mu):
            weights, b = extract(p)
            for name, v in weights.items():
                if name in total:  # not a feature beyond the cap
                    total[name] += m * v
            bias += m * b
        return [total[n] for n in names], bias

    out = dict(mine, features=names)
    out["weights"], out["bias"] = mixed(lambda p: (_named(p, "weights"), p["bias"]))
    if variant == "averaged":

        def average(p: dict) -> tuple[dict, float]:
            """The averaged (predicting) weights a = w − u/c of a state."""
            c, w, u = p["averaged"]["c"], _named(p, "weights"), dict(zip(p["features"], p["averaged"]["sum"]))
            return {n: w[n] - u[n] / c for n in w}, p["bias"] - p["averaged"]["bias_sum"] / c

        a, ab = mixed(average)
        c = mine["averaged"]["c"]
        out["averaged"] = {
            "sum": [c * (w - ai) for w, ai in zip(out["weights"], a)],
            "bias_sum": c * (out["bias"] - ab),
            "c": c,
        }
    return _rewrap(own, states, out)


def _rewrap(own: dict, states: Sequence[dict], mixed: dict) -> dict:
    """``own``'s learner state with ``mixed`` as its perceptron (a scaler's moments pooled on the way)."""
    kind = own.get("kind")
    if kind == "hashed-perceptron":
        return dict(own, model=_rewrap(own["model"], [s["model"] for s in states], mixed))
    if kind == "scaled-perceptron":
        scaler = _pooled_scaler(own["scaler"], [s["scaler"] for s in states])
        kept = set(mixed["features"])  # the scaler holds the features the perceptron holds (the cap)
        scaler = {**scaler, **{k: [e for e in scaler[k] if e[0] in kept] for k in ("counts", "means", "vars")}}
        return dict(own, perceptron=mixed, scaler=scaler)
    return mixed


def _pooled_scaler(own: dict, scalers: Sequence[dict]) -> dict:
    """The moments of every scaler pooled by count (law of total variance); ``own``'s counts kept."""
    pooled: dict[Any, list[float]] = {}  # name -> [n, Σ n·mean, Σ n·(var + mean²)]
    for sc in scalers:
        counts, means, variances = (dict((k, v) for k, v in sc[key]) for key in ("counts", "means", "vars"))
        for name, n in counts.items():
            if n > 0:
                acc = pooled.setdefault(name, [0.0, 0.0, 0.0])
                acc[0] += n
                acc[1] += n * means[name]
                acc[2] += n * (variances[name] + means[name] ** 2)
    means_out, vars_out = {}, {}
    for name, (n, s1, s2) in pooled.items():
        mean = s1 / n
        means_out[name], vars_out[name] = mean, max(0.0, s2 / n - mean * mean)
    own_counts = dict((k, v) for k, v in own["counts"])
    names = list(dict.fromkeys([k for k, _ in own["counts"]] + list(pooled)))
    return dict(
        own,
        counts=[[k, own_counts.get(k, 0)] for k in names],
        means=[[k, means_out.get(k, 0.0)] for k in names],
        vars=[[k, vars_out.get(k, 0.0)] for k in names],
    )


# The synchronous simulation of Figure 3 --------------------------------------------------
class Round(NamedTuple):
    mistakes: list[int]  # k_{i,n}: each shard's mistakes in this round
    mu: list[float]  # μ_{i,n}: the weights of this round's mix (the shards' own weights when not mixing)


class Simulation(NamedTuple):
    rounds: list[Round]
    shards: list  # each shard's model at the end (all the same weights after a final mix)

    @property
    def mistakes(self) -> int:
        """Mistakes over every shard and round."""
        return sum(sum(r.mistakes) for r in self.rounds)

    @property
    def weighted_mistakes(self) -> float:
        """Σ_n Σ_i μ_{i,n}·k_{i,n}: what Theorem 3 bounds by (R/γ)²."""
        return sum(m * k for r in self.rounds for m, k in zip(r.mu, r.mistakes))


def simulate(
    shards: Sequence[Sequence[tuple[Any, int]]],
    *,
    round_events: int,
    mixing: str = "error",
    learner: Callable[[], Any] = Perceptron,
) -> Simulation:
    """Each shard learns ``round_events`` of its events per round from the round's common weights, then the
    weights are mixed (``mixing``: ``"error"``, ``"uniform"``, or ``"none"`` for independent models).
    ``learner`` makes a shard's model (a :class:`Perceptron`, or ``make_learner``'s with a scaler).

    Shards run out at different times: a shard with no event left in a round
    makes no mistake there and is mixed with its weights as they stand.

    >>> X = [([1.0, 2.0], 1), ([2.0, 1.0], -1)] * 4
    >>> sim = simulate([X[:4], X[4:]], round_events=2)
    >>> sim.mistakes, sim.shards[0].weights, sim.weighted_mistakes, round(bound(X, [-1.0, 1.0], 0.0), 9)
    (4, {0: -1.0, 1: 1.0}, 2.0, 12.0)
    """
    if mixing not in ("error", "uniform", "none"):
        raise ValueError(f"mixing must be error, uniform or none, got {mixing!r}")
    models = [learner() for _ in shards]
    rounds = []
    longest = max((len(s) for s in shards), default=0)
    for start in range(0, longest, round_events):
        ks = []
        for model, events in zip(models, shards):
            before = model.updates
            for x, y in events[start : start + round_events]:
                model.step(x, y)
            ks.append(model.updates - before)  # the mistakes of the learning weights: what the proof counts
        if mixing == "none":
            rounds.append(Round(ks, [1.0] * len(ks)))
            continue
        mu = mixing_weights(ks) if mixing == "error" else [1.0 / len(ks)] * len(ks)
        states = [m.to_state() for m in models]
        models = [learner_from_state(mix_states(s, states, mu)) for s in states]
        rounds.append(Round(ks, mu))
    return Simulation(rounds, models)


def shard(events: Iterable[tuple[Any, int]], count: int) -> list[list[tuple[Any, int]]]:
    """Deal events round-robin to ``count`` shards (as keys spread over partitions)."""
    out: list[list[tuple[Any, int]]] = [[] for _ in range(count)]
    for i, event in enumerate(events):
        out[i % count].append(event)
    return out


def bound(events: Sequence[tuple[Sequence[float], int]], w: Sequence[float], b: float) -> float:
    """(R/γ)² of dense ``events`` under the separator (w, b), in the space of x' = (1, x)."""
    norm = math.sqrt(b * b + sum(v * v for v in w))
    gamma = min(y * (sum(wi * xi for wi, xi in zip(w, x)) + b) for x, y in events) / norm
    radius = max(math.sqrt(1.0 + sum(v * v for v in x)) for x, _ in events)
    if gamma <= 0:
        raise ValueError("the separator does not separate the events")
    return (radius / gamma) ** 2

"""How a training run is laid over the cluster: pipeline, data and expert parallel sizes, microbatches.

The planner follows Megatron's rank order (tensor, context, expert, data, pipeline; TP = CP = 1
here), so pipeline rank ``r`` owns the ``gpus / pp`` consecutive GPUs ``r * gpus/pp ...`` and
those GPUs form its data-parallel group: ``dp = gpus / pp``. Expert parallelism does not take
GPUs of its own: like Megatron, EP shards the experts *within* the data-parallel group, so
``ep`` must divide ``dp``, dense weights are replicated over all ``dp`` ranks and expert weights
over the ``dp / ep`` expert-data-parallel ranks. The ``ep`` ranks of a group are consecutive
GPUs, inside one node whenever ``ep`` divides the GPUs per node.

One step runs ``gbs`` sequences: each data-parallel rank runs ``m = gbs / (mbs * dp)``
microbatches of ``mbs`` sequences through the pipeline.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


class ParallelismError(ValueError):
    """A request the cluster cannot run; ``field`` names the argument at fault."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Cluster:
    """``nodes`` machines of ``gpus_per_node`` GPUs each."""

    nodes: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParallelismError(name.replace("_", "-"), f"must be an integer >= 1, got {value!r}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Parallelism:
    """One way to run a step on ``cluster``: ``pp`` pipeline ranks of ``vpp`` virtual stages each."""

    cluster: Cluster
    pp: int
    vpp: int
    ep: int
    gbs: int
    mbs: int

    @property
    def dp(self) -> int:
        """Data-parallel ranks per pipeline rank."""
        return self.cluster.gpus // self.pp

    @property
    def expert_dp(self) -> int:
        """Ranks holding a copy of the same experts (the distributed optimizer shards experts over these)."""
        return self.dp // self.ep

    @property
    def microbatches(self) -> int:
        return self.gbs // (self.mbs * self.dp)

    @property
    def p2p_crosses_nodes(self) -> bool:
        """Whether some pipeline transfer leaves its node (then every transfer is priced at that link)."""
        return self.pp > 1 and self.cluster.nodes > 1

    @property
    def dp_crosses_nodes(self) -> bool:
        """Whether a data-parallel group spans nodes (its collectives then run at inter-node bandwidth)."""
        return self.dp > self.cluster.gpus_per_node

    @property
    def ep_off_node_fraction(self) -> float:
        """Share of an all-to-all's volume that leaves the node, routing spread evenly over the ``ep`` ranks."""
        gpn = self.cluster.gpus_per_node
        return 0.0 if self.ep <= gpn else (self.ep - gpn) / (self.ep - 1)

    def describe(self) -> str:
        return (f"pp={self.pp} vpp={self.vpp} dp={self.dp} ep={self.ep} microbatches={self.microbatches} "
                f"on {self.cluster.nodes}x{self.cluster.gpus_per_node} GPUs")


def _pp_problem(cluster: Cluster, pp: int, ep: int, gbs: int, mbs: int, chunks: int) -> tuple[str, str] | None:
    """``(field at fault, why)`` when ``pp`` pipeline ranks cannot run the request, or None."""
    gpus = cluster.gpus
    if pp < 1 or gpus % pp:
        return "pp", f"{pp} does not divide the {gpus} GPUs"
    if pp > chunks:
        return "pp", f"{pp} stages exceed the model's {chunks} layers (MTP included)"
    dp = gpus // pp
    if dp % ep:
        return "ep", f"pp={pp} leaves dp={dp} data-parallel ranks, which ep={ep} does not divide"
    if gbs % (mbs * dp):
        return "gbs", f"pp={pp} leaves dp={dp}: the global batch {gbs} is not a multiple of mbs*dp = {mbs * dp}"
    return None


def _vpp_problem(pp: int, vpp: int, microbatches: int, chunks: int) -> str | None:
    """Why ``vpp`` virtual stages per rank cannot run, or None."""
    if vpp < 1:
        return f"must be >= 1, got {vpp}"
    if vpp == 1:
        return None
    if pp == 1:
        return "interleaving needs pp > 1"
    if pp * vpp > chunks:
        return f"pp*vpp = {pp * vpp} stages exceed the model's {chunks} layers (MTP included)"
    if microbatches % pp:
        return f"the interleaved schedule needs microbatches ({microbatches}) to be a multiple of pp ({pp})"
    return None


def parallelisms(cluster: Cluster, *, gbs: int, mbs: int, ep: int, layers: int,
                 pp: int | None = None, vpp: int | None = None) -> list[Parallelism]:
    """Every (pp, vpp) to plan: the given ones, or for ``None`` ("auto") all that work.

    ``pp`` auto: the divisors of the GPU count for which ``ep`` divides ``dp`` and the global
    batch splits into whole microbatches. ``vpp`` auto: 1, 2, ... while each of the ``pp * vpp``
    virtual stages still gets a layer and the interleaved schedule's ``m % pp == 0`` holds.
    ``layers`` counts the decoder layers plus the MTP layer. Raises ParallelismError naming the
    field when nothing is left.
    """
    for name, value in (("gbs", gbs), ("mbs", mbs), ("ep", ep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ParallelismError(name, f"must be an integer >= 1, got {value!r}")
    if ep > cluster.gpus:
        raise ParallelismError("ep", f"{ep} exceeds the {cluster.gpus} GPUs")
    pps = [pp] if pp is not None else [d for d in range(1, cluster.gpus + 1) if cluster.gpus % d == 0]
    problems = {p: _pp_problem(cluster, p, ep, gbs, mbs, layers) for p in pps}
    good = [p for p in pps if problems[p] is None]
    if not good:
        if pp is not None:
            raise ParallelismError(*problems[pp])
        # blame the argument most pipeline sizes trip over (e.g. a batch no dp divides)
        counts = Counter(field for field, _ in problems.values() if field != "pp").most_common(2)
        blamed = counts[0][0] if counts and (len(counts) == 1 or counts[0][1] > counts[1][1]) else "pp"
        raise ParallelismError(blamed, "no pipeline size works: " + "; ".join(r for _, r in problems.values()))
    out = []
    for p in good:
        m = gbs // (mbs * (cluster.gpus // p))
        if vpp is not None:
            problem = _vpp_problem(p, vpp, m, layers)
            if problem is None:
                out.append(Parallelism(cluster, p, vpp, ep, gbs, mbs))
            elif pp is not None or len(good) == 1:
                raise ParallelismError("vpp", problem)
            continue
        v = 1
        while _vpp_problem(p, v, m, layers) is None:
            out.append(Parallelism(cluster, p, v, ep, gbs, mbs))
            v += 1
    if not out:
        raise ParallelismError("vpp", f"{vpp} fits none of the pipeline sizes {good}")
    return out

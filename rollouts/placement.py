"""Where the rollout actors run on a Ray cluster: the placement strategies and the checks around them.

The rollout pool (:mod:`rollouts.pool`) reserves its actors' resources in one Ray placement group; the
trainer's rank 0 (:mod:`rl.train`) checks, once the pool is up, that every actor sits on a node that
carries the rollout nodes' custom resource (``cluster.rollout_node_resource``); the config sections
(:mod:`rl.config_sections`) validate ``rollout.placement`` and ``cluster.trainer_placement`` against the
same strategies. Torch-free, and Ray is imported only by the functions that talk to a cluster, so loading
a config imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")  # Ray placement group strategies


class PlacementError(RuntimeError):
    """Rollout actors that cannot be placed (or were not, in time), or that landed on the wrong nodes;
    the message names the shape or the actors and what to change."""


def placement_problem(
    bundle: Mapping[str, float], count: int, strategy: str, nodes: Sequence[Mapping[str, float]]
) -> str | None:
    """Why ``count`` bundles of ``bundle`` can never be placed with ``strategy`` on nodes of these total
    resources (what is free now does not matter), or None when they can.

    >>> node = {"CPU": 2.0, "heed_rollout": 1.0}
    >>> placement_problem({"CPU": 1.0, "heed_rollout": 1.0}, 2, "STRICT_SPREAD", [node, node]) is None
    True
    >>> placement_problem({"CPU": 1.0, "heed_rollout": 1.0}, 2, "STRICT_PACK", [node, node])
    'STRICT_PACK needs one node that holds all 2 bundles; the most one node holds is 1'
    """
    per_node = [
        min((int(node.get(name, 0.0) / amount + 1e-9) for name, amount in bundle.items()), default=count)
        for node in nodes
    ]
    if strategy == "STRICT_PACK" and max(per_node, default=0) < count:
        return (
            f"STRICT_PACK needs one node that holds all {count} bundles; the most one node holds is "
            f"{max(per_node, default=0)}"
        )
    hosts = sum(n >= 1 for n in per_node)
    if strategy == "STRICT_SPREAD" and hosts < count:
        return f"STRICT_SPREAD needs {count} nodes that can each hold one bundle; {hosts} can"
    if sum(per_node) < count:
        return f"{count} bundle(s) are needed; all nodes together hold {sum(per_node)}"
    return None


def rollout_nodes(pool) -> list[str]:
    """The Ray node id of each of the pool's actors, by slot."""
    import ray

    def node_id(_actor) -> str:
        return ray.get_runtime_context().get_node_id()

    return ray.get([actor.__ray_call__.remote(node_id) for actor in pool.actors])


def check_rollout_placement(pool, resource: str) -> list[str]:
    """Every rollout actor is on a node that has ``resource``; returns their nodes' IPs by slot."""
    import ray

    nodes = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    ips, wrong = [], []
    for slot, node in enumerate(rollout_nodes(pool)):
        info = nodes.get(node, {})
        ips.append(info.get("NodeManagerAddress", "?"))
        if info.get("Resources", {}).get(resource, 0) <= 0:
            wrong.append(slot)
    if wrong:
        raise PlacementError(
            f"rollout actor(s) {wrong} landed on nodes without the {resource!r} resource "
            "(cluster.rollout_node_resource): give the trainer ranks the rest of their nodes' CPUs/GPUs "
            "(cluster.trainer_resources) or the rollout nodes more room"
        )
    return ips

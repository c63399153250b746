"""The symmetric solver: a model of repeated blocks on servers of a few kinds (DiviML's LLM case).

Transformer layers are identical and so are the servers of one kind, so groups of blocks are placed
inside one server once (``toolkit.blocks.find_blocks`` finds them) and a small integer program decides how
many consecutive blocks each server takes, paying the network only at server boundaries; the head
and tail kernels are then placed where the simulator says the whole plan is best.

The plan's value is the simulator's on the whole graph, and its bound is the full problem's, never
the restriction's. Models without repeated blocks and ``host_staged`` platforms fall back to the
full-graph solver (``attrs["symmetric"]["fallback"]``); pipelines are refused.

The steps and the integer program: docs/solvers.md#symmetric.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import mip

from ..bounds import lower_bound
from ..cost.base import CostModel
from ..cost.remembered import RememberedCosts
from ..errors import DivimlInputError
from ..graph import Edge, Kernel, OpGraph
from ..plan import Plan, better_of
from ..platform import Platform
from ..problem import Problem
from ..servers import identical_servers, server_devices, server_platform
from ..simulator import memory_per_device, simulate
from ..tolerances import meets
from ..toolkit.blocks import Blocks, find_blocks
from ..toolkit.cpsat_session import CpsatSession
from ..toolkit.deadline import Deadline
from ..toolkit.heuristics import best_heuristic
from ..toolkit.incumbents import Incumbents
from ..toolkit.mip_backend import new_model, optimized
from ..toolkit.throughput_exact import exact_throughput
from . import full_graph_solver, get_solver
from .base import Solver

log = logging.getLogger(__name__)

ENTRY, EXIT = "__block_entry__", "__block_exit__"
MAX_GROUP = 4  # throughput groups: at most this many blocks solved together
# A group one block larger must cut the period per block by this much, or groups stop growing. On
# llama (24 layers, paper-node) 2 blocks gained 1.1% over 1, and 3 blocks 0.3% more for 3x the time.
MIN_GROUP_GAIN = 0.02
FEWER_RUNS = 1e-4  # throughput program: a run costs this much of a block's time
ROUNDS = 2  # server programs: the first guesses where head and tail go, the second knows


@dataclass
class GroupPlacement:
    """g blocks placed on one server of a kind: per block, its time (latency), the load of each device
    and link by position in the server (throughput), the weights on each device; plus activations."""

    anchor: int  # the anchor's position among the server's devices
    group: int
    plan: Plan  # over the first server of the kind's device names
    block_s: float
    device_load_s: list[float]
    link_load_s: dict[tuple[int, int], float]
    weight_bytes: list[float]
    activation_bytes: list[float]
    start_s: dict[str, float]  # simulated start of each kernel: the run order
    positions: tuple[int, ...]  # the plan's device positions -> the server's (mirrors)

    def mirrored(self, a: int, b: int) -> GroupPlacement:
        """This placement with identical devices ``a`` and ``b`` swapped."""
        swap = {a: b, b: a}

        def moved(values: list) -> list:
            return [values[swap.get(p, p)] for p in range(len(values))]

        return replace(
            self,
            anchor=swap.get(self.anchor, self.anchor),
            device_load_s=moved(self.device_load_s),
            link_load_s={(swap.get(x, x), swap.get(y, y)): v for (x, y), v in self.link_load_s.items()},
            weight_bytes=moved(self.weight_bytes),
            activation_bytes=moved(self.activation_bytes),
            positions=tuple(swap.get(p, p) for p in self.positions),
        )

    @property
    def period_s(self) -> float:
        """Per block, the busiest device or link (throughput)."""
        return max([*self.device_load_s, *self.link_load_s.values()])


Allocation = dict[str, list[tuple[GroupPlacement, int]]]  # server -> its runs: (group placement, blocks), in order


class Symmetric(Solver):
    """Symmetric placement (module docstring). ``max_group``: the largest group of blocks solved
    together for throughput; ``group_time_limit_s``: seconds for each group problem."""

    name = "symmetric"
    objectives = ("latency", "throughput")
    modes = ("latency", "period_overlap", "host_staged")  # host_staged: the whole-graph fallback
    inputs = ("watch",)

    def __init__(
        self, *, time_limit_s: float = 60.0, seed: int = 0, max_group: int = MAX_GROUP, group_time_limit_s: float = 1.0
    ):
        super().__init__(time_limit_s=time_limit_s, seed=seed)
        self.max_group, self.group_time_limit_s = max_group, group_time_limit_s

    def place(self, problem: Problem, deadline: Deadline, *, watch: Incumbents | None = None) -> Plan:
        """The symmetric plan, offered to ``watch`` at once, then the whole-graph MILP's improvement of it."""
        blocks, found = find_blocks(problem.graph, problem.costs, problem.platform)
        if blocks is None or problem.mode == "host_staged":
            reason = found if blocks is None else "platforms that stage transfers through host memory"
            return self._fall_back(problem, reason, deadline, watch)
        log.info("symmetric: %s", found)
        problem = Problem(
            problem.graph,
            problem.platform,
            RememberedCosts(problem.costs, problem.platform, free=(ENTRY, EXIT)),
            objective=problem.objective,
        )
        if watch is not None:
            self._offer_first_plan(problem, blocks, deadline, watch)
        placements = self._placements(problem, blocks, deadline)
        if not any(placements.values()):
            raise DivimlInputError(
                "no server can hold even one block of the model",
                field="memory_bytes",
                hint="use servers with more memory, or another solver",
            )
        sim, plan, allocation = self._plan_from(problem, blocks, placements, deadline)
        plan.value_s = sim.value_s
        plan.lower_bound_s = min(lower_bound(problem), sim.value_s)  # the whole problem's
        plan.optimal = meets(sim.value_s, plan.lower_bound_s)
        if watch is not None:
            watch.offer(plan, "symmetric: blocks on servers")
            watch.bound(plan.lower_bound_s, "symmetric's bound")
        improved = False
        if problem.mode == "period_overlap" and not plan.optimal:  # the MILP from here: its bound, or better
            whole = exact_throughput(problem, deadline, seed=self.seed, solver=self.name, incumbent=plan)
            plan = better_of(plan, whole)
            improved = plan is whole
        plan.attrs["symmetric"] = {
            "improved_by_milp": improved,
            "blocks": len(blocks.blocks),
            "block_kernels": blocks.block_size,
            "head": len(blocks.head),
            "tail": len(blocks.tail),
            "candidates": sum(len(found) for found in placements.values()),
            "servers": {
                server: [
                    {
                        "blocks": n,
                        "anchor": server_devices(problem.platform)[server][placement.anchor],
                        "group": placement.group,
                    }
                    for placement, n in runs
                ]
                for server, runs in allocation.items()
            },
        }
        return plan

    def _plan_from(
        self,
        problem: Problem,
        blocks: Blocks,
        placements: dict[str, list[GroupPlacement]],
        deadline: Deadline,
        place_ends: bool = True,
    ) -> tuple:
        """The best of ``ROUNDS`` server programs over ``placements``: (its simulation, plan, allocation).
        Without ``place_ends`` the head and tail stay on the first and last run's anchors."""
        best, ends, end_links = None, None, {}
        for _ in range(ROUNDS):
            allocation, memory_binds = self._allocate(problem, blocks, placements, ends, end_links, deadline)
            plan, rank = self._assemble(problem, blocks, allocation)
            if place_ends:
                self._place_ends(problem, blocks, plan, rank, allocation)
            sim = simulate(problem, plan)
            if best is None or sim.value_s < best[0].value_s:
                best = (sim, plan, allocation)
            if problem.objective == "latency" and not memory_binds:
                break  # the ends' time does not enter the latency program: no news
            ends = _end_loads(problem, blocks, plan)
            end_links = _end_link_loads(problem, blocks, plan) if problem.objective == "throughput" else {}
        return best

    def _offer_first_plan(self, problem: Problem, blocks: Blocks, deadline: Deadline, watch: Incumbents) -> None:
        """A first plan offered before the group solves, which take most of the time: the server program
        over one block's list schedules (and the block whole on its anchor), no solve; for latency the
        head and tail stay on the anchors. None where memory wants more."""
        latency = problem.objective == "latency"
        quick = self._placements(problem, blocks, deadline, max_group=1, solve=False)
        if not any(quick.values()):
            return
        try:
            sim, plan, _ = self._plan_from(problem, blocks, quick, deadline, place_ends=not latency)
        except DivimlInputError as error:  # memory wants larger groups or split blocks: the full placements decide
            log.info("symmetric: no first plan (%s)", error)
            return
        watch.offer(plan, "symmetric: list schedules of one block on servers", sim.value_s)

    # ------------------------------------------------------------------ fallback
    def _fall_back(self, problem: Problem, reason: str, deadline: Deadline, watch: Incumbents | None) -> Plan:
        name = full_graph_solver(problem)
        log.warning("%s; solving the whole graph with %s instead", reason, name)
        plan = get_solver(name, time_limit_s=self.time_limit_s, seed=self.seed).solve(
            problem, deadline=deadline, watch=watch
        )
        plan.attrs["symmetric"] = {"fallback": f"{reason}; solved by {name}"}
        return plan

    # ------------------------------------------------------------------ 2. placements
    def _placements(
        self,
        problem: Problem,
        blocks: Blocks,
        deadline: Deadline,
        max_group: int | None = None,
        solve: bool = True,
    ) -> dict[str, list[GroupPlacement]]:
        """Kind -> its placements (every anchor and group size up to ``max_group`` that gave a plan).
        Without ``solve``, list schedules of the groups stand in for their solves."""
        out: dict[str, list[GroupPlacement]] = {}
        latency = problem.objective == "latency"
        opened = CpsatSession(seed=self.seed, workers=2) if latency and solve else contextlib.nullcontext()
        with opened as session:  # one OR-Tools process for all latency groups
            for servers in identical_servers(problem.platform):
                kind, found = self._kind_placements(
                    problem, blocks, servers[0], session, deadline, max_group or self.max_group, solve
                )
                out[kind] = found
        return out

    def _kind_placements(
        self,
        problem: Problem,
        blocks: Blocks,
        first: str,
        session: CpsatSession | None,
        deadline: Deadline,
        max_group: int,
        solve: bool,
    ) -> tuple[str, list[GroupPlacement]]:
        """The placements of the kind of server ``first``, each group solve within the whole deadline
        (without ``solve``, each group's best list schedule instead)."""
        devices = server_devices(problem.platform)
        groups = [1] if problem.objective == "latency" else list(range(1, min(max_group, len(blocks.blocks)) + 1))
        kind = problem.platform.servers[first].kind if problem.platform.servers else first
        platform = server_platform(problem.platform, first)
        found = []
        position = {d: p for p, d in enumerate(devices[first])}
        for twins in _anchors(platform, problem.costs, blocks.blocks[0]):
            anchor = twins[0]
            per_block = math.inf  # the period per block of this anchor's last group
            for group in groups:
                if group > 1 and group > len(platform.devices):
                    break
                sub = _group_problem(problem, blocks, group, platform, anchor)
                try:
                    sub.validate()
                except DivimlInputError as error:  # this server cannot hold the group: no placement
                    log.info("symmetric: %s, anchor %s, %d blocks: %s", kind, anchor, group, error)
                    continue
                if solve:
                    solver = get_solver(full_graph_solver(sub), time_limit_s=self.group_time_limit_s, seed=self.seed)
                    plans = [solver.solve(sub, deadline=deadline, session=session)]
                else:  # a list schedule: milliseconds on one group
                    plans = [plan for plan in (best_heuristic(sub),) if plan is not None]
                if group == 1:  # the block whole on the anchor: it spares the other devices' memory
                    plans.append(Plan({k: anchor for k in sub.graph.kernels}, objective=sub.objective, mode=sub.mode))
                solved = None
                for plan in plans:
                    sim = simulate(sub, plan)
                    if not sim.feasible or any(plan.assignment == c.plan.assignment for c in found):
                        continue
                    placement = _group_placement(devices[first], group, plan, sub, sim)
                    # the same plan anchored on each identical device: memory may need them all
                    found += [placement] + [placement.mirrored(position[anchor], position[twin]) for twin in twins[1:]]
                    solved = solved or placement
                    log.info(
                        "symmetric: %s, anchor %s, %d block(s): %.4g s per block",
                        kind,
                        anchor,
                        group,
                        placement.block_s if problem.objective == "latency" else placement.period_s,
                    )
                if solved is None or solved.period_s > per_block * (1 - MIN_GROUP_GAIN):
                    break
                per_block = solved.period_s
        return kind, found

    # ------------------------------------------------------------------ 3. blocks per server
    def _allocate(
        self,
        problem: Problem,
        blocks: Blocks,
        placements: dict[str, list[GroupPlacement]],
        ends: dict[str, tuple[float, float]] | None,
        end_links: dict[tuple[str, str], float],
        deadline: Deadline,
    ) -> tuple[Allocation, bool]:
        """Server -> its (group placement, number of blocks) runs, servers taking none left out; and whether
        memory kept a server from taking one block more. ``ends``: device -> (seconds, weight bytes) of
        the head and tail where a previous round put them; without it every device keeps room for all
        their weights. ``end_links``: (device, device) -> seconds of their transfers on that link (the
        model's output returning to the host can set the period alone). The program gets a quarter
        of the time limit within the deadline, at least 1 s."""
        servers = _ServerProgram(problem, blocks, placements, ends, end_links)
        platform, devices, total = problem.platform, servers.devices, len(blocks.blocks)
        model = new_model("symmetric_servers", "highs")
        n, y, used = _run_variables(model, {server: servers.runs(server) for server in servers.kinds}, total)
        for server in servers.kinds:
            _fit_memory(model, platform, devices[server], servers.runs(server), n, y, server, servers.fixed)
        _order_alike_servers(model, platform, devices, n, servers.runs, servers.fixed, servers.fixed_link)
        servers.set_objective(model, n, y, used)
        status = optimized(model, max_seconds=max(1.0, min(self.time_limit_s / 4, deadline.left())))
        if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
            raise DivimlInputError(
                f"the {total} blocks do not fit in the servers' memory "
                f"(each block's weights: {problem.graph.weight_bytes(blocks.blocks[0]):.3g} B)",
                field="memory_bytes",
                hint="add servers, or use servers with more memory",
            )
        allocation = servers.allocation(n)
        return allocation, any(_memory_full(platform, devices[s], allocation[s], servers.fixed) for s in allocation)

    # ------------------------------------------------------------------ assembly
    def _assemble(self, problem: Problem, blocks: Blocks, allocation: Allocation) -> tuple[Plan, dict[str, tuple]]:
        """The blocks through the servers in order, each run of blocks repeating its group placement's
        pattern; and each kernel's rank in the run order (``_set_order``)."""
        devices = server_devices(problem.platform)
        assignment: dict[str, str] = {}
        rank: dict[str, tuple] = {}
        topo = {k: i for i, k in enumerate(problem.graph.topo_order)}
        index = 0
        for server, placement, count in ((s, c, k) for s, runs in allocation.items() for c, k in runs):
            first = _server_of_names(devices, placement.plan)
            pattern_of = pattern_blocks(blocks, placement.group)
            for local in range(count):
                pattern = blocks.blocks[pattern_of[local % placement.group]]
                for position, kernel in enumerate(blocks.blocks[index]):
                    source = pattern[position]
                    placed = devices[first].index(placement.plan.assignment[source])
                    assignment[kernel] = devices[server][placement.positions[placed]]
                    rank[kernel] = (1, index, placement.start_s.get(source, 0.0), topo[kernel])
                index += 1
        first_server, last_server = list(allocation)[0], list(allocation)[-1]
        for kernels, server, placement, tier in (
            (blocks.head, first_server, allocation[first_server][0][0], 0),
            (blocks.tail, last_server, allocation[last_server][-1][0], 2),
        ):
            for kernel in kernels:
                assignment[kernel] = devices[server][placement.anchor]
                rank[kernel] = (tier, 0, 0.0, topo[kernel])
        plan = Plan(assignment, objective=problem.objective, mode=problem.mode, solver=self.name)
        _set_order(plan, rank)
        return plan, rank

    # ------------------------------------------------------------------ 4. head and tail
    def _place_ends(
        self, problem: Problem, blocks: Blocks, plan: Plan, rank: dict[str, tuple], allocation: Allocation
    ) -> None:
        """Move each head and tail kernel to its best device, judged by the simulator on the whole plan.
        Only the servers that hold the model's inputs and outputs (the host's), its first block or its
        last block are tried: elsewhere a head or tail kernel only adds network hops."""
        devices = server_devices(problem.platform)
        host = next(s for s, names in devices.items() if problem.platform.host in names)
        near = {d for s in {host, next(iter(allocation)), list(allocation)[-1]} for d in devices[s]}
        best = _score(problem, plan)
        for _ in range(2):
            improved = False
            for kernel in blocks.head + blocks.tail:
                current = plan.assignment[kernel]
                for device in (d for d in problem.feasible_devices(kernel) if d in near):
                    if device == current:
                        continue
                    plan.assignment[kernel] = device
                    _set_order(plan, rank)
                    score = _score(problem, plan)
                    if score < best:
                        best, current, improved = score, device, True
                plan.assignment[kernel] = current
                _set_order(plan, rank)
            if not improved:
                break


class _ServerProgram:
    """What the server program (``Symmetric._allocate``) reads: each server's devices, host and kind,
    the group placements of its kind, and the head and tail where a previous round put them (``ends``,
    ``end_links``); times in units of the fastest block's."""

    def __init__(
        self,
        problem: Problem,
        blocks: Blocks,
        placements: dict[str, list[GroupPlacement]],
        ends: dict[str, tuple[float, float]] | None,
        end_links: dict[tuple[str, str], float],
    ):
        platform = problem.platform
        self.problem, self.placements, self.ends, self.end_links = problem, placements, ends, end_links
        self.devices = server_devices(platform)
        self.hosts = {s: server.host for s, server in platform.servers.items()}
        self.kinds = {
            s: platform.servers[s].kind if platform.servers else s
            for group in identical_servers(platform)
            for s in group
        }
        self.unit = min(p.block_s for found in placements.values() for p in found) or 1.0
        self.every_end = problem.graph.weight_bytes(blocks.head + blocks.tail)
        self.boundary = _boundary_bytes(problem.graph, blocks)

    def fixed(self, device: str) -> tuple[float, float]:
        """(seconds, weight bytes) of the head and tail on ``device`` (before a round placed them: no
        time, and room for all their weights)."""
        return self.ends.get(device, (0.0, 0.0)) if self.ends is not None else (0.0, self.every_end)

    def fixed_link(self, src: str, dst: str) -> float:
        return self.end_links.get((src, dst), 0.0)

    def move(self, src: str, dst: str) -> float:
        return self.problem.costs.transfer_s(self.boundary, src, dst) / self.unit

    def network_hop(self, server: str) -> float:
        """The boundary tensor reaching this server's host from another server's."""
        other = next((s for s in self.devices if s != server), None)
        return self.move(self.hosts[other], self.hosts[server]) if other is not None else 0.0

    def runs(self, server: str) -> list[tuple[int, GroupPlacement]]:
        return list(enumerate(self.placements.get(self.kinds[server], [])))

    def set_objective(self, model: mip.Model, n: dict, y: dict, used: dict) -> None:
        """The latency of the blocks' path, or the period. Each run enters its anchor from the server's
        host; each server used is one network hop."""
        devices, hosts, unit = self.devices, self.hosts, self.unit
        if self.problem.objective == "latency":
            model.objective = mip.minimize(
                mip.xsum(
                    n[s, i] * p.block_s / unit
                    + y[s, i] * self.move(hosts.get(s, devices[s][p.anchor]), devices[s][p.anchor])
                    for s in self.kinds
                    for i, p in self.runs(s)
                )
                + mip.xsum(used[s] * self.network_hop(s) for s in self.kinds)
            )
            return
        period = model.add_var(lb=0.0)
        for s in self.kinds:
            _bound_period(model, period, devices[s], self.runs(s), n, s, unit, self.fixed, self.fixed_link)
            model += period >= used[s] * self.network_hop(s)
        # among equal periods, the fewest runs: a server that could mix placements freely otherwise
        # mixes them at random wherever another device sets the period
        model.objective = mip.minimize(period + FEWER_RUNS * mip.xsum(y.values()))

    def allocation(self, n: dict) -> Allocation:
        """The solved program's runs per server, in the platform's server order, servers taking none left out."""
        allocation: Allocation = {}
        for s in self.devices:
            taken = [(p, round(n[s, i].x)) for i, p in (self.runs(s) if s in self.kinds else [])]
            if any(count > 0 for _, count in taken):
                allocation[s] = [(p, count) for p, count in taken if count > 0]
        return allocation


def _run_variables(
    model: mip.Model, runs: dict[str, list[tuple[int, GroupPlacement]]], total: int
) -> tuple[dict, dict, dict]:
    """The server program's variables: n[s, i] blocks of run i on server s (y[s, i] whether any),
    used[s] whether server s takes any; every block taken once. A run of a group placement repeats
    the whole group: its blocks differ (one may load a device more), and only whole groups have the
    placement's loads per block."""
    n, y, used = {}, {}, {}
    for server, server_runs in runs.items():
        used[server] = model.add_var(var_type=mip.BINARY)
        for i, placement in server_runs:
            n[server, i] = model.add_var(var_type=mip.INTEGER, lb=0, ub=total)
            y[server, i] = model.add_var(var_type=mip.BINARY)
            model += n[server, i] <= total * y[server, i]
            model += used[server] >= y[server, i]
            if placement.group > 1:
                model += n[server, i] == placement.group * model.add_var(
                    var_type=mip.INTEGER, lb=0, ub=total // placement.group
                )
    model += mip.xsum(n.values()) == total
    return n, y, used


def _order_alike_servers(
    model: mip.Model,
    platform: Platform,
    devices: dict[str, list[str]],
    n: dict,
    runs: Callable[[str], list[tuple[int, GroupPlacement]]],
    fixed: Callable[[str], tuple[float, float]],
    fixed_link: Callable[[str, str], float],
) -> None:
    """Servers alike down to the head and tail they carry take blocks in order, most first: one of
    their many equal allocations, so that the program does not search them all."""
    for servers in identical_servers(platform):
        alike: dict[tuple, list[str]] = {}
        for server in servers:
            names = devices[server]
            carried = (*(fixed(d) for d in names), *(fixed_link(a, b) for a in names for b in names if a != b))
            alike.setdefault(carried, []).append(server)
        for twins in alike.values():
            for a, b in zip(twins, twins[1:]):
                model += mip.xsum(n[a, i] for i, _ in runs(a)) >= mip.xsum(n[b, i] for i, _ in runs(b))


def _bound_period(
    model: mip.Model,
    period: mip.Var,
    devices: list[str],
    runs: list[tuple[int, GroupPlacement]],
    n: dict,
    server: str,
    unit: float,
    fixed: Callable[[str], tuple[float, float]],
    fixed_link: Callable[[str, str], float],
) -> None:
    """The period is at least each device's and each link's load on ``server`` (head and tail included)."""
    for p, device in enumerate(devices):
        load = mip.xsum(n[server, i] * (c.device_load_s[p] / unit) for i, c in runs)
        model += period >= load + fixed(device)[0] / unit
    links = {link for _, c in runs for link in c.link_load_s}
    links |= {(a, b) for a in range(len(devices)) for b in range(len(devices)) if fixed_link(devices[a], devices[b])}
    for a, b in links:
        load = mip.xsum(n[server, i] * (c.link_load_s.get((a, b), 0.0) / unit) for i, c in runs)
        model += period >= load + fixed_link(devices[a], devices[b]) / unit


def _fit_memory(
    model: mip.Model,
    platform: Platform,
    devices: list[str],
    runs: list[tuple[int, GroupPlacement]],
    n: dict,
    y: dict,
    server: str,
    fixed: Callable[[str], tuple[float, float]],
) -> None:
    """On each device of ``server`` with a capacity: the weights of every block it takes and the
    activations of its largest run fit beside the head and tail (in MiB, for the solver's tolerances)."""
    for p, device in enumerate(devices):
        capacity = platform.device(device).memory_bytes
        if capacity is None:
            continue
        live = model.add_var(lb=0.0)
        for i, c in runs:
            model += live >= y[server, i] * (c.activation_bytes[p] / 2**20)
        model += (
            mip.xsum(n[server, i] * (c.weight_bytes[p] / 2**20) for i, c in runs) + live
            <= (capacity - fixed(device)[1]) / 2**20
        )


def _memory_full(
    platform: Platform,
    devices: list[str],
    taken: list[tuple[GroupPlacement, int]],
    fixed: Callable[[str], tuple[float, float]],
) -> bool:
    """Whether memory keeps a server (its ``devices``, its ``taken`` runs) from taking one block more;
    ``fixed``: device -> (seconds, weight bytes) of the head and tail there."""
    for p, device in enumerate(devices):
        capacity = platform.device(device).memory_bytes
        if capacity is None:
            continue
        need = sum(k * c.weight_bytes[p] for c, k in taken) + max(c.activation_bytes[p] for c, _ in taken)
        if any(c.weight_bytes[p] > 0 and need + c.weight_bytes[p] > capacity - fixed(device)[1] for c, _ in taken):
            return True
    return False


def _end_loads(problem: Problem, blocks: Blocks, plan: Plan) -> dict[str, tuple[float, float]]:
    """Device -> (compute seconds, weight bytes) of the head and tail kernels placed there."""
    on: dict[str, list[str]] = {}
    for kernel in blocks.head + blocks.tail:
        on.setdefault(plan.assignment[kernel], []).append(kernel)
    return {
        d: (sum(problem.costs.compute_s(k, d) for k in kernels), problem.graph.weight_bytes(kernels))
        for d, kernels in on.items()
    }


def _end_link_loads(problem: Problem, blocks: Blocks, plan: Plan) -> dict[tuple[str, str], float]:
    """(src, dst) -> seconds a period of the head's and tail's transfers takes on that link: the
    simulator's link loads of ``plan`` with only the tensors into and out of them, the model's inputs
    they read and the outputs they return."""
    graph, ends = problem.graph, set(blocks.head + blocks.tail)
    touching = OpGraph(
        graph.kernels.values(),
        [e for e in graph.edges if e.src in ends or e.dst in ends],
        inputs=[
            replace(i, consumers=tuple(k for k in i.consumers if k in ends))
            for i in graph.inputs
            if ends.intersection(i.consumers)
        ],
        outputs=[k for k in graph.outputs if k in ends],
        weights=graph.weights,
    )
    return simulate(Problem(touching, problem.platform, problem.costs, objective=problem.objective), plan).link_busy_s


def _score(problem: Problem, plan: Plan) -> float:
    sim = simulate(problem, plan)
    return sim.value_s if sim.feasible else math.inf


def _set_order(plan: Plan, rank: dict[str, tuple]) -> None:
    """Latency plans run each device's kernels by ``rank`` (head, blocks in order as their pattern ran, tail)."""
    if plan.objective != "latency":
        return
    order: dict[str, list[str]] = {}
    for kernel in sorted(plan.assignment, key=rank.__getitem__):
        order.setdefault(plan.assignment[kernel], []).append(kernel)
    plan.order = order


def _anchors(platform: Platform, costs: CostModel, block: list[str]) -> list[list[str]]:
    """Devices grouped by what they are (every figure but the name), their links and the block's
    times on them, in device order: one group problem per group, anchored on its first device,
    stands for all (mirrored onto the others)."""
    groups: dict[tuple, list[str]] = {}
    for device in platform.devices:
        what = {k: str(v) for k, v in asdict(device).items() if k not in ("name", "device")}
        links = tuple(
            sorted(
                (
                    platform.link(device.name, other.name).latency_s,
                    platform.link(device.name, other.name).bandwidth_Bps or math.inf,
                )
                for other in platform.devices
                if other.name != device.name
            )
        )
        times = tuple(costs.compute_s(k, device.name) for k in block)
        groups.setdefault((tuple(sorted(what.items())), links, times), []).append(device.name)
    return list(groups.values())


def _boundary_bytes(graph: OpGraph, blocks: Blocks) -> float:
    """The bytes one block passes to the next (a tensor crosses once: the largest edge)."""
    second = set(blocks.blocks[1])
    return max((e.bytes for k in blocks.blocks[0] for e in graph.succ[k] if e.dst in second), default=0.0)


def pattern_blocks(blocks: Blocks, group: int) -> list[int]:
    """The blocks a group problem stands for: from the second block on where a block follows and one
    comes after, so that the group enters and leaves as the middle of the model does."""
    return list(range(1, 1 + group)) if len(blocks.blocks) >= group + 2 else list(range(group))


def _group_problem(problem: Problem, blocks: Blocks, group: int, platform: Platform, anchor: str) -> Problem:
    """``group`` blocks alone on one server, entered and left through ``anchor``."""
    graph = problem.graph
    members = [k for b in pattern_blocks(blocks, group) for k in blocks.blocks[b]]
    inside = set(members)
    arriving: dict[str, float] = {}
    leaving: dict[str, float] = {}
    entry_bytes = 0.0  # the largest tensor the entry stands for, live on the anchor
    edges = []
    for kernel in members:
        for edge in graph.pred[kernel]:
            if edge.src in inside:
                edges.append(edge)
            else:
                arriving[kernel] = max(arriving.get(kernel, 0.0), edge.bytes)
                entry_bytes = max(entry_bytes, graph.kernels[edge.src].output_bytes)
        for edge in graph.succ[kernel]:
            if edge.dst not in inside:
                leaving[kernel] = max(leaving.get(kernel, 0.0), edge.bytes)
    for graph_input in graph.inputs:
        for consumer in graph_input.consumers:
            if consumer in inside:
                arriving[consumer] = max(arriving.get(consumer, 0.0), graph_input.bytes)
                entry_bytes = max(entry_bytes, graph_input.bytes)
    edges += [Edge(ENTRY, k, b) for k, b in arriving.items()] + [Edge(k, EXIT, b) for k, b in leaving.items()]
    kernels = [Kernel(ENTRY, output_bytes=entry_bytes, allowed_devices=(anchor,))]
    kernels += [graph.kernels[k] for k in members] + [Kernel(EXIT, allowed_devices=(anchor,))]
    used = {w for k in members for w in graph.kernels[k].weights}
    sub = OpGraph(
        kernels,
        edges,
        outputs=[EXIT],
        weights={w: graph.weights[w] for w in used},
        name=f"{graph.name}/{group} block(s)",
    )
    costs = RememberedCosts(problem.costs, platform, free=(ENTRY, EXIT))
    return Problem(sub, platform, costs, objective=problem.objective)


def _group_placement(devices: list[str], group: int, plan: Plan, sub: Problem, sim) -> GroupPlacement:
    """What the server program needs of a solved group problem, per block and by device position."""
    position = {d: p for p, d in enumerate(devices)}
    graph = sub.graph
    memory = memory_per_device(graph, plan)
    weights = [0.0] * len(devices)
    for device in devices:
        weights[position[device]] = graph.weight_bytes([k for k, d in plan.assignment.items() if d == device])
    activations = [max(memory.get(d, 0.0) - weights[position[d]], 0.0) for d in devices]
    return GroupPlacement(
        position[plan.assignment[ENTRY]],
        group,
        plan,
        sim.value_s / group,
        [sim.device_busy_s.get(d, 0.0) / group for d in devices],
        {(position[a], position[b]): load / group for (a, b), load in sim.link_busy_s.items()},
        [w / group for w in weights],
        activations,
        dict(sim.start_s),
        tuple(range(len(devices))),
    )


def _server_of_names(devices: dict[str, list[str]], plan: Plan) -> str:
    """The server whose device names a group placement's plan uses."""
    anchor = plan.assignment[ENTRY]
    return next(s for s, names in devices.items() if anchor in names)

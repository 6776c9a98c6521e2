"""The jobs a consumer holds, and keeping them alive when the node that
delivered them is gone. Sans I/O: the shells send the commands.

Theory of operation
-------------------

A job is *held* from its delivery to this client (GETJOB) until this
client settles it: ACKJOB, FASTACK, NACK, ENQUEUE or DELJOB of its ID
(sent, whatever the answer: the caller is done with it), or ``release``.
Code that fetches with one client and settles with another (the Celery
and Dramatiq integrations) holds the jobs on the client that settles them
(``hold``) and turns holding off on the one that fetches.

Every node holding a copy of a delivered job queues it again when its own
RETRY timer runs out, unless a WORKING pushed the timer; the node that
delivered it tells the others (at the delivery, and at each WORKING).
When that node is gone, nobody tells them any more, and the nodes left
queue its jobs again at their RETRY (or once they mark it failed, for a
job delivered just before it went down): a job still being worked on
would run twice. So the client tells
them itself, once, for each job it holds from that node:

1. A node is *gone* when a connection to it could not be opened or broke,
   or when a HELLO gives it priority 100 (failing, or leaving: a WORKING
   elsewhere costs a leaving node nothing). It is back once a connection
   to it answers HELLO again.
2. The held jobs of a gone node are *orphans*. One ``Reassert`` round
   sends WORKING for all of them, pipelined, node after node in the order
   the router gives (the nodes that created them first: they hold a copy;
   then the client's connect order), at most ``MAX_NODES`` nodes, each
   asked only about the jobs still without a holder: ``-NOJOB`` means no
   copy there, so the next node is asked.
3. A WORKING answered moves the job to that node: held from there now (an
   ack of it goes there while its creator is out), and that node tells
   the other holders.
4. ``-TOOLATE`` (half the job's TTL has passed: it will be queued again at
   its RETRY whatever we say), another error reply, or ``-NOJOB`` from
   every node asked: no more attempts. The job stays held, with no node.
5. Jobs that found no holder because nodes could not be reached stay
   orphans for the next round, at most ``MAX_ROUNDS`` rounds; then as 4.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .commands import Command, working
from .errors import DisqueConnectionError, DisqueError, NoJobError, TooLateError
from .protocol import Response
from .types import Address

__all__ = ["HELD_MAX", "MAX_NODES", "MAX_ROUNDS", "HeldJobs", "Reassert", "ReassertResult"]

# The held jobs remembered at most (the oldest are forgotten past this): a
# consumer that never settles what it takes must not grow without bound.
HELD_MAX = 100_000
# Nodes one round asks at most: with REPLICATE r on n nodes a node holds a
# copy with odds (r - 1) / (n - 1), the creator always.
MAX_NODES = 10
# Rounds an orphan is tried in while nodes cannot be reached.
MAX_ROUNDS = 3


class HeldJobs:
    """Held job IDs, each with the node it is held from (None once no
    holder could be found), and the nodes found gone."""

    def __init__(self, limit: int = HELD_MAX) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        # Oldest first, for the bound.
        self._node: OrderedDict[str, Address | None] = OrderedDict()
        # The same, by node: what a gone node leaves orphaned, without a scan.
        self._by_node: dict[Address, dict[str, None]] = {}
        self._gone: set[Address] = set()
        # Rounds each orphan went through without reaching a holder.
        self._rounds: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._node)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._node

    def node_of(self, job_id: str) -> Address | None:
        """The node the job is held from (None: unknown, or not held)."""
        return self._node.get(job_id)

    def hold(self, address: Address | None, job_ids: Iterable[str]) -> None:
        """These jobs were delivered by the node at ``address`` (None:
        unknown) and are being worked on."""
        for job_id in job_ids:
            self._place(job_id, address)
            self._node.move_to_end(job_id)
        while len(self._node) > self.limit:
            self.release([next(iter(self._node))])

    def release(self, job_ids: Iterable[str]) -> None:
        """These jobs are settled (or no longer this client's concern)."""
        for job_id in job_ids:
            self._place(job_id, None)
            self._node.pop(job_id, None)
            self._rounds.pop(job_id, None)

    def _place(self, job_id: str, address: Address | None) -> None:
        old = self._node.get(job_id)
        if old is not None:
            jobs = self._by_node[old]
            jobs.pop(job_id, None)
            if not jobs:
                del self._by_node[old]
        self._node[job_id] = address
        if address is not None:
            self._by_node.setdefault(address, {})[job_id] = None

    def nodes(self) -> list[Address]:
        """The nodes jobs are held from that are not known to be gone:
        the ones worth watching."""
        return [a for a in self._by_node if a not in self._gone]

    def gone(self, address: Address) -> None:
        self._gone.add(address)

    def back(self, address: Address) -> None:
        self._gone.discard(address)

    def is_gone(self, address: Address) -> bool:
        return address in self._gone

    @property
    def due(self) -> bool:
        """Some held job is an orphan (its node is gone)."""
        return any(a in self._by_node for a in self._gone)

    def orphans(self) -> list[str]:
        return [j for a in self._gone for j in self._by_node.get(a, ())]

    def moved(self, job_id: str, address: Address | None) -> None:
        """A round is over for this job: held from ``address`` now (None:
        no holder found; no more attempts)."""
        if job_id in self._node:
            self._place(job_id, address)
        self._rounds.pop(job_id, None)

    def missed(self, job_id: str) -> bool:
        """A round could not reach a holder of this orphan: True if it is
        tried again in the next one, False if it was its last."""
        rounds = self._rounds.get(job_id, 0) + 1
        if rounds >= MAX_ROUNDS:
            self.moved(job_id, None)
            return False
        self._rounds[job_id] = rounds
        return True


@dataclass(slots=True)
class ReassertResult:
    """What a round did: jobs kept alive, by the node that took the
    WORKING; jobs too late (``-TOOLATE``); jobs no node asked holds;
    jobs refused otherwise (the error); jobs left for the next round."""

    moved: dict[Address, list[str]] = field(default_factory=dict)
    too_late: list[str] = field(default_factory=list)
    no_holder: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    deferred: list[str] = field(default_factory=list)


class Reassert:
    """One round of WORKING for the orphans of ``held``, asking the nodes
    of ``order`` in turn (module docstring)::

        plan = router.reassert(now)
        while (batch := plan.next_batch()) is not None:
            address, commands = batch
            plan.feed(address, pipelined(address, commands))  # or unreachable(address)
        result = router.reasserted(plan)
    """

    def __init__(self, held: HeldJobs, order: Sequence[Address]) -> None:
        self.held = held
        self.pending: list[str] = held.orphans()
        self._nodes = deque(a for a in order if not held.is_gone(a))
        while len(self._nodes) > MAX_NODES:
            self._nodes.pop()
        self._asked = 0  # nodes that answered
        self._unreached = 0  # nodes that could not be reached
        self.result = ReassertResult()

    def next_batch(self) -> tuple[Address, list[Command[int]]] | None:
        """The next node and the WORKINGs to send it; None when done."""
        if not self.pending or not self._nodes:
            return None
        return self._nodes.popleft(), [working(job_id) for job_id in self.pending]

    def feed(self, address: Address, responses: Sequence[Response[int]]) -> None:
        """The answers of ``address``, one per command of its batch. A
        connection that broke answers the rest ConnectionLostError: those
        jobs stay pending."""
        pending: list[str] = []
        broke = False
        for job_id, response in zip(self.pending, responses, strict=True):
            error = response.error
            if error is None:
                self.result.moved.setdefault(address, []).append(job_id)
            elif isinstance(error, NoJobError):
                pending.append(job_id)
            elif isinstance(error, TooLateError):
                self.result.too_late.append(job_id)
            elif isinstance(error, DisqueConnectionError):
                broke = True
                pending.append(job_id)
            else:
                self.result.failed[job_id] = _describe(error)
        self.pending = pending
        if broke:
            self._unreached += 1
        else:
            self._asked += 1

    def unreachable(self, address: Address) -> None:
        """No connection to ``address``: its batch was not sent."""
        self._unreached += 1

    def finish(self) -> ReassertResult:
        """Record the round in ``held``: the jobs moved, those given up,
        those left for the next round."""
        result = self.result
        for address, job_ids in result.moved.items():
            for job_id in job_ids:
                self.held.moved(job_id, address)
        for job_id in (*result.too_late, *result.failed):
            self.held.moved(job_id, None)
        for job_id in self.pending:
            if self._unreached == 0 and self._asked > 0:
                result.no_holder.append(job_id)
                self.held.moved(job_id, None)
            elif self.held.missed(job_id):
                result.deferred.append(job_id)
            else:
                result.no_holder.append(job_id)
        return result


def _describe(error: DisqueError) -> str:
    return f"{type(error).__name__}: {error}"

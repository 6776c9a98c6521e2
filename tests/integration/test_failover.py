"""A node lost, and the work goes on (issue 57), through real processes:
the jobs a killed node had queued are queued again by the survivors within
seconds of its FAIL, what it delivered is left to its consumer, a job
added on one node reaches a consumer waiting on another at once, and a
leaving node's jobs are delivered."""

from __future__ import annotations

import pytest

from .test_cluster_procs import client, start_cluster, wait_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("delay", [0, 1])
def test_a_retry_0_job_added_on_a_leaving_node_is_delivered_once(
    node_factory: object, delay: int
) -> None:
    """CLUSTER LEAVING yes on the first of two nodes, then ADDJOB RETRY 0
    REPLICATE 1 on it (with and without a DELAY): the ID was answered and
    the copy on the other node stayed active for ever."""
    a, b = start_cluster(node_factory, 2)
    assert client(a).execute_command("CLUSTER", "LEAVING", "yes") == "OK"
    args = ["RETRY", 0, "REPLICATE", 1] + (["DELAY", delay] if delay else [])
    job_id = client(a).execute_command("ADDJOB", "q", "hello", 0, *args)
    assert job_id.startswith("D-")
    got: list[list[str]] = []

    def delivered() -> bool:
        reply = client(b).execute_command("GETJOB", "NOHANG", "FROM", "q")
        got.extend(reply or [])
        return bool(got)

    wait_for(delivered, timeout=5 + delay, what="the job delivered by the other node")
    assert [entry[1] for entry in got] == [job_id]
    assert client(b).execute_command("GETJOB", "TIMEOUT", 1500, "FROM", "q") is None

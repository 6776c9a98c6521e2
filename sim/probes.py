"""The explorer's coverage probes (sim/explore.py), one per command and
admin path; sim/world.py counts them with its own (``PROBES``)."""

from __future__ import annotations

COMMAND_PROBES = (
    "cmd-addjob-every-option",
    "cmd-addjob-maxlen-refused",
    "cmd-getjob-nohang",
    "cmd-getjob-timeout",
    "cmd-getjob-count",
    "cmd-getjob-withcounters",
    "cmd-getjob-queues",  # GETJOB FROM a model queue and an empty one
    "cmd-several-ids",  # a job command given two IDs of a model queue
    "cmd-show-ttl-checked",  # SHOW's TTL left judged against the model
    "cmd-jscan-state",  # JSCAN STATE ... REPLY id on a model queue
    "cmd-qscan-len",  # QSCAN MINLEN/MAXLEN judged for a model queue
    "odd-malformed",  # a malformed command judged (odd-answered)
    "odd-read-checked",  # an operator's read judged (odd-read)
    "odd-resp3",  # a RESP3 connection read a queue's stats
    "odd-blocked-cut",  # a client went while blocked in GETJOB
    "admin-enqueue-once",  # a controlled restart with aof-enqueue-jobs-once yes judged
    "cmd-ackjob-delivering-node",
    "cmd-ackjob-other-node",
    "cmd-ackjob-stranger-node",
    "cmd-fastack-delivering-node",
    "cmd-fastack-other-node",
    "cmd-fastack-stranger-node",
    "cmd-nack",
    "cmd-working",
    "cmd-enqueue",
    "cmd-dequeue",
    "cmd-deljob",
    "cmd-show",
    "cmd-qlen",
    "cmd-qpeek",
    "cmd-qstat",
    "cmd-qscan",
    "cmd-jscan",
    "cmd-pause-in",
    "cmd-pause-out",
    "cmd-pause-all",
    "cmd-pause-none",
    "cmd-pause-bcast",
    "model-read-checked",
    "async-replication-checked",
    "admin-meet",
    "admin-forget",
    "admin-leaving",
    "leaving-refused-getjob",
    "leaving-served-queued",
    "admin-config-maxmemory",
    "admin-config-appendfsync",
    "admin-config-node-timeout",
    "admin-bgrewriteaof",
    "admin-auto-rewrite",
    "admin-flushall",
    "admin-shutdown-restart",
)

# NACK/ENQUEUE with DELAY and WAITJOB, counted by the workload (sim/workload.py)
# and the World's checks (sim/world.py); the node's own (POSTPONE's) are
# in sim/world.py's CORE_PROBES.
DELAY_WAIT_PROBES = (
    "nack-delay-sent",  # a NACK DELAY answered 1
    "enqueue-delay-sent",  # an ENQUEUE DELAY answered 1
    "retry0-delay-refused",  # NACK/ENQUEUE DELAY of a delivered RETRY 0 job refused
    "aof-reload-kept-delay",  # a restart reloaded a job within its client's delay (checked)
    "waitjob-acked",
    "waitjob-gone",
    "waitjob-unknown",
    "waitjob-pending",
)

# What users observe (sim/observing.py, issue #45), counted by the workload,
# the explorer and the checks themselves.
OBSERVE_PROBES = (
    "retry0-requeue-refused",  # NACK/ENQUEUE (no DELAY) of a delivered RETRY 0 job refused
    "rewrite-checked",  # an AOF rewrite compared with the file it replaced
    "pause-bcast-checked",  # a PAUSE BCAST's flags looked at on every reachable node
    "leaving-known-checked",  # a node's LEAVING looked at on every other node
    "leaving-repljob-sent",  # a job for every node added as one starts leaving
)
# The BUGGIFY knobs' own (sim/buggify.py): they acted in the run.
BUGGIFY_PROBES = ("crash-after-ack", "slow-yourjobs", "rewrite-often")

# Fail-over and cross-node delivery (issue 57), counted by the workload and
# the World's checks; the node's own ("failover-taken", "failover-standby")
# are in sim/world.py's CORE_PROBES.
FAILOVER_PROBES = (
    "failover-timely-checked",  # a cut-off node's queued job judged at its fail-over deadline
    "failover-restart-checked",  # ... a crashed node restarted before FAIL (a new incarnation)
    "failover-once-checked",  # ... queued on two holders at once after a FAIL (a violation)
    "delivery-told-checked",  # a delivery's other holder looked at (delivery-told)
    "hold-moved",  # a consumer holding a job moved its WORKING to another node
    "federation-prompt-checked",  # a job queued away from a waiting consumer judged
    "leaving-added-checked",  # a job added on a leaving node itself judged (delivered in time)
)

# The disk's faults (issue 58), counted by the fault runner and the World.
DISK_PROBES = (
    "disk-full",  # a node's disk refused writes for a while (ENOSPC)
    "disk-error",  # a node's fsyncs failed for a while (EIO; its writes in limbo)
    "disk-answer-checked",  # a write command's answer from a node whose disk failed, judged
    "disk-misconf",  # a node refused a write command with -MISCONF
    "slow-fsync",  # a node's process stalled in a slow fsync
)

# Mixed releases (issue 58): a node playing an older bus protocol.
MIXED_PROBES = (
    "old-release",  # a run with a node speaking protocol 3 to 7
    "upgrade",  # that node restarted as this release mid-run
    "version-gated-checked",  # a heartbeat in a mixed cluster judged (version-gated)
)

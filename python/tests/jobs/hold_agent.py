"""Local rank 0 of a one-rank job on one host (as torchrun starts it): attaches, which starts the host's agent,
prints `agent <pid>` and waits to be killed (run by test_ranks.py, which kills it and watches the agent go)."""

import os
import sys
import time

from agent_pid import agent_pid

import vfabric

client = vfabric.connect()
assert client.hosts_agent
region = client.alloc(1 << 20)  # the agent holds something of this rank's
print(f"agent {agent_pid(os.environ['VFABRIC_SOCKET'])}", flush=True)
sys.stdin.read()  # until the test kills this process

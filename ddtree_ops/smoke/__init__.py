"""Scheduled smoke checks that behave like monitoring plugins, one file per concern.

    parse.py     what the server answered (/generate, /server_info, /metrics, the unit header) -> values
    observe.py   reading one host (the only part that talks to it, and it only reads)
    judge.py     observations + the profile's thresholds -> a Nagios state, reasons, perfdata (pure)
    nagios.py    the status line with perfdata, the long output, the JSON document
    textfile.py  node_exporter textfile through prometheus_client (registry + write_to_textfile)
    ping.py      the dead-man ping (/start, then /<exit code>)
    state.py     the no-overlap run lock and the state kept between runs (NRestarts, golden outputs)
    runner.py    one run end to end: targets, hosts in parallel, then state, textfile and pings

The names below are the package's API (the CLI, the scheduler and the tests use them).
"""

from __future__ import annotations

from ddtree_ops.smoke.judge import SEVERITY, Check, HostResult, Perf, judge, worst
from ddtree_ops.smoke.nagios import PLUGIN, detail_lines, status_line, to_json
from ddtree_ops.smoke.observe import Golden, HttpProbe, Observation, Previous, observe_host
from ddtree_ops.smoke.parse import (ALGORITHM_MODES, Generation, accept_length, parse_generate,
                                    parse_metrics_accept, parse_server_info, parse_unit_header)
from ddtree_ops.smoke.ping import Pinger
from ddtree_ops.smoke.runner import Connect, RunOutcome, Target, check_host, check_hosts, load_targets, run
from ddtree_ops.smoke.state import (LOCK_PATH, RunLock, StateStore, default_lock_path, default_state_dir,
                                    write_atomic)
from ddtree_ops.smoke.textfile import Sample, read_prom, render_prom, write_prom

__all__ = [
    "ALGORITHM_MODES", "LOCK_PATH", "PLUGIN", "SEVERITY", "Check", "Connect", "Generation", "Golden", "HostResult",
    "HttpProbe", "Observation", "Perf", "Pinger", "Previous", "RunLock", "RunOutcome", "Sample", "StateStore",
    "Target", "accept_length", "check_host", "check_hosts", "default_lock_path", "default_state_dir",
    "detail_lines", "judge", "load_targets", "observe_host", "parse_generate", "parse_metrics_accept",
    "parse_server_info", "parse_unit_header", "read_prom", "render_prom", "run", "status_line", "to_json",
    "worst", "write_atomic", "write_prom",
]

#!/bin/bash
# Sandbox plugin benchmark: the tag round trip between two workers (PING from worker 0 to
# worker 1, PONG back, each step started by the host), beside ucx_perftest's tag_lat with the
# same UCX_TLS (tcp over lo), in alternating rounds (ROUNDS, default 3), each round with its
# own baseline; prints every round and the medians, with the ratio ours/ucx: the round trip
# timed by the host, and the same round trips timed inside the plugins (the workers' message
# timestamps, UROM_SANDBOX_TIMESTAMPS: the two worker-to-worker legs without the host).
# Needs libucx-dev (and ucx-utils for the baseline).
#
# Each run that ends well is appended to benches/results/sandbox.md (see benches/record.sh).
#
# usage: benches/run-sandbox-bench.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/record.sh
record_start sandbox "$@"
UROM_BENCH_ROUNDS=${1:-3} cargo bench -p urom-benches --features ucx --bench sandbox
record_finish '^sandbox tag round trip between two workers'

#!/bin/bash
# Message-rate benchmark: 64-byte commands through the whole path (host API -> worker -> graph
# plugin -> notification -> completion callback) beside our raw shared-memory stream, the
# same transport echoing bare frames, and `ucx_perftest ucp_am_bw` over UCX_TLS=posix, in
# alternating rounds, plus the round trip of a lone command against the floor of one cache line
# per direction.
#
# Runs `cargo bench -p urom-benches --bench rate -- ROUNDS` (default 12 rounds), which prints
# each round and then the medians of the per-round ratios:
#   (b)/(c): host-API loopback rate over ucx_perftest's (two pairs beside two host threads);
#   (b)/(a): host-API loopback rate over the raw stream's frame rate;
#   (b)/(e): host-API loopback rate over the bare echo's at the same depth;
#   (e)/(a): the bare echo over the raw stream, the most a loopback gets from the transport.
# `ucx_perftest` comes from Debian's ucx-utils; without it the UCX column is skipped.
# Compare numbers of one run only: the host may steal time from busy-polling vCPUs.
#
# Each run that ends well is appended to benches/results/rate.md (see benches/record.sh).
#
# usage: benches/run-rate-bench.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/record.sh
record_start rate "$@"
rounds=${1:-12}
cargo bench -p urom-benches --bench rate -- "$rounds"
record_finish '^message rate, 64-byte commands'

#!/bin/bash
# UCX transport benchmark: our 64-byte host -> worker -> graph plugin -> host round trip and
# pipelined loopback rate over UCX on TCP, beside ucx_perftest's ucp_am_lat and ucp_am_bw with
# the same UCX_TLS, in alternating rounds (ROUNDS, default 10); prints the medians of the
# per-round ratios. Over 127.0.0.1, and across two network namespaces when run as root.
# Needs libucx-dev (and ucx-utils for the baseline).
#
# Each run that ends well is appended to benches/results/ucx.md (see benches/record.sh).
#
# usage: benches/run-ucx-bench.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/record.sh
record_start ucx "$@"
UROM_BENCH_ROUNDS=${1:-10} cargo bench -p urom-benches --features ucx --bench ucx
record_finish '^UCX over TCP, 64-byte messages'

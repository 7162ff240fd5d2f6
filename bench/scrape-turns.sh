#!/bin/bash
# The daemon's CPU per metrics scrape, for several builds in turns on one policy (the
# `thousand` bench's fixture held with `--hold SECONDS`, which prints the policy's path).
#
#   bench/scrape-turns.sh POLICY ROUNDS SCRAPES BIN...
#
# For each round and build: starts `BIN -c POLICY run --rescan-interval 1h --metrics
# 127.0.0.1:19793`, waits until it runs and answers, scrapes once (cold), waits 2 s, then
# prints the daemon's utime+stime per scrape over SCRAPES scrapes, and stops it.
set -u
policy=$1 rounds=$2 scrapes=$3
shift 3
addr=127.0.0.1:19793
log=$(mktemp /tmp/dbcage-test-scrape-turns.XXXXXX)
trap 'rm -f "$log"' EXIT
tick=$(getconf CLK_TCK)
cpu_ms() { awk -v t="$tick" '{print ($14 + $15) * 1000 / t}' "/proc/$1/stat"; }
for round in $(seq "$rounds"); do
    for bin in "$@"; do
        "$bin" -c "$policy" run --rescan-interval 1h --metrics "$addr" >"$log" 2>&1 &
        pid=$!
        waited=0
        until grep -q "dbcage running" "$log"; do
            sleep 0.1
            waited=$((waited + 1))
            if [ $waited -gt 600 ] || ! kill -0 $pid 2>/dev/null; then
                echo "$bin did not start:" >&2
                cat "$log" >&2
                kill $pid 2>/dev/null
                exit 1
            fi
        done
        until curl -s -o /dev/null "http://$addr/metrics"; do sleep 0.1; done
        sleep 2
        c0=$(cpu_ms $pid)
        t0=$(date +%s%N)
        for _ in $(seq "$scrapes"); do curl -s -o /dev/null "http://$addr/metrics"; done
        c1=$(cpu_ms $pid)
        t1=$(date +%s%N)
        awk -v b="$bin" -v r="$round" -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" -v n="$scrapes" \
            'BEGIN { printf "round %d %s: %.1f ms CPU per scrape, %.1f ms wall\n", r, b, (c1 - c0) / n, (t1 - t0) / 1e6 / n }'
        kill $pid
        wait $pid 2>/dev/null
    done
done

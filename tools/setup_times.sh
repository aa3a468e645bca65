#!/bin/bash
# README set-up times from empty caches (pip, kernels, adapter, registry), install included.
set -e
cd "${1:?usage: tools/setup_times.sh FRESH_CLONE_DIR}"
export XDG_CACHE_HOME="$PWD/.setup-cache" XDG_DATA_HOME="$PWD/.setup-data"
unset NUMBA_CACHE_DIR PYTHONPATH TORCHFL_DEVICES
rm -rf "$XDG_CACHE_HOME" "$XDG_DATA_HOME" .venv
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
s=$(date +%s.%N); make venv >"$PWD/setup_venv.log" 2>&1; e=$(date +%s.%N); echo "install $(echo "$e - $s" | bc) s load $(cut -d' ' -f1-3 /proc/loadavg)"
s=$(date +%s.%N); .venv/bin/torchfl kernels warmup >"$PWD/setup_warmup.log" 2>&1; e=$(date +%s.%N); echo "warmup $(echo "$e - $s" | bc) s load $(cut -d' ' -f1-3 /proc/loadavg)"
s=$(date +%s.%N); .venv/bin/torchfl demo >"$PWD/setup_demo.log" 2>&1; e=$(date +%s.%N); echo "demo $(echo "$e - $s" | bc) s load $(cut -d' ' -f1-3 /proc/loadavg)"
s=$(date +%s.%N); .venv/bin/torchfl demo --quick >"$PWD/setup_quick.log" 2>&1; e=$(date +%s.%N); echo "demo --quick (cached) $(echo "$e - $s" | bc) s load $(cut -d' ' -f1-3 /proc/loadavg)"

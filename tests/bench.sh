#!/usr/bin/env bash
# wsync benchmark: `make bench` (not part of make check).
#
# Builds, in a tmpfs (default /dev/shm), a checkpoint with the real Qwen3-30B-A3B layer
# shapes (LAYERS layers, default 2: about 3.6 GB), then times in the same run:
#   cp -r of the checkpoint (the baseline: the same bytes read and written),
#   wsync convert --target vllm at tp 1 and at tp 4,
#   wsync convert of the tp 4 rank files back to hf (read back),
#   wsync convert --target vllm-ascend in both formats, and back to hf,
#   wsync merge of the checkpoint sharded as FSDP2 x EP would save it,
# and prints throughput, the ratio to cp, and peak private memory (RssAnon, sampled) of
# each run.  Only ratios measured in one run mean anything on a shared machine.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${WSYNC_BUILD_DIR:-$top}
W="$build/wsync --conf-dir $top/conf.d --plugin-dir $build/plugins/.libs -q"
layers=${LAYERS:-2}
base=${BENCH_DIR:-/dev/shm}/wsync-bench.$$
trap 'rm -rf "$base"' EXIT
mkdir -p "$base"

now() { date +%s.%N; }
calc() { awk "BEGIN { print $* }"; }

# Runs "$@" and prints "SECONDS PEAK_RSS_ANON_KB", sampling /proc every 20 ms.
measure() {
  local start end peak=0 kb pid
  start=$(now)
  "$@" & pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for p in $pid $(pgrep -P "$pid" 2>/dev/null); do
      kb=$(awk '/^RssAnon:/{print $2}' /proc/"$p"/status 2>/dev/null || echo 0)
      [ "${kb:-0}" -gt "$peak" ] && peak=$kb
    done
    sleep 0.02
  done
  wait "$pid"
  end=$(now)
  echo "$(calc "$end - $start") $peak"
}

echo "building a Qwen3-30B-A3B-shaped checkpoint with $layers layers in $base ..."
$W synth --config "$top/configs/qwen3-30b-a3b.json" --layers "$layers" "$base/src"
bytes=$(du -sb "$base/src" | cut -f1)
gb=$(calc "$bytes / 1000000000")
printf 'checkpoint: %.2f GB in %s files\n' "$gb" "$(ls "$base/src" | wc -l)"

read -r t_cp m_cp < <(measure cp -r "$base/src" "$base/cp")
rm -rf "$base/cp"
printf '%-28s %7.2f s %7.2f GB/s  ratio 1.00  peak private %6d KiB\n' "cp -r" "$t_cp" \
  "$(calc "$gb / $t_cp")" "$m_cp"

run() {
  local label=$1; shift
  read -r t m < <(measure "$@")
  printf '%-28s %7.2f s %7.2f GB/s  ratio %.2f  peak private %6d KiB\n' "$label" "$t" \
    "$(calc "$gb / $t")" "$(calc "$t_cp / $t")" "$m"
}

run "convert --target vllm tp 1" $W convert "$base/src" "$base/tp1" --target vllm --tp 1
rm -rf "$base/tp1"
run "convert --target vllm tp 4" $W convert "$base/src" "$base/tp4" --target vllm --tp 4
run "convert tp 4 rank files -> hf" $W convert "$base/tp4" "$base/back" --target hf
$W verify "$base/src" "$base/back" >/dev/null && echo "round trip: bit-exact"
rm -rf "$base/tp4" "$base/back"

# vllm-ascend (plugin npu-ascend): the kernel format, routed experts transposed into the
# processed layout, or the sharded-state format, the loader layout.  Each output is
# removed before the next run, so that every run, like cp, has the source and one output
# in the tmpfs.
run "vllm-ascend kernel tp 1" $W convert "$base/src" "$base/asc" --target vllm-ascend \
  --format kernel --tp 1
rm -rf "$base/asc"
run "vllm-ascend sharded-state tp 1" $W convert "$base/src" "$base/asc" --target vllm-ascend \
  --format sharded-state --tp 1
rm -rf "$base/asc"
run "vllm-ascend kernel tp 4" $W convert "$base/src" "$base/asc" --target vllm-ascend \
  --format kernel --tp 4
run "vllm-ascend tp 4 -> hf" $W convert "$base/asc" "$base/back" --target hf
$W verify "$base/src" "$base/back" >/dev/null && echo "round trip (vllm-ascend): bit-exact"
rm -rf "$base/asc" "$base/back"

# merge: the same checkpoint as FSDP2 x EP saves it in DCP's safetensors mode (4 ranks:
# experts whole on their expert-parallel rank, everything else Shard(0)); the baseline
# is cp -r of those shard files
echo "sharding it as FSDP2 x EP (DCP format A, 4 ranks) ..."
python3 "$top/tests/make-dcp-fixtures.py" --shard-ep "$base"/src/model-00001-of-*.safetensors "$base/dcp"
read -r t_cp m_cp < <(measure cp -r "$base/dcp/a" "$base/cp")
rm -rf "$base/cp"
printf '%-28s %7.2f s %7.2f GB/s  ratio 1.00  peak private %6d KiB\n' "cp -r (shards)" "$t_cp" \
  "$(calc "$gb / $t_cp")" "$m_cp"
run "merge (FSDP2 x EP shards)" $W merge "$base/dcp/a" "$base/merged"
$W verify "$base/src" "$base/merged" >/dev/null && echo "merge: bit-exact"

# The session from Python (bench/session_bench.py): the checkpoint held as numpy arrays,
# pushed at tp 4 into rank files on the tmpfs, steady-state steps against numpy.copyto
# of the same bytes.  The shard and merge outputs are removed first (memory: the arrays
# and copyto's arrays are private, twice the checkpoint).
rm -rf "$base/dcp" "$base/merged"
py=${WSYNC_PYTHON:-python3}
if [ -f "$build/python/.libs/_wsync.so" ]; then
  PYTHONPATH="$top/python:$build/python/.libs${PYTHONPATH:+:$PYTHONPATH}" \
    WSYNC_BENCH_CONF_DIR="$top/conf.d" WSYNC_BENCH_PLUGIN_DIR="$build/plugins/.libs" \
    "$py" "$top/bench/session_bench.py" --tp 4 "$base/src" "$base/session"
else
  echo "session from Python: skipped (the Python module is not built: ./configure found no python3-dev)"
fi

# wsync sync over MPI (issue 13, when wsync-mpi was built): -np 4, tp 4, against a bare
# MPI_Bcast of the same checkpoint's bytes from process 0 to all four (bench/mpi-bcast),
# in buckets of the same size (256 MiB), in this run and with the same mpirun options.
# Prints the time ratio sync / broadcast (the bar: at most 1.00), the bytes each process
# received and each process's peak private memory.
if [ -x "$build/wsync-mpi" ] && [ -x "$build/bench/mpi-bcast" ] && command -v mpirun >/dev/null
then
  mpi="mpirun -q --oversubscribe --bind-to none --mca plm isolated -np 4"
  [ "$(id -u)" = 0 ] && mpi="$mpi --allow-run-as-root"
  # Runs "$@" (an mpirun) and prints "SECONDS", then "RANK PEAK_RSS_ANON_KB" per process
  # (the processes are mpirun's children; their rank is in their environment).  The
  # sampling forks nothing, so that it takes little of the CPU it measures.
  measure_mpi() {
    local start end pid p t k v rest
    local -a children more
    declare -A peak=() rank=()
    start=$(now)
    "$@" > "$base/mpi.out" & pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      children=()
      for t in /proc/"$pid"/task/*/children; do # any of mpirun's threads may fork them
        more=()
        read -r -a more < "$t" 2>/dev/null || true # (no newline at its end)
        children+=("${more[@]}")
      done
      for p in "${children[@]}"; do
        if [ -z "${rank[$p]:-}" ]; then
          rank[$p]=$( { tr '\0' '\n' < /proc/"$p"/environ; } 2>/dev/null |
                      sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
        fi
        [ -n "${rank[$p]}" ] || continue
        while read -r k v rest; do
          [ "$k" = RssAnon: ] && [ "$v" -gt "${peak[${rank[$p]}]:-0}" ] && peak[${rank[$p]}]=$v
        done < /proc/"$p"/status 2>/dev/null || true
      done
      sleep 0.05
    done
    wait "$pid"
    end=$(now)
    echo "$(calc "$end - $start")"
    for p in "${!peak[@]}"; do echo "$p ${peak[$p]}"; done | sort -n
  }
  files=$(ls "$base"/src/*.safetensors)
  bcast=$(measure_mpi $mpi "$build/bench/mpi-bcast" $((256 << 20)) $files)
  t_bcast=$(echo "$bcast" | head -n 1)
  printf '%-28s %7.2f s   (each process but 0 received %s bytes)\n' "bare MPI_Bcast, -np 4" \
    "$t_bcast" "$(grep -m1 -o 'process [1-9][0-9]* received [0-9]*' "$base/mpi.out" | \
                  awk '{print $4}')"
  echo "$bcast" | tail -n +2 | while read -r r kb; do
    printf '  process %s: peak private %6d KiB\n' "$r" "$kb"; done
  export WSYNC_LIBEXECDIR="$build"
  sync=$(measure_mpi $mpi "$build/wsync" --conf-dir "$top/conf.d" \
         --plugin-dir "$build/plugins/.libs" sync "$base/src" "$base/sync" --target vllm --tp 4 \
         --bucket-size 256M)
  t_sync=$(echo "$sync" | head -n 1)
  printf '%-28s %7.2f s   time ratio to the broadcast %.2f (bar: at most 1.00)\n' \
    "sync --target vllm tp 4" "$t_sync" "$(calc "$t_sync / $t_bcast")"
  echo "$sync" | tail -n +2 | while read -r r kb; do
    received=$(sed -n "s/^process $r on .* \([0-9]*\) received\$/\1/p" "$base/mpi.out")
    printf '  process %s: received %12s bytes, peak private %6d KiB\n' "$r" "$received" "$kb"
  done
  tail -n 1 "$base/mpi.out"
  rm -rf "$base/sync" "$base/mpi.out"
else
  echo "sync over MPI: skipped (wsync-mpi or bench/mpi-bcast not built, or no mpirun)"
fi

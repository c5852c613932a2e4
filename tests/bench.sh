#!/usr/bin/env bash
# wsync benchmark: `make bench` (not part of make check).
#
# Builds, in a tmpfs (default /dev/shm), a checkpoint with the real Qwen3-30B-A3B layer
# shapes (LAYERS layers, default 2: about 3.7 GB), split into files at a --part-size
# scaled from the default as the bytes are (see below), then times in the same run, each
# paired PAIRS times (default 5) with `cp -r` of the same bytes (the run's source):
#   wsync convert --target vllm at tp 1 and at tp 4,
#   wsync convert of the tp 4 rank files back to hf (read back),
#   wsync convert --target vllm-ascend in both formats, and back to hf,
#   wsync merge of the checkpoint sharded as FSDP2 x EP would save it,
# and the peers of bench/ (a numpy script and a torch script doing the same conversion,
# see their headers), PEER_RUNS times each (default 3), their median against wsync's
# median in this run, and the planner alone and a session's set-up on a header-only
# checkpoint of the whole model (their memory).
#
# For each run it prints the median over the pairs of wsync's time, of cp's, and of the
# ratio wsync / cp (each pair's ratio; the pairs alternate which goes first), wsync's
# median user and system CPU time, and its peak private memory (RssAnon) over the pairs,
# measured by bench/measure.py.  Only ratios measured in one run mean anything on a
# shared machine.  A run that needs more room than the tmpfs has left says so and is
# skipped (LAYERS=4 needs about 22 GB for the read-back and merge runs).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${WSYNC_BUILD_DIR:-$top}
W="$build/wsync --conf-dir $top/conf.d --plugin-dir $build/plugins/.libs -q"
layers=${LAYERS:-2}
pairs=${PAIRS:-5}
peer_runs=${PEER_RUNS:-3}
python=${PYTHON:-/usr/bin/python3}
base=${BENCH_DIR:-/dev/shm}/wsync-bench.$$
trap 'rm -rf "$base"' EXIT
mkdir -p "$base"

now() { date +%s.%N; }
calc() { awk "BEGIN { print $* }"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# "WALL USER SYS PEAK_KIB" of "$@"
measure() { "$python" "$top/bench/measure.py" "$@"; }
# bytes under a directory
bytes_of() { du -sb "$1" | cut -f1; }
# TRUE when the tmpfs has room for $1 more bytes (and a margin of 5%)
room_for() { [ "$(df -B1 --output=avail "$base" | tail -1)" -gt "$(awk "BEGIN { printf \"%d\", $1 * 1.05 }")" ]; }

# pair LABEL SRC DST WSYNC-ARGS...: PAIRS pairs of `cp -r SRC` and `wsync WSYNC-ARGS`
# (which writes DST); prints the run's line and leaves the last DST in place.  The
# median wsync time is left in $t_median.
pair() {
  local label=$1 src=$2 dst=$3 i out_w out_c
  shift 3
  local -a walls=() cps=() ratios=() users=() syss=() peaks=() cpcpu=()
  if ! room_for "$(bytes_of "$src")"; then
    printf '%-34s skipped: the tmpfs has not the room for another %s\n' "$label" \
      "$(numfmt --to=si "$(bytes_of "$src")")B"
    t_median=
    return
  fi
  for ((i = 0; i < pairs; i++)); do
    rm -rf "$dst" "$base/cp"
    if ((i % 2 == 1 && i < pairs - 1)); then # wsync first (not in the last pair: its DST stays)
      out_w=$(measure $W "$@")
      rm -rf "$dst"
      out_c=$(measure cp -r "$src" "$base/cp")
    else
      out_c=$(measure cp -r "$src" "$base/cp")
      rm -rf "$base/cp"
      out_w=$(measure $W "$@")
    fi
    rm -rf "$base/cp"
    read -r w wu ws wp <<<"$out_w"
    read -r c cu cs _ <<<"$out_c"
    walls+=("$w"); cps+=("$c"); users+=("$wu"); syss+=("$ws"); peaks+=("$wp")
    cpcpu+=("$(calc "$cu + $cs")")
    ratios+=("$(calc "$w / $c")")
  done
  t_median=$(printf '%s\n' "${walls[@]}" | median)
  printf '%-34s %8.2f %8.2f %6.2f %7.2f %7.2f %6.1f MiB %8.2f\n' "$label" "$t_median" \
    "$(printf '%s\n' "${cps[@]}" | median)" "$(printf '%s\n' "${ratios[@]}" | median)" \
    "$(printf '%s\n' "${users[@]}" | median)" "$(printf '%s\n' "${syss[@]}" | median)" \
    "$(calc "$(printf '%s\n' "${peaks[@]}" | sort -g | tail -1) / 1024")" \
    "$(printf '%s\n' "${cpcpu[@]}" | median)"
}

# peer LABEL SCRIPT MODULE PACKAGE PLAN SRC WSYNC-OUT WSYNC-SECONDS: PEER_RUNS runs of a
# peer of bench/ (its files checked tensor by tensor against wsync's after the first),
# and how much slower its median is than wsync's.  A peer's time is mostly faults on
# fresh memory (gigabytes of arrays, then of files), which this kind of machine serves
# at very different speeds from one run to the next: one run would be luck.
peer() {
  local label=$1 script=$2 module=$3 package=$4 plan=$5 src=$6 ref=$7 t_wsync=$8 f i
  local -a walls=() users=() syss=() peaks=()
  if ! "$python" -c "import $module" 2>/dev/null; then
    printf '%-34s skipped: %s has no %s (Debian: apt-get install %s)\n' "$label" "$python" \
      "$module" "$package"
    return
  fi
  if [ -z "$t_wsync" ] || ! room_for "$(bytes_of "$ref")"; then
    printf '%-34s skipped: the tmpfs has not the room for it\n' "$label"
    return
  fi
  for ((i = 0; i < peer_runs; i++)); do
    read -r w wu ws wp <<<"$(measure "$python" "$top/bench/$script" "$plan" "$src" "$base/peer")"
    walls+=("$w"); users+=("$wu"); syss+=("$ws"); peaks+=("$wp")
    if ((i == 0)); then
      for f in "$ref"/*.safetensors; do
        $W verify "$f" "$base/peer/$(basename "$f")" >/dev/null ||
          { echo "$label: its $(basename "$f") differs from wsync's" >&2; exit 1; }
      done
    fi
    rm -rf "$base/peer"
  done
  w=$(printf '%s\n' "${walls[@]}" | median)
  printf '%-34s %8.2f %8s %6s %7.2f %7.2f %6.1f MiB  wsync %.1fx faster (median of %d)\n' \
    "$label" "$w" "" "" "$(printf '%s\n' "${users[@]}" | median)" \
    "$(printf '%s\n' "${syss[@]}" | median)" \
    "$(calc "$(printf '%s\n' "${peaks[@]}" | sort -g | tail -1) / 1024")" \
    "$(calc "$w / $t_wsync")" "$peer_runs"
}

echo "building a Qwen3-30B-A3B-shaped checkpoint with $layers layers in $base ..."
$W synth --config "$top/configs/qwen3-30b-a3b.json" --layers "$layers" "$base/src"

# The checkpoint is $layers of the model's 48 layers.  At full size (61 GB), at the
# default --part-size (5G), every rank's output is several files (a tp 1 output about
# 12), and wsync writes different files at once.  It cannot speed up the writing of one
# file: a tmpfs write holds the file's inode lock while the kernel copies (mm/shmem.c,
# shmem_file_write_iter), so writes to one file run one at a time, wsync's as cp's.  To keep the full model's shape at this scale, the
# runs pass --part-size scaled as the bytes are ($part below, PART_SIZE to override):
# about as many files per rank as the full model has.  The first run is repeated at the
# default part size, where each rank is one file, to show the difference.
part=${PART_SIZE:-$("$python" - "$top/configs/qwen3-30b-a3b.json" "$base/src" <<'EOF'
import glob, json, os, re, struct, sys
full_layers = json.load(open(sys.argv[1]))["num_hidden_layers"]
in_layers, other, layers = 0, 0, set()
for path in glob.glob(os.path.join(sys.argv[2], "*.safetensors")):
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    for name, t in header.items():
        if name != "__metadata__":
            nbytes = t["data_offsets"][1] - t["data_offsets"][0]
            layer = re.search(r"\.layers\.(\d+)\.", name)
            in_layers += nbytes if layer else 0
            other += 0 if layer else nbytes
            layers.update([layer.group(1)] if layer else [])
full = other + in_layers / len(layers) * full_layers
print(int(5 * 2**30 * (other + in_layers) / full))
EOF
)}
# the checkpoint split the same way (the real one is 16 files of about 4 GB)
$W convert "$base/src" "$base/split" --target hf --part-size "$part"
rm -rf "$base/src" && mv "$base/split" "$base/src"
printf 'checkpoint: %.2f GB in %s safetensors files; runs at --part-size %s\n' \
  "$(calc "$(bytes_of "$base/src") / 1e9")" "$(ls "$base/src"/*.safetensors | wc -l)" \
  "$(numfmt --to=iec "$part")"
printf '%-34s %8s %8s %6s %7s %7s %10s %8s\n' "run (median of $pairs pairs)" "wsync s" \
  "cp -r s" "ratio" "user s" "sys s" "private" "cp cpu s"

pair "convert --target vllm tp 1, 5G" "$base/src" "$base/tp1" convert "$base/src" "$base/tp1" \
  --target vllm --tp 1
rm -rf "$base/tp1"
pair "convert --target vllm tp 1" "$base/src" "$base/tp1" convert "$base/src" "$base/tp1" \
  --target vllm --tp 1 --part-size "$part"
rm -rf "$base/tp1"
pair "convert --target vllm tp 4" "$base/src" "$base/tp4" convert "$base/src" "$base/tp4" \
  --target vllm --tp 4 --part-size "$part"
t_vllm4=$t_median
if [ -n "$t_vllm4" ]; then
  $W plan "$base/src" --target vllm --tp 4 --part-size "$part" --json >"$base/plan-vllm4.json"
  peer "numpy peer (vllm tp 4)" peer_numpy.py numpy python3-numpy "$base/plan-vllm4.json" \
    "$base/src" "$base/tp4" "$t_vllm4"
  peer "torch peer (vllm tp 4)" peer_torch.py torch python3-torch "$base/plan-vllm4.json" \
    "$base/src" "$base/tp4" "$t_vllm4"
  pair "tp 4 rank files -> hf" "$base/tp4" "$base/back" convert "$base/tp4" "$base/back" \
    --target hf --part-size "$part"
  [ -z "$t_median" ] || { $W verify "$base/src" "$base/back" >/dev/null && echo "round trip: bit-exact"; }
fi
rm -rf "$base/tp4" "$base/back"

# The planner's memory on the whole model: a header-only checkpoint with all 48 layers
# (bench/sparse_checkpoint.py; the data a hole), planned at tp 1 and tp 4.
"$python" "$top/bench/sparse_checkpoint.py" "$base/src" "$base/whole" \
  "$(sed -n 's/.*"num_hidden_layers": *\([0-9]*\).*/\1/p' "$top/configs/qwen3-30b-a3b.json")" >/dev/null
for tp in 1 4; do
  read -r w wu ws wp <<<"$(measure $W plan "$base/whole" --target vllm --tp "$tp" | tail -n 1)"
  printf '%-34s %8.2f %8s %6s %7.2f %7.2f %6.1f MiB\n' "plan, whole model (48 layers) tp $tp" \
    "$w" "" "" "$wu" "$ws" "$(calc "$wp / 1024")"
done
# ... and a session's (bench/session_setup.py: every tensor described, the session
# planned, no step), when the Python module is built
if [ -f "$build/python/.libs/_wsync.so" ]; then
  for tp in 1 4; do
    PYTHONPATH="$top/python:$build/python/.libs${PYTHONPATH:+:$PYTHONPATH}" \
      WSYNC_BENCH_CONF_DIR="$top/conf.d" WSYNC_BENCH_PLUGIN_DIR="$build/plugins/.libs" \
      "${WSYNC_PYTHON:-python3}" "$top/bench/session_setup.py" "$base/whole" "$tp" dir
  done
fi
rm -rf "$base/whole"

# vllm-ascend (plugin npu-ascend): the kernel format, routed experts transposed into the
# processed layout, or the sharded-state format, the loader layout.
pair "vllm-ascend kernel tp 1" "$base/src" "$base/asc" convert "$base/src" "$base/asc" \
  --target vllm-ascend --format kernel --tp 1 --part-size "$part"
rm -rf "$base/asc"
pair "vllm-ascend sharded-state tp 1" "$base/src" "$base/asc" convert "$base/src" "$base/asc" \
  --target vllm-ascend --format sharded-state --tp 1 --part-size "$part"
rm -rf "$base/asc"
pair "vllm-ascend kernel tp 4" "$base/src" "$base/asc" convert "$base/src" "$base/asc" \
  --target vllm-ascend --format kernel --tp 4 --part-size "$part"
t_asc4=$t_median
if [ -n "$t_asc4" ]; then
  $W plan "$base/src" --target vllm-ascend --format kernel --tp 4 --part-size "$part" --json >"$base/plan-asc4.json"
  peer "numpy peer (ascend kernel tp 4)" peer_numpy.py numpy python3-numpy \
    "$base/plan-asc4.json" "$base/src" "$base/asc" "$t_asc4"
  peer "torch peer (ascend kernel tp 4)" peer_torch.py torch python3-torch \
    "$base/plan-asc4.json" "$base/src" "$base/asc" "$t_asc4"
  pair "vllm-ascend tp 4 -> hf" "$base/asc" "$base/back" convert "$base/asc" "$base/back" \
    --target hf --part-size "$part"
  [ -z "$t_median" ] || { $W verify "$base/src" "$base/back" >/dev/null && echo "round trip (vllm-ascend): bit-exact"; }
fi
rm -rf "$base/asc" "$base/back"

# merge: the same checkpoint as FSDP2 x EP saves it in DCP's safetensors mode (4 ranks:
# experts whole on their expert-parallel rank, everything else Shard(0)); the baseline
# is cp -r of those shard files
if room_for "$(bytes_of "$base/src")"; then
  echo "sharding it as FSDP2 x EP (DCP format A, 4 ranks) ..."
  "$python" "$top/tests/make-dcp-fixtures.py" --shard-ep "$base"/src/model-*-of-*.safetensors \
    "$base/dcp"
  pair "merge (FSDP2 x EP shards)" "$base/dcp/a" "$base/merged" merge "$base/dcp/a" "$base/merged" \
    --part-size "$part"
  [ -z "$t_median" ] || { $W verify "$base/src" "$base/merged" >/dev/null && echo "merge: bit-exact"; }
  rm -rf "$base/dcp" "$base/merged"
else
  echo "merge (FSDP2 x EP shards): skipped: the tmpfs has not the room for the shards"
fi

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
        done 2>/dev/null < /proc/"$p"/status || true # (quiet first: it may have exited)
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

#!/usr/bin/env bash
# CPU scaling of kiln mdrun's domain decomposition: spc216.gro replicated NX x NY x NZ (default
# 3 x 3 x 4 = 23,328 atoms), nve.mdp's settings (rc 0.9 nm, PME, rigid water) for STEPS steps on 1,
# 2, ... ranks (RANKS, one pair-loop thread each), ns/day from md.log's Performance line, and the
# step-STEPS potential of every run against the one-rank run's. cpu_s: the CPU seconds of all ranks
# together (user + system, mpirun's included), which shows the work decomposition adds where a shared
# machine's wall time cannot show the speed-up. With several ranks each run is repeated for every PME
# decomposition in PME (default "slab replicated"; mdrun --pme-decomposition): pme_ms is md.log's wall
# time a PME call (the slowest rank), pme_bytes the bytes a call sent between ranks (all ranks).
# Usage: bash bench/md_dd_scaling.sh <build-dir> [steps]   (env: RANKS="1 2", PME, NX NY NZ, OUT)
set -euo pipefail
build=$1
steps=${2:-20}
ranks=${RANKS:-"1 2"}
pme_modes=${PME:-"slab replicated"}
nx=${NX:-3} ny=${NY:-3} nz=${NZ:-4}
out=${OUT:-/tmp/kiln_md_dd_scaling}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
python3 "$here/tests/md/replicate_spc216.py" /usr/share/gromacs/top/spc216.gro "$nx" "$ny" "$nz" "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "host: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-10s %-11s %10s %10s %10s %10s %12s %22s\n' ranks grid pme wall_s cpu_s ns/day pme_ms pme_bytes \
  "Potential (last step)"
for n in $ranks; do
  modes=$pme_modes
  [ "$n" = 1 ] && modes=one-rank
  for mode in $modes; do
    run="$out/np$n-$mode"
    flag=()
    [ "$mode" != one-rank ] && flag=(--pme-decomposition "$mode")
    /usr/bin/time -f '%U %S' -o "$run.time" mpirun --oversubscribe -np "$n" "$build/apps/kiln/kiln" mdrun -s "$out/conf.gro" -p "$out/topol.top" \
      -f "$here/tests/md/data/nve.mdp" --nsteps "$steps" --device cpu --nt 1 "${flag[@]}" -o "$run" > "$run.out" 2>&1
    grid=$(grep -o 'domain decomposition: [0-9]* x [0-9]* x [0-9]*' "$run/md.log" | head -1 | cut -d: -f2 | tr -d ' ' || true)
    wall=$(awk '/^ +Time:/ {print $3}' "$run/md.log")
    nsday=$(awk '/^Performance:/ {print $2}' "$run/md.log")
    pme_ms=$(grep -o '[0-9.]* ms a call' "$run/md.log" | cut -d' ' -f1)
    pme_bytes=$(grep -o '[0-9]* bytes a call' "$run/md.log" | cut -d' ' -f1 || true)
    pot=$(python3 -c "import json; print('%.6f' % json.load(open('$run/energy.json'))['frames'][-1]['Potential'])")
    cpu=$(awk '{printf "%.1f", $1 + $2}' "$run.time")
    printf '%-6s %-10s %-11s %10s %10s %10s %10s %12s %22s\n' "$n" "${grid:-1x1x1}" "$mode" "$wall" "$cpu" "$nsday" \
      "$pme_ms" "${pme_bytes:-0}" "$pot"
  done
done

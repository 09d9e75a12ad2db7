#!/usr/bin/env bash
# Issue 23's dynamics checks on the CPU: NVE energy drift per atom per ns and the water O-O RDF of
# kiln mdrun (CPU engine, double precision) against OpenMM 7.7's Reference platform (double) and,
# when a gmx is on PATH, GROMACS 2022 (gmx_d, double, when present), at the same settings, from
# the same equilibrated start: 216 SPC waters (spc216.gro, OPLS-AA), rc 0.9 nm, potential-shift,
# PME 0.12 nm (grid 16^3) order 5 (OpenMM's Reference PME order) at ewald-rtol 1e-5, SETTLE, dt 2 fs.
#   bench/md_nve_rdf.sh [BUILD_DIR] [NSTEPS]      (defaults: build 5000 = 10 ps; about 10 minutes
#                                                  on 2 cores, OpenMM's Reference platform the longest)
# Steps: kiln equilibrates at 300 K (v-rescale, 1000 steps); from its confout.gro (positions and
# velocities) each engine runs NSTEPS of NVE with energies every 10 steps (kiln in one run; GROMACS
# has no Conserved En. without coupling: its Total Energy) and
# frames every 250 steps (kiln: the same NVE as a chain of runs continued from checkpoints, below).
# Table: bench/md_nve_rdf_table.py. OPENMM=0 leaves OpenMM out (a longer RDF run of kiln and GROMACS).
# Environment: WORK (/tmp/kiln_md_nve_rdf), GMX (gmx_d, else gmx, else none), SEED (1993: the
# equilibration's gen-seed and ld-seed, i.e. the start).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
NSTEPS=${2:-5000}
FRAME=250
KILN=$(realpath "$BUILD/apps/kiln/kiln")
W=${WORK:-/tmp/kiln_md_nve_rdf}
TOP_DIR=/usr/share/gromacs/top
GMX=${GMX:-$(command -v gmx_d || command -v gmx || true)}
rm -rf "$W" && mkdir -p "$W"
cp tests/md/data/topol.top "$W/topol.top"
mdp() {  # $1 file, then extra lines
  local f=$1; shift
  { printf '%s\n' "integrator = md" "dt = 0.002" "cutoff-scheme = Verlet" "nstlist = 10" "rcoulomb = 0.9" \
      "rvdw = 0.9" "coulombtype = PME" "vdw-modifier = Potential-shift" "fourierspacing = 0.12" "pme-order = 5" \
      "ewald-rtol = 1e-5" "nstcomm = 100"; printf '%s\n' "$@"; } > "$f"
}
mdp "$W/eq.mdp" "nsteps = 1000" "tcoupl = v-rescale" "tc-grps = System" "tau-t = 0.1" "ref-t = 300" \
  "gen-vel = yes" "gen-temp = 300" "gen-seed = ${SEED:-1993}" "ld-seed = ${SEED:-1993}" "nstenergy = 1000"
mdp "$W/nve.mdp" "nsteps = $NSTEPS" "tcoupl = no" "gen-vel = no" "continuation = no" "nstenergy = 10"
mdp "$W/chain.mdp" "nsteps = $NSTEPS" "tcoupl = no" "gen-vel = no" "continuation = no" "nstenergy = $FRAME"
"$KILN" mdrun -s $TOP_DIR/spc216.gro -p "$W/topol.top" -f "$W/eq.mdp" -o "$W/eq" --device cpu --nt 1 > "$W/eq.out"
start=$W/eq/confout.gro
atoms=$(sed -n 2p "$start" | tr -d ' ')
grid=$(grep -oE 'grid [0-9]+x[0-9]+x[0-9]+' "$W/eq/md.log" | head -1 | sed 's/grid //; s/x/ /g')

# OpenMM on one core while kiln and GROMACS take the other.
openmm_pid=
if [ "${OPENMM:-1}" != 0 ]; then
  /usr/bin/python3 bench/md_nve_rdf_openmm.py --gro "$start" --top "$W/topol.top" --include-dir $TOP_DIR --cutoff 0.9 \
    --grid $grid --steps "$NSTEPS" --frames-every $FRAME --energies "$W/openmm_energy.json" \
    --frames "$W/openmm_frames.gro" > "$W/openmm.out" 2>&1 &
  openmm_pid=$!
fi

t0=$(date +%s)
"$KILN" mdrun -s "$start" -p "$W/topol.top" -f "$W/nve.mdp" -o "$W/kiln_nve" --device cpu --nt 1 > "$W/kiln_nve.out"
echo "kiln NVE: $NSTEPS steps in $(( $(date +%s) - t0 )) s; $(grep -o 'pair list: .*' "$W/kiln_nve/md.log")"
# The frames as .gro (what the table reads, at confout.gro's 0.001 nm): a chain of runs continued bit
# for bit from checkpoints (--cpi; run k ends at step k FRAME, its frame, with a checkpoint there that
# the next run continues from). nstxout-compressed would give the same frames at the same 0.001 nm
# in one run's traj.xtc; the chain stays for now because the table reads .gro and converting the
# xtc needs gmx trjconv, which may be absent.
cp "$start" "$W/kiln_frames.gro"
resume=()
for k in $(seq 1 $((NSTEPS / FRAME))); do
  "$KILN" mdrun -s "$start" -p "$W/topol.top" -f "$W/chain.mdp" -o "$W/chain$k" --device cpu --nt 1 \
    --nsteps $((k * FRAME)) --cpt-steps $FRAME "${resume[@]}" > "$W/chain.out"
  cat "$W/chain$k/confout.gro" >> "$W/kiln_frames.gro"
  resume=(--cpi "$W/chain$k/state.cpt")
  if [ $k -gt 1 ]; then rm -rf "$W/chain$((k - 1))"; fi
done

energies=("kiln (CPU, double)=$W/kiln_nve/energy.json")
frames=("kiln (CPU, double)=$W/kiln_frames.gro")
if [ -n "$GMX" ]; then
  name="GROMACS $($GMX --version 2>/dev/null | sed -n 's/^GROMACS version: *//p' | cut -d- -f1) ($(basename "$GMX"))"
  mdp "$W/gmx.mdp" "nsteps = $NSTEPS" "tcoupl = no" "gen-vel = no" "continuation = no" "nstenergy = 10" \
    "nstcalcenergy = 10" "nstxout = $FRAME" "verlet-buffer-tolerance = -1" "rlist = 0.9"
  # In NVE from given velocities grompp sizes the Verlet buffer for 0 K (buffer 0): list every step
  # instead, with rlist = rc, so that GROMACS's pair list is exact like kiln's and OpenMM's.
  sed -i 's/^nstlist = 10$/nstlist = 1/' "$W/gmx.mdp"
  (cd "$W" && GMX_MAXBACKUP=-1 $GMX grompp -f gmx.mdp -c "$start" -p topol.top -o gmx.tpr > gmx_grompp.out 2>&1 &&
     GMX_MAXBACKUP=-1 $GMX mdrun -s gmx.tpr -deffnm gmx -nt 1 > gmx_mdrun.out 2>&1 &&
     echo Total-Energy | $GMX energy -f gmx.edr -o gmx_total.xvg > gmx_energy.out 2>&1 &&
     echo 0 | $GMX trjconv -f gmx.trr -s gmx.tpr -o gmx_frames.gro > gmx_trjconv.out 2>&1) ||
    { echo "GROMACS failed: see $W/gmx_*.out"; GMX=; }
  if [ -n "$GMX" ]; then
    echo "$name: pair list $(grep -m1 -oE 'updated every [0-9]+ steps, buffer [0-9.]+ nm, rlist [0-9.]+ nm' "$W/gmx.log")"
    energies+=("$name=$W/gmx_total.xvg")
    frames+=("$name=$W/gmx_frames.gro")
  fi
fi
if [ -n "$openmm_pid" ]; then
  wait $openmm_pid || { echo "OpenMM failed:"; tail -5 "$W/openmm.out"; exit 1; }
  cat "$W/openmm.out"
  energies+=("OpenMM 7.7 Reference=$W/openmm_energy.json")
  frames+=("OpenMM 7.7 Reference=$W/openmm_frames.gro")
fi
echo
/usr/bin/python3 bench/md_nve_rdf_table.py --atoms "$atoms" --energies "${energies[@]}" --frames "${frames[@]}" \
  | tee "$W/table.txt"

#!/usr/bin/env bash
# Checks the GPT-2 124M peer scripts without a GPU or the peers' sources:
# - bench/llmc_peer.sh against a stand-in llm.c tree whose "nvcc" makes a program printing llm.c's
#   step lines: the token files' header and size, the arguments it passes, the median it reports;
# - bench/megatron_peer.sh: its flag set, and a clear error (JSON, exit 1) without the snapshot;
# - bench/gpt_peers_table.py: ratios from Kiln's and the peers' files, rows for peers that did not run.
#   bash tests/bench/gpt_peers_scripts.sh <source dir>
set -euo pipefail
SRC=${1:?source dir}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# --- llm.c: a stand-in tree (Makefile target and "nvcc" as llm.c's build would call them)
mkdir -p "$T/llmc" "$T/bin"
echo "// stand-in" > "$T/llmc/train_gpt2.cu"
echo "0123456789abcdef0123456789abcdef01234567" > "$T/llmc/COMMIT"
printf 'train_gpt2cu: train_gpt2.cu\n\t$(NVCC) $(NVCC_INCLUDES) $< -o $@\n' > "$T/llmc/Makefile"
cat > "$T/bin/nvcc" <<'NV'
#!/bin/bash
out=""; while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out=$2; shift; done
cat > "$out" <<'PROG'
#!/bin/bash
echo "args: $*"
for i in $(seq 1 60); do ms=$(( i <= 10 ? 90 : 40 + i % 3 ))
  # llm.c's MFU is negative on a GPU missing from its table (the H200)
  printf "step %4d/60 | loss 10.9 (+0.00z)| norm 1.0 (+0.00z)| lr 6.00e-04 | %d.50 ms | -4.1%% bf16 MFU | 1 tok/s\n" $i $ms; done
PROG
chmod +x "$out"
NV
chmod +x "$T/bin/nvcc"
LLMC_DIR="$T/llmc" LLMC_DATA="$T/data" NVCC="$T/bin/nvcc" bash "$SRC/bench/llmc_peer.sh" "$T/out" > "$T/llmc.json" \
  2> "$T/llmc.err" || { cat "$T/llmc.err"; fail "llmc_peer.sh exited non-zero"; }
python3 - "$T" <<'PY' || fail "llmc_peer.sh output"
import json, struct, sys
t = sys.argv[1]
r = json.loads(open(f"{t}/llmc.json").read().strip().splitlines()[-1])
assert r["peer"] == "llm.c" and r["commit"].startswith("0123456789"), r
# steps 11-60 take 40.5, 41.5 or 42.5 ms (the stand-in's i % 3); their median is 41.5
assert abs(r["ms_per_step"] - 41.5) < 1e-9, r
assert abs(r["tokens_per_s"] - 16 * 1024 / 0.0415) < 1e-6, r
assert r["llmc_mfu_percent"] is None, r  # a negative MFU is llm.c not knowing the GPU's peak
for name, n in (("train", 1 << 21), ("val", 1 << 16)):
    d = open(f"{t}/data/syn_{name}.bin", "rb").read()
    assert struct.unpack("<3i", d[:12]) == (20240520, 1, n) and len(d) == 1024 + 2 * n, name
    ids = struct.unpack(f"<{n}H", d[1024:])
    assert max(ids) < 50257 and len(set(ids[:4096])) > 3000, name
log = open(f"{t}/out/llmc_peer.log").read()
for flag in ("-e d12", "-b 16", "-t 1024", "-d 16384", "-x 60", "-l 6e-4", "-u 10", "-q 0.1", "-c 0.1", "-s 0", "-r 0"):
    assert f" {flag} " in log, flag
print("llmc_peer.sh: ok")
PY
# a tree without train_gpt2.cu: an error line and exit 1
if LLMC_DIR="$T/none" bash "$SRC/bench/llmc_peer.sh" "$T/out" > "$T/err.json" 2> /dev/null; then fail "llmc_peer.sh without sources exited 0"; fi
grep -q '"error": "no .*train_gpt2.cu' "$T/err.json" || fail "llmc_peer.sh error line: $(cat "$T/err.json")"

# --- Megatron: the flags, and the error without the snapshot
args=$(bash "$SRC/bench/megatron_peer.sh" --print-args | tr '\n' ' ')
for flag in "--transformer-impl local" "--mock-data" "--tokenizer-type NullTokenizer" "--vocab-size 50257" \
  "--micro-batch-size 16" "--global-batch-size 16" "--seq-length 1024" "--hidden-size 768" "--num-layers 12" \
  "--num-attention-heads 12" "--bf16" "--adam-beta2 0.95" "--weight-decay 0.1" "--clip-grad 1.0" "--log-interval 10" \
  "--no-gradient-accumulation-fusion" "--eval-iters 0"; do
  [[ " $args" == *" $flag "* ]] || fail "megatron_peer.sh lacks $flag"
done
# the MoE layer stack of issue 19 (MEGATRON_SHAPE=moe-8x2-d2048): the same model flags as moepeers gives Kiln
args=$(MEGATRON_SHAPE=moe-8x2-d2048 bash "$SRC/bench/megatron_peer.sh" --print-args | tr '\n' ' ')
for flag in "--num-layers 8" "--hidden-size 2048" "--num-attention-heads 16" "--num-query-groups 4" "--swiglu" \
  "--num-experts 8" "--moe-router-topk 2" "--moe-ffn-hidden-size 4096" "--moe-aux-loss-coeff 1e-2" \
  "--micro-batch-size 4" "--seq-length 2048" "--vocab-size 32000" "--normalization RMSNorm" "--transformer-impl local"; do
  [[ " $args" == *" $flag "* ]] || fail "megatron_peer.sh (moe) lacks $flag"
done
if MEGATRON_SHAPE=nope bash "$SRC/bench/megatron_peer.sh" --print-args > /dev/null 2>&1; then
  fail "megatron_peer.sh took an unknown MEGATRON_SHAPE"; fi
# its PyTorch peer, on the CPU at the tiny shape where Debian's torch is installed (loop dispatch)
if /usr/bin/python3 -c 'import torch' 2> /dev/null; then
  /usr/bin/python3 "$SRC/bench/moe_torch_peer.py" --shape tiny --steps 2 --warmup 1 --dispatch loop,grouped > "$T/moe.jsonl" \
    || fail "moe_torch_peer.py (tiny) failed"
  /usr/bin/python3 - "$T/moe.jsonl" <<'PYMOE' || fail "moe_torch_peer.py output: $(cat "$T/moe.jsonl")"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
loop = next(r for r in rows if r["dispatch"] == "loop")
assert math.isfinite(loop["loss"]) and loop["tokens_per_s"] > 0, loop
grouped = next(r for r in rows if r["dispatch"] == "grouped")
assert "skipped" in grouped or math.isfinite(grouped["loss"]), grouped
PYMOE
else
  echo "moe_torch_peer.py not run: /usr/bin/python3 has no torch"
fi
# a stand-in pretrain_gpt.py that logs as Megatron does (and its dataset helper module, built already)
mkdir -p "$T/meg/megatron/core/datasets"
ext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
touch "$T/meg/megatron/core/datasets/helpers_cpp$ext"
echo "d98e8a64ddf34856e74b24714e3bedb2f5a39553" > "$T/meg/COMMIT"
cat > "$T/meg/pretrain_gpt.py" <<'PYMEG'
import os, sys
assert os.environ["WORLD_SIZE"] == "1" and os.environ["RANK"] == "0" and os.environ["MASTER_PORT"]
assert "--transformer-impl" in sys.argv
for i, ms in enumerate([900.0, 120.0, 81.0, 80.0, 79.0, 82.0], 1):
    print(f" [2026-12-03] iteration {10 * i:8d}/      60 | consumed samples: {160 * i:10d} | "
          f"elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): 100.0 | lm loss: 1.0E+01 |")
sys.exit(int(os.environ.get("STANDIN_EXIT", "0")))
PYMEG
check_meg() {  # $1 = the JSON file, $2 = the exit code the stand-in gave
  python3 - "$1" "$2" <<'PYCHK'
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
# windows 3-6: 81, 80, 79, 82 ms -> median 80.5
assert r["ms_per_step"] == 80.5 and r["exit_code"] == int(sys.argv[2]) and r["commit"].startswith("d98e8a64dd"), r
assert abs(r["tokens_per_s"] - 16 * 1024 / 0.0805) < 1e-6, r
PYCHK
}
for code in 0 3; do
  STANDIN_EXIT=$code PYTHON=python3 MEGATRON_DIR="$T/meg" bash "$SRC/bench/megatron_peer.sh" "$T/mout" > "$T/meg$code.json" \
    2> "$T/meg.err" || { cat "$T/meg.err"; fail "megatron_peer.sh with the stand-in (exit $code) exited non-zero"; }
  check_meg "$T/meg$code.json" $code || fail "megatron_peer.sh result (exit $code): $(cat "$T/meg$code.json")"
done
if MEGATRON_DIR="$T/none" bash "$SRC/bench/megatron_peer.sh" "$T/out" > "$T/merr.json" 2> /dev/null; then
  fail "megatron_peer.sh without the snapshot exited 0"; fi
grep -q '"error": "no .*pretrain_gpt.py' "$T/merr.json" || fail "megatron_peer.sh error line: $(cat "$T/merr.json")"

# --- the table: Kiln's windows (median after the first two), the peers' lines, a peer that failed
for i in 1 2 3 4 5 6; do
  ms=$([ $i -le 2 ] && echo 90.0 || echo "3$((i + 4)).0")
  echo " iteration $((i * 10))/60 | consumed samples: 1 | elapsed time per iteration (ms): $ms | lm loss: 1 |"
done > "$T/kiln.txt"
echo '{"peer": "pytorch", "torch": "2.11.0", "shape": "gpt2-124m", "variant": "eager", "step_s_median": 0.0775}' > "$T/torch.jsonl"
echo '{"peer": "megatron-core", "impl": "local", "error": "pretrain_gpt.py exited with 1"}' > "$T/meg.json"
python3 "$SRC/bench/gpt_peers_table.py" --kiln "$T/kiln.txt" --torch "$T/torch.jsonl" --llmc "$T/llmc.json" \
  --megatron "$T/meg.json" --json "$T/rows.json" > "$T/table.txt" || fail "gpt_peers_table.py exited non-zero"
cat "$T/table.txt"
# Kiln: windows 37, 38, 39, 40 ms -> median 38.5; PyTorch 77.5 ms -> 2.01x; llm.c 41.5 ms -> 1.08x
grep -q '^| Kiln .* | 38.5 | 425,558 | 1.00x |' "$T/table.txt" || fail "Kiln row"
grep -q '^| PyTorch 2.11.0 eager | 77.5 | 211,406 | 2.01x |' "$T/table.txt" || fail "PyTorch row"
grep -q '^| llm.c train_gpt2cu (0123456789) | 41.5 | 394,795 | 1.08x |' "$T/table.txt" || fail "llm.c row"
grep -q '^| Megatron-core .* did not run: pretrain_gpt.py exited with 1 |' "$T/table.txt" || fail "Megatron row"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert len(r)==4 and abs(r[0]['ms']-38.5)<1e-9" "$T/rows.json" \
  || fail "rows.json"
# without Kiln's log the table says so and exits 1
if python3 "$SRC/bench/gpt_peers_table.py" --kiln "$T/missing.txt" > "$T/t2.txt"; then fail "table without Kiln exited 0"; fi
grep -q 'did not run: no log' "$T/t2.txt" || fail "missing Kiln row"
echo "gpt peer scripts: all checks passed"

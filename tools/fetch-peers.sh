#!/usr/bin/env bash
# Exports the GPT-2 124M speed peers of issue 17 (karpathy/llm.c and NVIDIA/Megatron-LM) from their
# public snapshots into the git-ignored folder .peers/, which the device tool carries to the H200
# machine (`carry: [".devdeps", ".peers"]`) for `bash tools/gpu-session.sh peers`. The peers are run
# from there as they are; none of their code enters Kiln's tracked files.
#   bash tools/fetch-peers.sh        (on this machine, after the snapshots were fetched)
# Snapshots: bare git directories at $MIRROR/<owner>+<name>/repo (MIRROR defaults to /work/.mirror),
# which the session's fetch tool makes (fetch github:karpathy/llm.c, fetch github:NVIDIA/Megatron-LM).
# Exported: llm.c's whole tree at HEAD (1.5 MB); of Megatron-LM only what pretrain_gpt.py imports:
# megatron/, pretrain_gpt.py, gpt_builders.py, model_provider.py (about 13 MB), with the LICENSE files.
# The commit of each lands in .peers/COMMITS and in .peers/<peer>/COMMIT.
set -euo pipefail
cd "$(dirname "$0")/.."
MIRROR=${MIRROR:-/work/.mirror}
declare -A PATHS=(
  [karpathy+llm.c]="."
  [NVIDIA+Megatron-LM]="megatron pretrain_gpt.py gpt_builders.py model_provider.py LICENSE"
)
declare -A DEST=([karpathy+llm.c]=llm.c [NVIDIA+Megatron-LM]=Megatron-LM)
rm -rf .peers.tmp
mkdir -p .peers.tmp
for snap in karpathy+llm.c NVIDIA+Megatron-LM; do
  git_dir=$MIRROR/$snap/repo
  [ -d "$git_dir/.git" ] && git_dir=$git_dir/.git
  if ! git --git-dir="$git_dir" rev-parse --verify -q HEAD > /dev/null 2>&1; then
    echo "fetch-peers.sh: no snapshot of ${snap/+//} at $git_dir (fetch github:${snap/+//} first, or set MIRROR)" >&2
    exit 1
  fi
  commit=$(git --git-dir="$git_dir" rev-parse HEAD)
  date=$(git --git-dir="$git_dir" log -1 --format=%cs HEAD)
  dest=.peers.tmp/${DEST[$snap]}
  mkdir -p "$dest"
  # shellcheck disable=SC2086
  git --git-dir="$git_dir" archive --format=tar HEAD ${PATHS[$snap]} | tar -x -C "$dest"
  echo "$commit" > "$dest/COMMIT"
  echo "${snap/+//} $commit $date" >> .peers.tmp/COMMITS
done
rm -rf .peers
mv .peers.tmp .peers
cat .peers/COMMITS
du -sh .peers/llm.c .peers/Megatron-LM
du -sh .peers
[ -d .devdeps ] && du -sch .devdeps .peers | tail -1 | sed 's/total/with .devdeps (the device tool carries at most 64 MiB with the tracked files)/'

#!/usr/bin/env bash
# Queues one vramfuzz night on Slurm: builds once (here, on the submit host: nvcc must be on it,
# or set VRAMFUZZ to a binary built elsewhere and BUILD=0), then the job array and the merge job.
# From cron:  0 2 * * *  cd /path/to/vramfuzz && ci/slurm/submit.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

export SEED="${SEED:-$(date -u +%Y%m%d)}"
export OUT_ROOT="${OUT_ROOT:-$PWD/nightly/$SEED}"
export CAMPAIGN_TIME="${CAMPAIGN_TIME:-60m}"
export SHARDS="${SHARDS:-2}"
export VRAMFUZZ="${VRAMFUZZ:-$PWD/build/vramfuzz}"

if [ "${BUILD:-1}" = 1 ]; then
  ci/install-deps.sh
  cmake --preset default
  cmake --build --preset default -j "$(nproc)"
fi
mkdir -p "$OUT_ROOT"
tasks=$((4 * SHARDS - 1))
array=$(sbatch --parsable --array="0-$tasks" --export=ALL ci/slurm/nightly.sbatch)
merge=$(sbatch --parsable --dependency="afterany:$array" --export=ALL ci/slurm/merge.sbatch)
echo "seed $SEED: array job $array ($((tasks + 1)) tasks), merge job $merge; results in $OUT_ROOT/merged"

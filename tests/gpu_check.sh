#!/usr/bin/env bash
# The GPU check, one script (meant to take under 5 minutes on one H100/H200-class device):
#   1. tokens/s and MFU of the real training trial at the paper's s = 6, 10, 12 shapes, r = 1 and 4;
#   2. the tests marked `gpu` (bf16 + compile + fused AdamW + flash attention; CUDA vs CPU loss);
#   3. a 2-cell paper-shaped sweep (the paper's template and recipe, trained BPE; budgets shrunk) on CUDA,
#      end to end through the CLI.
# Without a CUDA device it fails at once with one line: there is nothing it could check.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False; torch $(python -c 'import torch; print(torch.__version__)')); run it on a GPU machine" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
start=$SECONDS

echo "== 1. throughput at the paper's shapes"
python tests/benchmarks/bench_gpu.py --shapes "${GPU_CHECK_SHAPES:-6:1,6:4,10:1,10:4,12:1,12:4}" --steps 9

echo "== 2. tests marked gpu"
python -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider

echo "== 3. a 2-cell paper-shaped sweep on CUDA"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/gpu-sweep.toml" <<TOML
name = "gpu-check"
objective = "train"
budgets = [2e15]
recurrences = [1, 4]
seq_len = 2048
batch_tokens = 262144
val_tokens = 65536
trials_per_cell = 1
sampler = "grid"
min_steps = 5
tracking_uri = "sqlite:///$work/mlflow.db"
storage = "$work/tune"
cache_dir = "$work/cache"

[template]
depth = 20
prelude = 2
coda = 2
width_unit = 64
head_dim = 128
vocab_size = 32064

[widths]
s_min = 4
s_max = 4

[data]
source = "kjv"
tokenizer = "bpe"

[recipe]
optimizer = "muonh"
micro_batch = 65536
log_every = 5

[resources]
cpus = 4
gpus = 1
retries = 0
TOML
loopscale plan "$work/gpu-sweep.toml"
loopscale search "$work/gpu-sweep.toml"
python - "$work" <<'PY'
import sys
import mlflow
runs = mlflow.search_runs(experiment_names=["gpu-check"], filter_string="tags.`loopscale.kind` = 'trial'",
                          tracking_uri=f"sqlite:///{sys.argv[1]}/mlflow.db")
cols = ["tags.cell", "tags.status", "metrics.val_loss", "metrics.tokens_per_s", "metrics.mfu", "metrics.wall_s"]
print(runs[cols].to_string(index=False))
assert len(runs) == 2 and (runs["tags.status"] == "ok").all(), "a trial of the GPU sweep did not finish ok"
PY
echo "gpu_check: done in $((SECONDS - start)) s"

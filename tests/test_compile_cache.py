"""torch.compile on CPU pays its warm-up once per shape per sweep: a second trial of the same shape, in a fresh
process, loads the compiled graphs from the compile cache in the sweep's cache_dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from loopscale.objectives.train import compile_cache_dir

# One tiny trial with compile_cpu on, in a process of its own; prints the compile caches' counters: hits of the
# FX graph cache or of the AOTAutograd cache (which serves forward and backward graphs whole), FX graph misses.
SCRIPT = """
import json, sys
from torch._dynamo.utils import counters
from loopscale.objectives import TrialConfig, train
cache = sys.argv[1]
template = dict(depth=4, prelude=1, coda=1, width_unit=16, head_dim=16, seq_len=64, vocab_size=256)
result = train(TrialConfig(budget_flops=2e9, s=1.0, r=2, template=template, batch_tokens=1024, seed=0,
                           data={"source": "kjv"}, cache_dir=cache, val_tokens=1024, num_threads=1,
                           recipe={"ref_batch": 1024, "compile_cpu": True, "log_every": 1000}))
print(json.dumps({"status": result["status"], "steps": result["steps"],
                  "hit": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"]}))
"""


def run_trial(cache: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(cache)], capture_output=True, text=True, timeout=1200,
                          env={k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_trial_of_the_same_shape_reuses_the_compiled_graphs(tmp_path):
    first = run_trial(tmp_path)
    assert first["status"] == "ok" and first["steps"] > 0
    assert first["miss"] > 0 and first["hit"] == 0  # compiled from scratch ...
    cached = Path(compile_cache_dir(SimpleNamespace(cache_dir=str(tmp_path))))  # the trials' TrialConfig field
    assert any(cached.rglob("*")), "nothing was written to the sweep's compile cache"
    second = run_trial(tmp_path)
    assert second["status"] == "ok"
    assert second["hit"] > 0 and second["miss"] == 0  # ... then every graph came from the cache

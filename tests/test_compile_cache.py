"""torch.compile on CPU pays its warm-up once per shape per machine: a process that runs trial after trial (a
reused Tune actor) keeps compiling them; a trial of the same shape in another sweep (another cache_dir), in a fresh
process, loads the compiled graphs from the user's compile cache; a trial of another r at the same width reuses
them too (the compiled unit is the block). One test: the first process's compiles fill the cache the others read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


# One tiny trial with compile_cpu on, in a process of its own; prints the compile caches' counters: hits of the
# FX graph cache or of the AOTAutograd cache (which serves forward and backward graphs whole), FX graph misses.
SCRIPT = """
import json, sys
from torch._dynamo.utils import counters
from loopscale.objectives import TrialConfig, train
cache, r = sys.argv[1], int(sys.argv[2])
template = dict(depth=4, prelude=1, coda=1, width_unit=16, head_dim=16, seq_len=64, vocab_size=256)
result = train(TrialConfig(budget_flops=2e9, s=1.0, r=r, template=template, batch_tokens=1024, seed=0,
                           data={"source": "kjv"}, cache_dir=cache, val_tokens=1024, num_threads=1,
                           recipe={"ref_batch": 1024, "compile_cpu": True, "log_every": 1000}))
print(json.dumps({"status": result["status"], "steps": result["steps"],
                  "hit": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"]}))
"""


# Trials of two widths in one process, with Dynamo's per-function graph limit lowered from 8 to 2 so that the
# second width meets it (a trial compiles two graphs, training and evaluation); prints the graphs each trial made
# and the compile caches' counters, as SCRIPT does.
SAME_PROCESS = """
import json, sys
import torch._dynamo
from torch._dynamo.utils import counters
from loopscale.objectives import TrialConfig, train
torch._dynamo.config.recompile_limit = 2
template = dict(depth=4, prelude=1, coda=1, width_unit=16, head_dim=16, seq_len=64, vocab_size=256)
graphs = []
for s in (1.0, 2.0):
    before = counters["stats"]["unique_graphs"]
    result = train(TrialConfig(budget_flops=4e9, s=s, r=2, template=template, batch_tokens=1024, seed=0,
                               data={"source": "kjv"}, cache_dir=sys.argv[1], val_tokens=1024, num_threads=1,
                               recipe={"ref_batch": 1024, "compile_cpu": True, "log_every": 1000}))
    assert result["status"] == "ok", result
    graphs.append(counters["stats"]["unique_graphs"] - before)
print(json.dumps({"graphs": graphs,
                  "hit": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"]}))
"""


def run_trial(home: Path, sweep_cache: Path, script: str = SCRIPT, r: int = 2) -> Any:
    """The script in a fresh process whose user cache folder is ``home`` (the machine's compile cache under it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
    done = subprocess.run([sys.executable, "-c", script, str(sweep_cache), str(r)], capture_output=True, text=True,
                          timeout=1200, env={**env, "XDG_CACHE_HOME": str(home)})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_trial_after_trial_keeps_compiling_and_another_sweep_reuses_the_compiled_graphs(tmp_path):
    """Dynamo falls back to eager, silently, once a function has recompile_limit graphs; without a reset per trial
    a reused actor's fifth width (here, with the limit at 2, its second) would train eager."""
    first = run_trial(tmp_path / "home", tmp_path / "sweep-1", SAME_PROCESS)
    assert all(graphs > 0 for graphs in first["graphs"])  # the second width compiled too
    assert first["miss"] > 0 and first["hit"] == 0  # compiled from scratch ...
    cached = tmp_path / "home" / "loopscale" / "inductor"
    assert any(cached.rglob("*")), "nothing was written to the machine's compile cache"
    assert not (tmp_path / "sweep-1" / "inductor").exists()
    second = run_trial(tmp_path / "home", tmp_path / "sweep-2")
    assert second["status"] == "ok" and second["steps"] > 0
    assert second["hit"] > 0 and second["miss"] == 0  # ... then every graph came from the cache
    other_r = run_trial(tmp_path / "home", tmp_path / "sweep-2", r=1)
    assert other_r["status"] == "ok" and other_r["hit"] > 0 and other_r["miss"] == 0  # the same blocks, looped more

"""The plug-in writes the per-layer trace of SPEC §8 in the schema the CLI's readers check:
`gradscale inspect --check` accepts it, for an MLP and for a transformer block (LayerNorm, attention,
a tied embedding: layers with parameters but no local scale)."""
import json
import os
import subprocess

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from gradscale.torch import Scaler

CLI = os.environ.get("GRADSCALE_CLI")


def _inspect(path):
    if not CLI:
        pytest.skip("GRADSCALE_CLI is not set (ctest sets it to the built gradscale binary)")
    return subprocess.run([CLI, "inspect", "--check", path], capture_output=True, text=True)


def test_an_mlp_trace_passes_inspect(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    base = str(tmp_path / "mlp")
    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16",
                    grad_format="fp8_e5m2", trace=base, trace_every=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    for step in range(12):
        opt.zero_grad()
        loss = F.cross_entropy(model(x * (1e6 if step == 7 else 1)), y)  # step 8 overflows: traced
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    assert os.path.exists(base + ".jsonl") and not os.path.exists(base + ".json")
    scaler.close(test_accuracy=0.5)
    doc = json.load(open(base + ".json"))
    steps = [s["step"] for s in doc["steps"]]
    assert 5 in steps and 10 in steps and 8 in steps, steps
    assert doc["summary"]["skipped"] == 1 and doc["summary"]["steps"] == 12
    assert [l["name"] for l in doc["header"]["layers"]] == ["0", "2"]
    # The header is the one gradscale train writes (the core's make_trace_header): the same keys, the
    # model named at the top, the scaler's configuration as the core holds it.
    header = doc["header"]
    data = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "trace_small.json")
    with open(data) as f:  # a trace gradscale train wrote
        assert sorted(header) == sorted(json.load(f)["header"])
    assert header["model"] == "Sequential" and header["config"]["writer"] == "gradscale.torch"
    assert (header["format"], header["grad_format"]) == ("fp16", "fp8_e5m2")
    assert header["scaler"] == json.loads(scaler._core.scaler_config())
    r = _inspect(base + ".json")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_transformer_trace_passes_inspect(tmp_path):
    from test_branches import Block
    torch.manual_seed(0)
    model = Block()
    base = str(tmp_path / "block")
    scaler = Scaler(model, scaler="torch", format="bf16", trace=base, trace_every=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = torch.randint(0, 13, (4, 6))
    for _ in range(4):
        opt.zero_grad()
        scaler.scale(F.cross_entropy(model(idx[:, :-1]).reshape(-1, 13), idx[:, 1:].reshape(-1))).backward()
        scaler.step(opt)
        scaler.update()
    scaler.close()
    r = _inspect(base + ".json")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_fp32_shadow_reaches_the_trace(tmp_path):
    """Scaler(shadow=True) with a trace: each traced step with statistics carries, per layer, the shadow's
    figures in the CLI's form, which `gradscale inspect --check` accepts."""
    import json
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    base = str(tmp_path / "shadow")
    scaler = Scaler(model, scaler="torch", format="fp16", grad_format="fp8_e5m2", trace=base, trace_every=1,
                    shadow=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    for _ in range(2):
        opt.zero_grad()
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
    scaler.close()
    steps = [json.loads(line) for line in open(base + ".jsonl") if '"type":"step"' in line.replace(" ", "")]
    shadows = [l["shadow"] for s in steps for l in s["layers"] if "shadow" in l]
    assert shadows and all(set(m) <= {"upstream", "weight"} for m in shadows)
    assert any(m["upstream"]["rel_error"] > 0 for m in shadows if "upstream" in m)  # e5m2 rounds
    r = _inspect(base + ".json")
    assert r.returncode == 0, r.stdout + r.stderr


def test_attention_under_local_scales_keeps_s_times_s_in_and_passes_inspect(tmp_path):
    """Attention is a layer whose output is out_proj's input (out_proj a layer of its own, called inside
    the attention's call): its record's S_in is the scale out_proj sends it, so S = s·S_in holds for it as
    for every layer (inspect --check refuses a trace where it does not), and so does its in-projection's
    weight gradient at r·S_in. Under local scales s != 1 (a global policy hides a wrong S_in)."""
    from test_branches import Block
    torch.manual_seed(0)
    model = Block(d=16, heads=4)
    base = str(tmp_path / "attn")
    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured", "init_scale": "auto",
                                   "cast_form": "measured", "bounds": "derived"},
                    format="fp16", grad_format="fp8_e4m3", trace=base, trace_every=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    local = set()
    for _ in range(5):
        idx = torch.randint(0, 13, (8, 7), generator=g)
        opt.zero_grad()
        scaler.scale(F.cross_entropy(model(idx[:, :-1]).reshape(-1, 13), idx[:, 1:].reshape(-1))).backward()
        scaler.step(opt)
        scaler.update()
        for row in scaler.layer_scales():
            if row["ran"]:
                assert row["S_out"] == row["s"] * row["S_in"], row
                if row["s"] != 1:
                    local.add(row["name"])
    assert {"attn", "attn.out_proj"} <= local, local  # both decided a scale of their own
    scaler.close()
    r = _inspect(base + ".json")
    assert r.returncode == 0, r.stdout + r.stderr

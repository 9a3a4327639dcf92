"""What the plug-in emulates: attention (its projections layers with scales, its output rounded), torch's
fused inference paths turned off, memory layouts kept, per-layer overrides, and a warning for a layer
whose parameters are used without calling it. Real architectures (torchvision's, random weights,
small inputs) give PyTorch's fp32 gradients bit for bit under power-of-two per-layer scales, in
train and eval mode, contiguous and channels_last."""
import copy
import re
import warnings

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from gradscale import _core
from gradscale.torch import Scaler

FIXED = {"policy": "adaptive", "method": "fixed", "fixed_scale": 4, "init_scale": 8,
         "scale_upper_bound": 16, "accum_upper_bound": 2 ** 40}


def representable(t, fmt):
    q = t.detach().clone().contiguous()
    _core.quantize_(q.data_ptr(), q.numel(), fmt)
    return torch.equal(q, t.detach().contiguous())


class Encoder(nn.Module):
    def __init__(self, batch_first=True):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(30, 16)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0,
                                                                    batch_first=batch_first), 2)
        self.head = nn.Linear(16, 5)
        self.batch_first = batch_first

    def forward(self, idx):
        h = self.emb(idx if self.batch_first else idx.t())
        h = self.enc(h)
        return self.head(h.mean(1 if self.batch_first else 0))


def tokens():
    g = torch.Generator().manual_seed(4)
    return torch.randint(0, 30, (3, 6), generator=g), torch.randint(0, 5, (3,), generator=g)


# ---- attention -----------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_first", [True, False])
def test_attention_is_emulated_and_exact(batch_first):
    model = Encoder(batch_first)
    ref = copy.deepcopy(model)
    idx, y = tokens()
    F.cross_entropy(ref(idx), y).backward()
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    scaler.scale(F.cross_entropy(model(idx), y)).backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p.grad, q.grad), n
    rows = {r["name"]: r for r in scaler.layer_scales()}
    attn, proj = rows["enc.layers.0.self_attn"], rows["enc.layers.0.self_attn.out_proj"]
    assert attn["emulation"] == "attention" and attn["ran"] and attn["sent"]
    # out_proj is a layer of its own: it sends its gradient up at its own scale, which the attention
    # receives (its output is out_proj's input), and its in-projection multiplies in its own.
    assert proj["emulation"] == "gemm" and proj["ran"] and proj["s"] == 4.0
    assert attn["S_in"] == proj["S_out"] == 4.0 * proj["S_in"] and attn["s"] == 4.0
    assert attn["S_out"] == attn["s"] * attn["S_in"]


def test_attention_output_and_projections_are_in_the_format():
    model = Encoder()
    Scaler(model, scaler="static:8", format="fp16")
    seen = []
    attn = model.enc.layers[0].self_attn
    attn.out_proj.register_forward_pre_hook(lambda m, i: seen.append(("out_proj input", i[0])))
    attn.register_forward_hook(lambda m, i, o: seen.append(("attention output", o[0])))
    idx, _ = tokens()
    model(idx)
    assert [name for name, _ in seen] == ["out_proj input", "attention output"]
    for name, t in seen:
        assert representable(t, "fp16"), name
        assert not representable(t, "fp8_e4m3"), name  # else the check could not fail


class _CountingCore:
    """The Scaler's core, with its join roundings counted by the site they are charged to."""

    def __init__(self, core):
        self._core = core
        self.joins = []

    def round_join(self, layer, *args, **kwargs):
        self.joins.append(layer)
        return self._core.round_join(layer, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._core, name)


def test_attention_internals_are_summed_in_fp32_not_joined():
    """Inside a layer call gradients are fp32 at the layer's one scale: self-attention's split of its
    packed projection into query, key and value is summed by autograd, not joined (a join rounds its
    sum to the gradient format, a rounding inside the layer before its one rounding at its input).
    A fork between layers (the residual shortcut) still is one."""
    class Net(nn.Module):
        def __init__(self, residual):
            super().__init__()
            torch.manual_seed(0)
            self.emb, self.attn = nn.Embedding(30, 16), nn.MultiheadAttention(16, 2, batch_first=True)
            self.head, self.residual = nn.Linear(16, 5), residual

        def forward(self, idx):
            h = self.emb(idx)
            a = self.attn(h, h, h, need_weights=False)[0]
            return self.head((h + a if self.residual else a).mean(1))

    idx, y = tokens()
    for residual, joins in ((False, 0), (True, 1)):
        model = Net(residual)
        scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16",
                        grad_format="fp8_e4m3")
        counting = _CountingCore(scaler._tracker.core)
        scaler._tracker.core = counting
        scaler.scale(F.cross_entropy(model(idx), y)).backward()
        assert len(counting.joins) == joins, (residual, counting.joins)


def test_fused_inference_paths_are_off_while_attached():
    model = Encoder().eval()
    scaler = Scaler(model, scaler="static:8", format="fp16")
    calls = []
    model.enc.layers[0].linear1.register_forward_hook(lambda m, i, o: calls.append("linear1"))
    model.enc.layers[0].self_attn.out_proj.register_forward_hook(lambda m, i, o: calls.append("out_proj"))
    idx, _ = tokens()
    with torch.no_grad():
        out = model(idx)
    assert calls == ["out_proj", "linear1"]  # the layers ran as modules (the fused path calls neither)
    assert representable(out, "fp16")
    scaler.remove()
    assert model.enc.layers[0].activation_relu_or_gelu  # the fast path's flag is back


def _products(out):
    """The matrix products on out's autograd graph, by node type."""
    found, seen, stack = {}, set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = type(node).__name__
        if "mm" in name.lower():
            found[name] = found.get(name, 0) + 1
        stack.extend(n for n, _ in node.next_functions)
    return found


@pytest.mark.parametrize("batch_first", [True, False])
def test_attention_makes_the_products_pytorch_makes_and_no_more(batch_first):
    # The attention's output reaches out_proj as it is: no product by an identity in its place.
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(16, 2, batch_first=batch_first)
    x = torch.randn(3, 5, 16, requires_grad=True)
    mask = torch.triu(torch.ones(5 if batch_first else 3, 5 if batch_first else 3, dtype=torch.bool), 1)
    plain = _products(attn(x, x, x, attn_mask=mask, need_weights=False)[0])
    Scaler(attn, scaler="static:8", format="fp16")
    assert _products(attn(x, x, x, attn_mask=mask, need_weights=False)[0]) == plain
    # The in-projection and out_proj at least; torch 1.13 adds the two attention products, which torch 2
    # computes inside one scaled_dot_product_attention node.
    assert sum(plain.values()) >= 2


def test_torchs_linear_is_back_after_an_attention_call():
    torch_linear = F.linear
    model = Encoder()
    Scaler(model, scaler="static:8", format="fp16")
    idx, _ = tokens()
    model(idx)
    assert F.linear is torch_linear
    attn = model.enc.layers[0].self_attn
    with pytest.raises(RuntimeError):
        attn(torch.randn(3, 6, 16), torch.randn(3, 6, 16), torch.randn(3, 6, 16), attn_mask=torch.ones(2, 2))
    assert F.linear is torch_linear


def test_attention_calls_in_threads_give_their_own_results():
    import threading
    torch_linear = F.linear
    models = [Encoder(), Encoder()]
    for m in models:
        Scaler(m, scaler="static:8", format="fp16")
    idx, _ = tokens()
    with torch.no_grad():
        alone = [m(idx) for m in models]
    results, errors = [[], []], []

    def work(i):
        try:
            with torch.no_grad():
                for _ in range(20):
                    results[i].append(models[i](idx))
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(2):
        assert all(torch.equal(r, alone[i]) for r in results[i])
    assert F.linear is torch_linear


# ---- memory layout -------------------------------------------------------------------------------
class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn(self.c1(x)))
        h = h + self.c2(h)
        return self.head(h.mean(dim=(2, 3)))


def test_channels_last_is_kept_at_every_boundary():
    model = Convs().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    y = torch.tensor([0, 3])
    ref = copy.deepcopy(model)
    F.cross_entropy(ref(x), y).backward()
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    layouts = []
    model.c2.register_forward_hook(lambda m, i, o: layouts.append(
        (i[0].is_contiguous(memory_format=torch.channels_last), o.is_contiguous(memory_format=torch.channels_last))))
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    assert layouts == [(True, True)]
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p.grad, q.grad), n
        assert p.grad.stride() == q.grad.stride(), n


# ---- per-layer overrides -------------------------------------------------------------------------
def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def test_overrides_by_name_pattern_and_type():
    model = mlp()
    x = torch.randn(8, 16)
    y = torch.randint(0, 4, (8,))
    ref = copy.deepcopy(model)
    F.cross_entropy(ref(x), y).backward()
    scaler = Scaler(model, scaler=FIXED, format="fp32",
                    overrides={nn.Linear: {"fixed_scale": 2}, "4": "global", "[0-2]": 8})
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    rows = {r["name"]: r for r in scaler.layer_scales()}
    # "4" (the head) stays at the global scale: it sends S0 = 8 on; "2" takes 8 (the later entry wins).
    assert [(rows[n]["s"], rows[n]["S_in"]) for n in ("4", "2")] == [(1.0, 8.0), (8.0, 8.0)]
    assert rows["4"]["override"] == "global"
    assert rows["2"]["override"] == {"fixed_scale": 8.0, "method": "fixed"}
    assert rows["0"]["S_in"] == 64.0
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)
    assert json_layers(scaler) == {"0": {"fixed_scale": 8.0, "method": "fixed"},
                                   "2": {"fixed_scale": 8.0, "method": "fixed"}, "4": "global"}


def json_layers(scaler):
    import json
    return json.loads(scaler._core.scaler_config())["layers"]


def test_an_override_with_its_own_n_uf_decides_otherwise():
    model = mlp()
    x = torch.randn(64, 16) * 1e-3
    y = torch.randint(0, 4, (64,))
    chosen = []
    for overrides in (None, {"2": {"n_uf": 0.2, "scale_upper_bound": 2 ** 20, "accum_upper_bound": 2 ** 40}}):
        m = copy.deepcopy(model)
        scaler = Scaler(m, scaler={"policy": "adaptive", "method": "measured", "scale_upper_bound": 2 ** 20,
                                   "accum_upper_bound": 2 ** 40}, format="fp16", grad_format="fp8_e5m2",
                        overrides=overrides)
        scaler.scale(F.cross_entropy(m(x), y)).backward()
        chosen.append({r["name"]: r["unbound"] for r in scaler.layer_scales()})
    assert chosen[0]["2"] > chosen[1]["2"]  # a looser target: a smaller scale
    assert chosen[0]["4"] == chosen[1]["4"]


def test_overrides_are_refused_when_wrong():
    with pytest.raises(ValueError, match="matches no layer"):
        Scaler(mlp(), scaler=FIXED, overrides={"fc9": "global"})
    with pytest.raises(ValueError, match="needs the adaptive policy"):
        Scaler(mlp(), scaler="torch", overrides={"0": "global"})
    with pytest.raises(ValueError, match="init_scale"):
        Scaler(mlp(), scaler=FIXED, overrides={"0": {"init_scale": 4}})
    with pytest.raises(TypeError, match="overrides"):
        Scaler(mlp(), scaler=FIXED, overrides={"0": [1]})


@pytest.mark.parametrize("value,error,words", [
    (float("nan"), ValueError, "finite float32"),
    (float("inf"), ValueError, "finite float32"),
    (-float("inf"), ValueError, "finite float32"),
    (10 ** 400, ValueError, "finite float32"),  # float() of it raised OverflowError
    ({"n_uf": float("nan")}, ValueError, "numbers must be finite"),  # was the core's 'invalid literal'
    ({"method": "fixed", "fixed_scale": torch.tensor(2.0)}, TypeError, "not JSON serializable"),
    ({"n_uf": "x"}, ValueError, "Scaler(overrides=...)"),
    ({"method": "element_wise"}, ValueError, "element_wise"),  # refused per layer as it is for the policy
])
def test_overrides_bad_values_name_the_call_and_leave_the_model_usable(value, error, words):
    model = mlp()
    with pytest.raises(error, match=re.escape(words)):
        Scaler(model, scaler=FIXED, overrides={"0": value})
    Scaler(model, scaler=FIXED).remove()  # nothing was left attached


def test_scaler_config_with_nan_names_the_call():
    with pytest.raises(ValueError, match=re.escape("Scaler(scaler=...): numbers must be finite")):
        Scaler(mlp(), scaler={"policy": "adaptive", "method": "measured", "n_uf": float("nan")})


# ---- a layer used without calling it -------------------------------------------------------------
class Functional(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x):
        return F.linear(torch.relu(self.a(x)), self.b.weight, self.b.bias)  # b never called


def test_a_layer_used_without_a_call_is_named_once():
    model = Functional()
    scaler = Scaler(model, scaler="static:8", format="fp16")
    x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 0])
    with pytest.warns(UserWarning, match="layer 'b'"):
        scaler.scale(F.cross_entropy(model(x), y)).backward()
    assert {r["name"]: r["emulation"] for r in scaler.layer_scales()} == {"a": "gemm", "b": "not emulated"}
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler.update()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler.scale(F.cross_entropy(model(x), y)).backward()  # once


class Skipping(nn.Module):
    """A layer that some steps skip (stochastic depth, an auxiliary head, a mixture of experts)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x, use_b):
        return self.b(self.a(x)) if use_b else self.a(x)


def test_a_layer_a_step_skips_is_not_taken_for_one_used_without_a_call():
    # The skipped step's .grad of b is its earlier step's (zero_grad keeps it): no sign of a use.
    model = Skipping()
    scaler = Scaler(model, scaler="torch", format="fp16")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(4):
            opt.zero_grad(set_to_none=False)
            scaler.scale(model(torch.randn(3, 4), use_b=step != 1).pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update()
    assert {r["name"]: r["emulation"] for r in scaler.layer_scales()} == {"a": "gemm", "b": "gemm"}


# ---- real architectures --------------------------------------------------------------------------
torchvision = pytest.importorskip("torchvision")


class _Seq(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(16, 16, batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.rnn(self.emb(x))[0][:, -1])


def _img(size=32):
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))


TOK = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
ARCHITECTURES = {
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), _img),
    "mobilenet_v2": (lambda: torchvision.models.mobilenet_v2(num_classes=10), _img),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(num_classes=10), _img),
    "densenet121": (lambda: torchvision.models.densenet121(num_classes=10), _img),
    "squeezenet1_0": (lambda: torchvision.models.squeezenet1_0(num_classes=10), lambda: _img(48)),
    "googlenet": (lambda: torchvision.models.googlenet(num_classes=10, aux_logits=False, init_weights=True), _img),
    "shufflenet_v2": (lambda: torchvision.models.shufflenet_v2_x0_5(num_classes=10), _img),
    "efficientnet_b0": (lambda: torchvision.models.efficientnet_b0(num_classes=10), _img),
    "convnext_tiny": (lambda: torchvision.models.convnext_tiny(num_classes=10), _img),
    "regnet_x_400mf": (lambda: torchvision.models.regnet_x_400mf(num_classes=10), _img),
    "vit": (lambda: torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                          hidden_dim=32, mlp_dim=64, num_classes=10), _img),
    "transformer_encoder": (lambda: Encoder(), lambda: tokens()[0]),
    "lstm": (lambda: _Seq("lstm"), lambda: TOK),
    "gru": (lambda: _Seq("gru"), lambda: TOK),
}
CONVOLUTIONAL = {"resnet18", "mobilenet_v2", "convnext_tiny", "efficientnet_b0"}


def _grads_equal(make, x, mode, layout):
    torch.manual_seed(0)
    model = make()
    if layout == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    model.train(mode == "train")
    y = torch.arange(x.shape[0]) % 5
    ref = copy.deepcopy(model)
    torch.manual_seed(1)  # the same dropout masks
    F.cross_entropy(ref(x), y).backward()
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    torch.manual_seed(1)
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    differ = [n for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters())
              if q.grad is not None and not torch.equal(p.grad, q.grad)]
    assert not differ, f"{len(differ)} gradients differ from PyTorch's fp32 ones: {differ[:4]}"
    assert any(r["s"] == 4.0 for r in scaler.layer_scales())  # scales really acted
    return scaler


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_real_architectures_give_pytorchs_gradients(name):
    make, x = ARCHITECTURES[name]
    _grads_equal(make, x(), "train", "contiguous")


@pytest.mark.parametrize("name", ["resnet18", "vit", "transformer_encoder", "mobilenet_v3_small"])
def test_real_architectures_in_eval_mode(name):
    make, x = ARCHITECTURES[name]
    _grads_equal(make, x(), "eval", "contiguous")


@pytest.mark.parametrize("name", sorted(CONVOLUTIONAL))
def test_real_architectures_in_channels_last(name):
    make, x = ARCHITECTURES[name]
    _grads_equal(make, x(), "train", "channels_last")


# ---- the fp32 shadow -----------------------------------------------------------------------------
def test_the_shadow_costs_nothing_in_fp32():
    model = mlp()
    ref = copy.deepcopy(model)
    scaler = Scaler(model, scaler=FIXED, format="fp32", shadow=True, record_every=1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    F.cross_entropy(ref(x), y).backward()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.0))
    scaler.update()
    rows = {r["name"]: r["shadow"] for r in scaler.layer_scales()}
    for name in ("0", "2", "4"):
        assert rows[name]["weight"] == {"underflow_mass": 0.0, "rel_error": 0.0, "cosine": pytest.approx(1.0)}
    for name in ("2", "4"):  # the first layer sends nothing upstream
        assert rows[name]["upstream"]["rel_error"] == 0.0
    assert "upstream" not in rows["0"]
    for p, q in zip(model.parameters(), ref.parameters()):  # the shadow changes no gradient
        assert torch.equal(p.grad, q.grad)


class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2, bias=False)
        self.b = nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            self.a.weight.copy_(torch.eye(2))
            self.b.weight.copy_(torch.tensor([[2.0 ** -20, 1.0], [3 * 2.0 ** -21, 0.5]]))

    def forward(self, x):
        return self.b(self.a(x))


def test_the_shadow_on_a_hand_computed_case():
    """The loss (out * c).sum() gives b the loss gradient c; b sends c @ W_b upstream. In e5m2 at S0 = 1,
    values below 2^-17 round to zero: the first column's 2^-20 and 3·2^-21 do, the second's do not."""
    model = TwoLinear()
    scaler = Scaler(model, scaler="static:1", format="fp32", grad_format="fp8_e5m2", shadow=True, record_every=1,
                    weight_grads="fp32")
    x = torch.ones(1, 2, requires_grad=True)
    c = torch.tensor([[1.0, 1.0]])
    scaler.scale((model(x) * c).sum()).backward()
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.0))
    scaler.update()
    up = {r["name"]: r["shadow"] for r in scaler.layer_scales()}["b"]["upstream"]
    exact = torch.tensor([2.0 ** -20 + 3 * 2.0 ** -21, 1.5], dtype=torch.float64)  # c @ W_b
    stored = exact.clone().float()
    _core.quantize_(stored.data_ptr(), 2, "fp8_e5m2")  # [0, 1.5]
    assert stored.tolist() == [0.0, 1.5]
    assert up["underflow_mass"] == pytest.approx(float(exact[0] / exact.sum()), rel=1e-12)
    assert up["rel_error"] == pytest.approx(float(exact[0] / exact.norm()), rel=1e-6)
    assert up["cosine"] == pytest.approx(float(1.5 / exact.norm()), rel=1e-6)


def test_the_shadow_s_underflowed_mass_is_a_share_when_every_value_underflows():
    """Every non-zero value rounded to zero: the mass is 1, never above (the lost values' sum and the
    whole sum, taken in different orders, differed in the last bit: 1.0000000000000002, which
    `gradscale inspect --check` refuses). Values and zeros drawn so that the two orders differ here."""
    from gradscale.torch._shadow import _Sums
    g = torch.Generator().manual_seed(3)
    pre = torch.exp2(-60 * torch.rand(1000, generator=g)) * (torch.rand(1000, generator=g) + 0.5)
    pre[torch.rand(1000, generator=g) < 0.3] = 0
    sums = _Sums()
    sums.add(pre, torch.zeros(1000), torch.zeros(1000), pre)
    assert sums.metrics()["underflow_mass"] == 1.0


def test_a_module_put_in_a_layers_place_after_the_scaler_is_named_once():
    # The new head is no layer of the Scaler: it computes in fp32, unrounded. Said once, by name; a
    # parameter outside the model (a temperature) is no module's and is not named.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    temperature = nn.Parameter(torch.tensor(2.0))
    scaler = Scaler(model, scaler="torch", format="fp8_e4m3")
    opt = torch.optim.SGD(list(model.parameters()) + [temperature], lr=0.1)
    x = torch.randn(5, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler.scale((model(x) / temperature).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
    model[2] = nn.Linear(16, 4)
    with pytest.warns(UserWarning, match=r"module '2' \(Linear\) was added to the model, or put in a layer's place"):
        scaler.scale((model(x) / temperature).pow(2).mean()).backward()
    scaler.step(opt)
    scaler.update()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler.scale((model(x) / temperature).pow(2).mean()).backward()  # once

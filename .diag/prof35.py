import cProfile, pstats, sys, os, time
import torch
import torch.nn.functional as F
sys.path.insert(0, "/work/main/python/examples")
from gradscale.torch import Scaler
from train_compare import CharLM
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
seq = torch.randint(0, 80, (16, 65), generator=g)
x, y = seq[:, :-1], seq[:, 1:]
torch.manual_seed(0)
model = CharLM(80)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
policy = sys.argv[1] if len(sys.argv) > 1 else "torch"
scaler = Scaler(model, scaler=policy, format="fp16", record_every=0) if policy != "plain" else None
def step():
    out = model(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    opt.zero_grad()
    if scaler:
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    else:
        loss.backward(); opt.step()
for _ in range(5): step()
ts = []
for _ in range(20):
    t0 = time.perf_counter(); step(); ts.append(time.perf_counter() - t0)
ts.sort(); print(policy, "median ms", ts[10] * 1e3)
if len(sys.argv) > 2:
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20): step()
    pr.disable()
    st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(30)

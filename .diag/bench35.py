import sys, gc
sys.path.insert(0, "/work/main/python/examples")
import torch
torch.set_num_threads(1)
import bench_overhead as b
if len(sys.argv) > 2 and sys.argv[2] == "gcoff": gc.disable()
steps = int(sys.argv[1])
for name, make, data in b.models():
    if "transformer" not in name: continue
    ms, faults = b.time_configs(make, data, [None, "torch", {"policy": "adaptive", "method": "measured"}], steps, "cpu")
    print(name, ["%.2f" % m for m in ms], "torch/plain %.3f measured/torch %.3f" % (ms[1] / ms[0], ms[2] / ms[1]))

import sys, time, types, os
sys.modules['torchvision._meta_registrations'] = types.ModuleType('torchvision._meta_registrations')
import torch, torchvision
mode = sys.argv[1]
torch.manual_seed(0)
m = torchvision.models.vit_b_16()
if mode == "whole":
    run = torch.compile(m)
else:  # regional: each encoder block compiled, as the 7B cells' blocks are (amprepro.train.float8.CompiledBlock)
    for i, layer in enumerate(m.encoder.layers):
        layer.compile()
    run = m
x = torch.randn(4, 3, 224, 224)
for step in range(3):
    t = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = run(x).float().logsumexp(-1).mean()
    loss.backward()
    print(mode, "step", step, round(time.perf_counter() - t, 2), flush=True)
from torch._dynamo.utils import counters
print(mode, {k: dict(v) for k, v in counters.items() if k in ("inductor", "aot_autograd", "stats")})

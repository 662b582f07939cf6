"""The PyTorch + transformers side of examples/sft_bench.rs: the same Qwen2.5-0.5B-shaped model
(random weights, f32 parameters and AdamW state, fused AdamW), bf16 autocast, batch x len random
ids as inputs and labels (transformers' loss shifts them). Prints one JSON line.

python3 benches/sft/bench_torch.py [--batch 8 --len 1024 --steps 5 --layers 24] [--profile]

--profile then profiles one more step with torch.profiler and prints its kernels by device time
(the counterpart of sft_bench's --profile).

Under torchrun (WORLD_SIZE set): DistributedDataParallel over NCCL, one GPU per rank, each rank
its own batch; rank 0 prints the line with the tokens/s of all ranks.
"""
import os
import argparse
import json
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--len", type=int, default=1024)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--layers", type=int, default=24)
p.add_argument("--profile", action="store_true")
a = p.parse_args()
config = Qwen2Config(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=a.layers,
    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
    rms_norm_eps=1e-6, tie_word_embeddings=True, attn_implementation="sdpa",
)
world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
if "WORLD_SIZE" in os.environ:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group("nccl")
torch.manual_seed(0)
model = Qwen2ForCausalLM(config).cuda().train()
if "WORLD_SIZE" in os.environ:
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
torch.manual_seed(rank + 1)
ids = torch.randint(0, config.vocab_size, (a.batch, a.len), device="cuda")


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def barrier():
    if world > 1:
        torch.distributed.barrier()


step()
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
barrier()
start = time.perf_counter()
losses = [step() for _ in range(a.steps)]
torch.cuda.synchronize()
barrier()
seconds = time.perf_counter() - start
if rank == 0:
    print(json.dumps({
        "system": f"torch {torch.__version__} + transformers" + (" DDP" if world > 1 else ""), "world": world,
        "batch": a.batch, "len": a.len, "layers": a.layers, "ms_per_step": round(1e3 * seconds / a.steps, 1),
        "tokens_per_s": round(world * a.batch * a.len * a.steps / seconds),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "losses": losses,
    }))
if a.profile and rank == 0:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=90))
if world > 1:
    torch.distributed.destroy_process_group()

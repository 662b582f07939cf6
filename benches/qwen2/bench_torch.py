"""transformers' side of the Qwen2 decode benchmark (benches/qwen2/run.sh).

A Qwen2.5-0.5B-shaped Qwen2ForCausalLM with random weights in bf16 on the GPU: a prefill of
--prompt tokens, then --new greedy tokens at batch 1, timed two ways:
  - "transformers loop": prefill and one forward per token with a DynamicCache, the argmax
    read on the host after every step (what the Genesis benchmark does);
  - "transformers generate": model.generate(do_sample=False) with a streamer that notes the
    time of the first token.
Prints one JSON line per way: time to first token, decode tokens/s, peak memory.
"""
import argparse
import json
import time

import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM
from transformers.generation.streamers import BaseStreamer


def qwen2_5_0_5b():
    return Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
    )


def sync():
    torch.cuda.synchronize()


@torch.no_grad()
def loop(model, prompt, new):
    sync()
    start = time.perf_counter()
    cache = DynamicCache()
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    token.item()
    ttft = time.perf_counter() - start
    decode_start = time.perf_counter()
    for _ in range(new - 1):
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        token.item()
    return ttft, time.perf_counter() - decode_start


class FirstToken(BaseStreamer):
    def __init__(self):
        self.calls = 0
        self.first = None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            self.first = time.perf_counter()

    def end(self):
        pass


@torch.no_grad()
def generate(model, prompt, new):
    streamer = FirstToken()
    sync()
    start = time.perf_counter()
    out = model.generate(prompt, do_sample=False, max_new_tokens=new, min_new_tokens=new,
                         streamer=streamer, pad_token_id=0)
    sync()
    end = time.perf_counter()
    assert out.shape[1] == prompt.shape[1] + new
    return streamer.first - start, end - streamer.first


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--layers", type=int, default=None)
    args = p.parse_args()
    config = qwen2_5_0_5b()
    if args.layers:
        config.num_hidden_layers = args.layers
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    ids = (torch.arange(args.prompt) * 7919 + 13) % config.vocab_size
    prompt = ids.unsqueeze(0).cuda()
    name = torch.cuda.get_device_name()
    for label, fn in [("transformers loop", loop), ("transformers generate", generate)]:
        fn(model, prompt[:, :64], 8)  # warm-up
        # The first prompt of the full length is timed apart, as qwen2_bench does.
        ttft_first, _ = fn(model, prompt, 2)
        torch.cuda.reset_peak_memory_stats()
        ttft, decode = fn(model, prompt, args.new)
        print(json.dumps({
            "engine": label, "device": name, "dtype": "bf16", "prompt": args.prompt, "new": args.new,
            "ttft_first_ms": round(ttft_first * 1e3, 2), "ttft_ms": round(ttft * 1e3, 2), "decode_tokens_per_s": round((args.new - 1) / decode, 1),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            "attention": model.config._attn_implementation, "torch": torch.__version__,
        }))


if __name__ == "__main__":
    main()

"""Write the SFT base-model fixture folder `sft-base/`: a small freshly initialized Qwen2 model
(transformers' own init: normal(0, initializer_range=0.02) weights, zero biases, unit RMSNorm
weights; tied embeddings) plus the tokenizer files of tests/models/qwen2/tiny-tied.

Run:  python3 make_sft_base.py [--tokenizer-from DIR] [--out DIR] [--seed S] [--hidden H] ...
It deletes and rewrites --out. Same arguments and versions give the same files.
"""

import argparse
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json"]
ENDOFTEXT, IM_START, IM_END = 997, 998, 999


def build(seed, hidden, layers, heads, kv_heads, intermediate):
    config = Qwen2Config(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        max_window_layers=layers,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        initializer_range=0.02,
        use_sliding_window=False,
        sliding_window=None,
        bos_token_id=ENDOFTEXT,
        eos_token_id=IM_END,
        # No pad_token_id here: Qwen2Model would pass it to nn.Embedding as padding_idx, which
        # zeroes that row and freezes its gradient. Padding is the trainer's business.
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)  # runs transformers' _init_weights under the seed above
    model.eval()
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer-from", default=os.path.join(HERE, "tiny-tied"))
    p.add_argument("--out", default=os.path.join(HERE, "sft-base"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=256)
    args = p.parse_args()

    torch.set_num_threads(1)
    model = build(args.seed, args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate)
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    model.save_pretrained(args.out, safe_serialization=True)  # config.json + model.safetensors
    GenerationConfig(
        bos_token_id=ENDOFTEXT,
        pad_token_id=ENDOFTEXT,
        eos_token_id=[IM_END, ENDOFTEXT],
        do_sample=False,
        max_new_tokens=16,
    ).save_pretrained(args.out)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(args.tokenizer_from, name), os.path.join(args.out, name))
    # Check it reloads as a Qwen2ForCausalLM with the same weights.
    again = Qwen2ForCausalLM.from_pretrained(args.out)
    for (k, a), (k2, b) in zip(sorted(model.state_dict().items()), sorted(again.state_dict().items())):
        assert k == k2 and torch.equal(a, b), k
    n = sum(t.numel() for t in model.parameters())
    size = os.path.getsize(os.path.join(args.out, "model.safetensors"))
    print(f"wrote {args.out}: {n} parameters, model.safetensors {size} bytes")


if __name__ == "__main__":
    main()

"""Load a folder written by examples/sft.rs in transformers and compare its logits with the
ones Genesis saved for the same prompts (--save-logits); then answer the held-out prompts
greedily with transformers and report the exact-match accuracy. Prints one JSON line.

python3 benches/sft/check_logits.py OUT_DIR LOGITS.safetensors tests/sft/eval.jsonl [N]
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, Qwen2ForCausalLM

folder, logits_file, eval_file = sys.argv[1:4]
n = int(sys.argv[4]) if len(sys.argv) > 4 else 100
model = Qwen2ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
saved = load_file(logits_file)
worst, scale = 0.0, 0.0
with torch.no_grad():
    for i in range(len([k for k in saved if k.startswith("ids.")])):
        ids, ours = saved[f"ids.{i}"], saved[f"logits.{i}"]
        theirs = model(input_ids=ids).logits.float()
        worst = max(worst, (theirs - ours).abs().max().item())
        scale = max(scale, theirs.abs().max().item())
tok = AutoTokenizer.from_pretrained(folder)
records = [json.loads(line) for line in open(eval_file)][:n]
correct = 0
with torch.no_grad():
    for r in records:
        msgs = r["messages"]
        prompt = tok.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True)
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        out = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>")])
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
        correct += text == msgs[-1]["content"].strip()
print(json.dumps({"max_abs_logit_diff": worst, "max_abs_logit": scale, "transformers_exact_match": correct / len(records)}))

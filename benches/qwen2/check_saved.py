"""Load folders that Genesis saved (save_pretrained) with transformers and compare their
logits with those of the original fixture folders, loaded the same way in the same process
(they must agree exactly: same weights, same code), and with the fixtures' stored references.
Also prints transformers' own bf16 error against the f32 references on the GPU, the yardstick
for Genesis' bf16 tolerance.

    python3 check_saved.py SAVED_DIR FIXTURE_DIR

SAVED_DIR holds one folder per fixture model (tiny-tied, tiny-untied, tiny-sharded), written
by the qwen2_fixtures test with GENESIS_QWEN2_SAVE_DIR set.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    saved, fixtures = sys.argv[1], sys.argv[2]
    refs = load_file(os.path.join(fixtures, "reference.safetensors"))
    worst = 0.0
    for name in ["tiny-tied", "tiny-untied", "tiny-sharded"]:
        ids = refs[f"{name}.input_ids"]

        def logits(folder, dtype=torch.float32, device="cpu"):
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager")
            with torch.no_grad():
                return model.to(device).eval()(input_ids=ids.to(device)).logits.float().cpu(), model

        ours, model = logits(os.path.join(saved, name))
        original, _ = logits(os.path.join(fixtures, name))
        tokenizer = AutoTokenizer.from_pretrained(os.path.join(saved, name))
        diff = (ours - original).abs().max().item()
        worst = max(worst, diff)
        bf16, _ = logits(os.path.join(fixtures, name), torch.bfloat16, "cuda")
        print(json.dumps({
            "model": name, "class": type(model).__name__, "tied": model.config.tie_word_embeddings,
            "max_abs_diff_saved_vs_original": diff,
            "max_abs_diff_vs_stored_reference": (ours - refs[f"{name}.logits"]).abs().max().item(),
            "transformers_bf16_cuda_max_abs_diff_vs_f32_reference": (bf16 - refs[f"{name}.logits"]).abs().max().item(),
            "tokenizer_len": len(tokenizer),
        }))
    print("PASS" if worst == 0.0 else "FAIL", f"saved vs original, largest difference {worst:.3e}")
    sys.exit(0 if worst == 0.0 else 1)


if __name__ == "__main__":
    main()

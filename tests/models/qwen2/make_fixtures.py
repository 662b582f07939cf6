"""Generate the Qwen2 test fixtures: a tiny tokenizer, three tiny random Qwen2 models, and
reference outputs computed with Hugging Face transformers.

Nothing may be downloaded when the tests run, so everything the Qwen2 tests need is made here
from `corpus.txt` (hand-written text beside this script) and fixed seeds, and committed.

What it writes (into --out, default: this script's directory):

  tiny-tied/      2 layers, tied embeddings, f32 `model.safetensors`, config.json in the
                  transformers 5.x layout (`rope_parameters`), generation_config.json with a list
                  of eos ids and sampling defaults, chat template as a string in
                  tokenizer_config.json, tokenizer.json with merges in the legacy "a b" string form
                  (as in the Qwen2.5 files on the Hub).
  tiny-untied/    3 layers, separate `lm_head.weight`, f32, config.json rewritten to the
                  transformers 4.x layout (top-level `rope_theta`, `torch_dtype`) plus fields
                  transformers does not know, an int eos id, chat template in chat_template.jinja.
  tiny-sharded/   4 layers, untied, bf16 weights in two shards plus model.safetensors.index.json,
                  a list of named chat templates ("default", "tool_use") in tokenizer_config.json.
  reference.safetensors   logits for fixed inputs and for a left-padded batch, per model.
  reference.json          greedy generations, tokenizer encode/decode cases, rendered chats,
                          versions and special-token ids.

The tokenizer is a byte-level BPE with Qwen2's pipeline (NFC, Qwen2's split regex, ByteLevel),
1000 entries: 997 learned (256 bytes + 741 merges) then <|endoftext|>=997, <|im_start|>=998,
<|im_end|>=999, placed after the learned vocabulary as in Qwen2. The models' vocab_size is 1024
(rounded up to a multiple of 64, so ids 1000..1023 are embedding rows no token maps to; Qwen2
does the same).

All references are computed on the CPU in f32 with eager attention, from the folders as
reloaded from disk (so they cover what a loader sees). The bf16 model's references use its
bf16-rounded weights promoted to f32.

Run:  python3 make_fixtures.py [--out DIR]
It deletes and rewrites the three model folders and the two reference files in DIR, and never
touches anything else. Running it twice gives the same files.

The committed files were generated with: Python 3.12.3, torch 2.11.0, transformers 5.17.0,
tokenizers 0.23.2, safetensors 0.8.0 (reference.json["versions"] records what was used).
"""

import argparse
import copy
import json
import os
import shutil
import sys

# The fixtures are made from local files only; never let transformers reach for the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import safetensors
import tokenizers
import torch
import transformers
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus.txt")

# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

# Qwen2's pre-tokenizer split pattern, verbatim (transformers' tokenization_qwen2.py has the same).
QWEN2_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LEARNED_VOCAB = 997  # 256 byte tokens + 741 merges; the 3 special tokens follow, 1000 in all.
TOKENIZER_LEN = LEARNED_VOCAB + len(SPECIAL_TOKENS)
MODEL_VOCAB = 1024  # tokenizer length rounded up to a multiple of 64.
MODEL_MAX_LENGTH = 512
EOS_IDS = (997, 999)  # <|endoftext|>, <|im_end|>


def train_tokenizer():
    """Train the byte-level BPE on corpus.txt and return its tokenizer.json as a dict.

    The BPE trainer is deterministic (ties between equally frequent pairs are broken by the
    pair itself), so the same corpus and tokenizers version give the same file.
    """
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=LEARNED_VOCAB,
        min_frequency=2,
        show_progress=False,
        # Every byte gets a token, so any text is representable and there is no unk token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train([CORPUS], trainer)
    assert tok.get_vocab_size() == LEARNED_VOCAB, tok.get_vocab_size()
    # Added after training so they take the ids after the learned vocabulary, as in Qwen2.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])

    spec = json.loads(tok.to_str())
    # Mirror the field values of Qwen2's own tokenizer.json, which the Python builders above
    # don't all expose: ByteLevel post-processor and decoder with every option off, and empty
    # (rather than null) subword prefix/suffix in the BPE model.
    byte_level_off = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    spec["post_processor"] = dict(byte_level_off)
    spec["decoder"] = dict(byte_level_off)
    spec["model"]["continuing_subword_prefix"] = ""
    spec["model"]["end_of_word_suffix"] = ""
    return spec


def tokenizer_json_text(spec, legacy_merges):
    """tokenizer.json text. tokenizers >= 0.20 writes merges as ["a", "b"] pairs; the Qwen2.5
    files on the Hub have the older "a b" strings. Both load to the same tokenizer (byte-level
    tokens never contain a space), and the fixtures use both so that loaders handle both."""
    spec = json.loads(json.dumps(spec))
    if legacy_merges:
        spec["model"]["merges"] = [" ".join(pair) for pair in spec["model"]["merges"]]
    return json.dumps(spec, ensure_ascii=False, indent=2) + "\n"


def tokenizer_config(special_ids, chat_template=None):
    """tokenizer_config.json in the form of Qwen2.5's Hub files (written by transformers 4.x).

    transformers 5.x's own save_pretrained drops `added_tokens_decoder`, adds bookkeeping keys
    (`backend`, `is_local`, ...) and always moves the chat template to chat_template.jinja, so
    the file is written here by hand instead."""
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(special_ids[t]): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    config.update(
        {
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": MODEL_MAX_LENGTH,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        }
    )
    return config


# --------------------------------------------------------------------------------------------
# Chat templates (written for these fixtures; ChatML layout)
# --------------------------------------------------------------------------------------------

# Every tag carries whitespace control ({%- -%}), so the output is the same whether or not the
# renderer sets trim_blocks/lstrip_blocks (transformers sets both). Features exercised on purpose:
# loop.first, loop.last, a Python string method (.strip()), `in` on a list literal,
# raise_exception, string concatenation with + and ~.
DEFAULT_TEMPLATE = """\
{%- for message in messages -%}
    {%- if message['role'] not in ['system', 'user', 'assistant'] -%}
        {{- raise_exception('Unsupported role: ' ~ message['role'] ~ ' (expected system, user or assistant)') -}}
    {%- endif -%}
    {%- if loop.first and message['role'] != 'system' -%}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}
    {%- endif -%}
    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'].strip() + '<|im_end|>\\n' -}}
    {%- if loop.last and add_generation_prompt -%}
        {{- '<|im_start|>assistant\\n' -}}
    {%- endif -%}
{%- endfor -%}
"""

# The same layout, plus: a `tools` list rendered with tojson into the system message, assistant
# messages with `tool_calls`, and `tool` messages. Also uses .startswith, `is defined`, the
# length filter and a namespace-free conditional expression.
TOOL_USE_TEMPLATE = """\
{%- if tools -%}
    {{- '<|im_start|>system\\n' -}}
    {%- if messages and messages[0]['role'] == 'system' -%}
        {{- messages[0]['content'].strip() -}}
    {%- else -%}
        {{- 'You are a helpful assistant.' -}}
    {%- endif -%}
    {{- '\\n\\n# Tools\\n\\nNumber of functions: ' ~ (tools | length) ~ '\\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\\n</tools>\\n\\nTo call one, reply with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}
        {{- raise_exception('Unsupported role: ' ~ message['role']) -}}
    {%- endif -%}
    {%- if loop.first and message['role'] != 'system' and not tools -%}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}
    {%- endif -%}
    {%- if loop.first and message['role'] == 'system' and tools -%}
        {#- Already merged into the tools system message above. -#}
    {%- elif message['role'] == 'tool' -%}
        {{- '<|im_start|>tool\\n<tool_response>\\n' + message['content'].strip() + '\\n</tool_response><|im_end|>\\n' -}}
    {%- else -%}
        {{- '<|im_start|>' + message['role'] + '\\n' + message['content'].strip() -}}
        {%- if message['role'] == 'assistant' and message['tool_calls'] is defined -%}
            {%- for call in message['tool_calls'] -%}
                {%- set fn = call['function'] if call['function'] is defined else call -%}
                {{- ('\\n' if (message['content'].strip() or not loop.first) else '') -}}
                {{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' + (fn['arguments'] | tojson) + '}\\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\\n' -}}
    {%- endif -%}
    {%- if loop.last and add_generation_prompt -%}
        {{- '<|im_start|>assistant\\n' -}}
        {%- if message['content'].startswith('/think') -%}
            {{- '<think>\\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
"""

# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------

MODELS = [
    {
        "name": "tiny-tied",
        "seed": 1001,
        "layers": 2,
        "tied": True,
        "rope_theta": 1_000_000.0,
        "dtype": torch.float32,
        "config_layout": "v5",
        "template_storage": "tokenizer_config_string",
        "legacy_merges": True,
        # Qwen2.5-Instruct style: both end tokens stop, plus sampling defaults.
        "generation_config": {
            "bos_token_id": 997,
            "pad_token_id": 997,
            "do_sample": True,
            "eos_token_id": [999, 997],
            "repetition_penalty": 1.05,
            "temperature": 0.7,
            "top_k": 20,
            "top_p": 0.8,
        },
    },
    {
        "name": "tiny-untied",
        "seed": 2002,
        "layers": 3,
        "tied": False,
        "rope_theta": 10_000.0,
        "dtype": torch.float32,
        "config_layout": "v4",
        "template_storage": "jinja_file",
        "legacy_merges": False,
        "generation_config": {"bos_token_id": 997, "do_sample": False, "eos_token_id": 999, "max_new_tokens": 64},
    },
    {
        "name": "tiny-sharded",
        "seed": 3003,
        "layers": 4,
        "tied": False,
        "rope_theta": 1_000_000.0,
        "dtype": torch.bfloat16,
        "config_layout": "v5",
        "template_storage": "named_list",
        "legacy_merges": False,
        "generation_config": {
            "bos_token_id": 997,
            "pad_token_id": 997,
            "do_sample": True,
            "eos_token_id": [999, 997],
            "temperature": 0.7,
            "top_p": 0.8,
        },
    },
]

# Weights are drawn larger than in a trained Qwen2 (initializer_range 0.02) so that the logits
# spread widely (std about 9) and greedy decoding has clear margins: the final RMSNorm weight is
# drawn around FINAL_NORM_SCALE instead of 1. Seeds are then tried in order, from each model's
# base seed, until every greedy step (single prompt and batch) beats the runner-up logit by
# MIN_MARGIN, far above the ~1e-5 by which two f32 implementations differ.
INIT_RANGE = 0.2
FINAL_NORM_SCALE = 6.0
MIN_MARGIN = 0.1
MAX_NEW_TOKENS = 24


def model_config(spec):
    return Qwen2Config(
        vocab_size=MODEL_VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=spec["layers"],
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: 2 query heads share each kv head
        max_position_embeddings=MODEL_MAX_LENGTH,
        max_window_layers=spec["layers"],
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": spec["rope_theta"]},
        tie_word_embeddings=spec["tied"],
        initializer_range=INIT_RANGE,
        use_sliding_window=False,
        sliding_window=None,
        bos_token_id=997,
        eos_token_id=999,
        attn_implementation="eager",
    )


def build_model(spec, seed):
    """A Qwen2ForCausalLM with weights drawn here from a seeded generator, in a fixed order.

    transformers' own init is not used: it zeroes the q/k/v biases and sets the RMSNorm weights
    to one, which would leave the loader's handling of those tensors untested.
    The embedding (and lm_head) rows past the tokenizer's 1000 entries are made near zero, as in
    trained checkpoints, so greedy decoding never picks an id that has no token.
    """
    model = Qwen2ForCausalLM(model_config(spec)).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name == "model.norm.weight":
                p.copy_(FINAL_NORM_SCALE * (1.0 + 0.1 * noise))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.5 * noise)
            else:
                p.copy_(INIT_RANGE * noise)
        out_rows = [model.model.embed_tokens.weight] + ([] if spec["tied"] else [model.lm_head.weight])
        for p in out_rows:
            p[TOKENIZER_LEN:].mul_(0.01)
        if spec["dtype"] != torch.float32:
            # The file stores bf16; round now so every reference sees exactly the stored values.
            for p in model.parameters():
                p.copy_(p.to(spec["dtype"]).to(torch.float32))
    if spec["tied"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


# --------------------------------------------------------------------------------------------
# Writing the folders
# --------------------------------------------------------------------------------------------


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


def rewrite_config_v4(path):
    """Turn transformers 5.x's config.json into the layout transformers 4.x wrote (as in the
    Qwen2/Qwen2.5 Hub files): top-level rope_theta, `torch_dtype`, no rope_parameters or
    layer_types, and a couple of fields transformers does not know, which loaders must ignore."""
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    rope = c.pop("rope_parameters")
    assert rope["rope_type"] == "default", rope
    c["rope_theta"] = rope["rope_theta"]
    c["rope_scaling"] = None
    c["torch_dtype"] = c.pop("dtype")
    c.pop("layer_types", None)
    c.pop("pad_token_id", None)
    c["sliding_window"] = None
    c["use_mrope"] = False  # present in Qwen2.5 configs, unknown to transformers' Qwen2Config
    c["genesis_fixture_note"] = "config.json rewritten to the transformers 4.x layout by make_fixtures.py"
    # A 4.x-era version string, as such a file would carry (the file was really written by 5.x).
    c["transformers_version"] = "4.46.0"
    write_json(path, dict(sorted(c.items())))


def write_tokenizer_files(spec, tok_spec, special_ids, folder):
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tokenizer_json_text(tok_spec, spec["legacy_merges"]))
    storage = spec["template_storage"]
    if storage == "tokenizer_config_string":
        config = tokenizer_config(special_ids, DEFAULT_TEMPLATE)
    elif storage == "named_list":
        templates = [{"name": "default", "template": DEFAULT_TEMPLATE}, {"name": "tool_use", "template": TOOL_USE_TEMPLATE}]
        config = tokenizer_config(special_ids, templates)
    else:
        assert storage == "jinja_file"
        config = tokenizer_config(special_ids)
        with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(DEFAULT_TEMPLATE)
    write_json(os.path.join(folder, "tokenizer_config.json"), config)


def write_model_files(spec, model, folder):
    """Weights, config.json and generation_config.json. Weights and config go through
    transformers, as a real checkpoint is written, then config.json is adjusted per fixture."""
    before = set(os.listdir(folder))
    if spec["dtype"] == torch.float32:
        model.save_pretrained(folder)  # tied models are saved without lm_head.weight
        expected = {"model.safetensors"}
    else:
        # The values are already bf16-representable (build_model rounded them), so this cast
        # is exact. The shard size is picked so that transformers splits the ~600 KB of
        # weights into two files (with lm_head in the second).
        copy.deepcopy(model).to(spec["dtype"]).save_pretrained(folder, max_shard_size="400KB")
        expected = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"}
    written = set(os.listdir(folder)) - before
    assert written == expected | {"config.json", "generation_config.json"}, written
    config_path = os.path.join(folder, "config.json")
    if spec["name"] == "tiny-sharded":
        # Qwen2 configs don't carry head_dim, but later families do; one fixture has it (and it
        # agrees with hidden_size / num_attention_heads).
        with open(config_path, encoding="utf-8") as f:
            c = json.load(f)
        c["head_dim"] = 16
        write_json(config_path, dict(sorted(c.items())))
    if spec["config_layout"] == "v4":
        rewrite_config_v4(config_path)
    # Replaces the one save_pretrained derived from config.json.
    GenerationConfig(**spec["generation_config"]).save_pretrained(folder)


def load_folder(folder):
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    return tok, model


# --------------------------------------------------------------------------------------------
# Model references
# --------------------------------------------------------------------------------------------


def padded_batch(prompts, pad_id):
    """Left-pad `prompts` (lists of ids) to one length; returns ids, mask, position ids.
    Position ids count real tokens only, as transformers' generate computes them."""
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(prompts), length), dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, length - len(p) :] = torch.tensor(p)
        mask[i, length - len(p) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


@torch.no_grad()
def greedy(model, prompts, pad_id, steps=MAX_NEW_TOKENS):
    """Plain greedy decoding by full recomputation each step (no KV cache, no logits
    processors, no stopping). Returns the new ids per row and the smallest top1-top2 gap."""
    rows = [list(p) for p in prompts]
    min_margin = float("inf")
    for _ in range(steps):
        ids, mask, positions = padded_batch(rows, pad_id)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1, :]
        top2 = logits.topk(2, dim=-1).values
        min_margin = min(min_margin, (top2[:, 0] - top2[:, 1]).min().item())
        for row, nxt in zip(rows, logits.argmax(-1).tolist()):
            row.append(nxt)
    return [row[len(p) :] for row, p in zip(rows, prompts)], min_margin


@torch.no_grad()
def hf_generate(model, prompts, pad_id):
    """The same through transformers' generate (KV cache, left padding), with a fresh
    GenerationConfig so the folder's sampling defaults and repetition penalty don't apply."""
    ids, mask, _ = padded_batch(prompts, pad_id)
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=MAX_NEW_TOKENS,
        min_new_tokens=MAX_NEW_TOKENS,
        pad_token_id=pad_id,
        eos_token_id=None,
        repetition_penalty=1.0,
    )
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return out[:, ids.shape[1] :].tolist()


def check_margin(model, greedy_prompt, batch_prompts, pad_id):
    _, m1 = greedy(model, [greedy_prompt], pad_id)
    _, m2 = greedy(model, batch_prompts, pad_id)
    return min(m1, m2)


@torch.no_grad()
def model_references(name, model, inputs, greedy_prompt, batch_prompts, pad_id, tensors):
    """Fill `tensors` with this model's logits references and return its JSON section."""
    logits = model(input_ids=inputs).logits
    tensors[f"{name}.input_ids"] = inputs.clone()  # one copy per model: safetensors refuses shared storage
    tensors[f"{name}.logits"] = logits.float().contiguous()

    ids, mask, positions = padded_batch(batch_prompts, pad_id)
    padded_logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    tensors[f"{name}.padded.input_ids"] = ids
    tensors[f"{name}.padded.attention_mask"] = mask
    tensors[f"{name}.padded.logits"] = padded_logits.float().contiguous()
    # At real positions the padded batch must agree with each prompt run alone.
    padded_vs_alone = 0.0
    for i, p in enumerate(batch_prompts):
        alone = model(input_ids=torch.tensor([p])).logits[0]
        padded_vs_alone = max(padded_vs_alone, (padded_logits[i, ids.shape[1] - len(p) :] - alone).abs().max().item())
    assert padded_vs_alone < 1e-4, padded_vs_alone

    out, margin = greedy(model, [greedy_prompt], pad_id)
    assert hf_generate(model, [greedy_prompt], pad_id) == out, "generate() disagrees with the greedy loop"
    batch_out, batch_margin = greedy(model, batch_prompts, pad_id)
    assert hf_generate(model, batch_prompts, pad_id) == batch_out, "batched generate() disagrees"
    alone_out = [greedy(model, [p], pad_id)[0][0] for p in batch_prompts]

    lengths = [len(p) for p in batch_prompts]
    return {
        "greedy": {
            "prompt": greedy_prompt,
            "max_new_tokens": MAX_NEW_TOKENS,
            "output": out[0],
            "min_margin": margin,
            "eos_in_output": any(i in EOS_IDS for i in out[0]),
            "note": "argmax every step, no repetition penalty, no stopping at eos ids; "
            "checked equal to transformers generate(do_sample=False) with KV cache",
        },
        "batch_greedy": {
            "prompts": batch_prompts,
            "input_ids": ids.tolist(),
            "attention_mask": mask.tolist(),
            "position_ids": positions.tolist(),
            "pad_token_id": pad_id,
            "padding_side": "left",
            "max_new_tokens": MAX_NEW_TOKENS,
            "outputs": batch_out,
            "min_margin": batch_margin,
            "unbatched_outputs": alone_out,
            "matches_unbatched": alone_out == batch_out,
            "eos_in_outputs": any(i in EOS_IDS for row in batch_out for i in row),
        },
        "padded": {
            "prompt_lengths": lengths,
            "length": ids.shape[1],
            "valid_positions": [[ids.shape[1] - n, ids.shape[1]] for n in lengths],
            "note": "padded.logits[i, j] is meaningful only for j in valid_positions[i] (half-open); "
            "pad positions hold whatever the model computed there and must not be compared. "
            "position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)",
            "max_abs_diff_vs_unpadded": padded_vs_alone,
        },
    }


# --------------------------------------------------------------------------------------------
# Tokenizer and chat references
# --------------------------------------------------------------------------------------------

ENCODE_SAMPLES = [
    "Hello world! The lighthouse keeper counted 17 ships today.",
    "def total(values):\n    result = 0\n    for v in values:\n        result += v\n    return result\n",
    "12345 3.14159",
    "a   b\t\tc\n\n\nd  ",
    "你好，世界。日本語のテキスト",
    "등대지기는 매일 저녁",
    "Flags 🇯🇵🇫🇷, family 👨‍👩‍👧‍👦, thumbs 👍🏽 👋🏿, heart ❤️ and keycap 1️⃣ 🚀",
    "Crème brûlée, naïve façade, Łódź, Dvořák, São Paulo, Ærø",
    # Decomposed accents: NFC composes them, so the decoded text differs from the input.
    "Cafe\u0301 n\u0303 A\u030a",
    "I'M sure it's fine; they'LL say WE'VE done it, you'd think.",
    "line one\r\nline two\r\n\r\n  indented\n",
    "<|im_start|>user\nhi<|im_end|>",
    "text<|endoftext|>more<|im_end|> and <|im_start (not special)",
    "rare: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑∫√ \u0000\u0007 \u00a0nbsp",
    "   \n\t ",
    "",
]


def tokenizer_references(tok, raw_tok):
    """Encode/decode cases. `tok` is transformers' tokenizer; `raw_tok` the tokenizers-library
    tokenizer from the same tokenizer.json. transformers 5.x rebuilds the pipeline from its
    Qwen2Tokenizer class (keeping only vocab, merges and added tokens), so the ids of both
    are compared here."""
    encode = []
    for text in ENCODE_SAMPLES:
        ids = tok(text, add_special_tokens=False).input_ids
        assert raw_tok.encode(text, add_special_tokens=False).ids == ids, text
        decoded = tok.decode(ids)
        assert raw_tok.decode(ids, skip_special_tokens=False) == decoded
        encode.append(
            {
                "text": text,
                "ids": ids,
                "tokens": tok.convert_ids_to_tokens(ids),
                "decoded": decoded,
                "roundtrip": decoded == text,
            }
        )

    hi = tok("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False).input_ids
    ni = tok("你", add_special_tokens=False).input_ids
    assert len(ni) >= 2, "expected 你 to take several byte-level tokens"
    cases = [
        (hi, False, "special tokens kept"),
        (hi, True, "special tokens skipped"),
        (ni[:-1], False, "incomplete UTF-8 sequence: decoded lossily to U+FFFD"),
        ([64, 1010, 65], False, "id 1010 is a model vocab row with no token: the tokenizer drops it"),
    ]
    decode = []
    for ids, skip, note in cases:
        text = tok.decode(ids, skip_special_tokens=skip)
        assert raw_tok.decode(ids, skip_special_tokens=skip) == text
        decode.append({"ids": ids, "skip_special_tokens": skip, "text": text, "note": note})
    return {"encode": encode, "decode": decode}


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather at a place.",
            "parameters": {
                "type": "object",
                "properties": {
                    "place": {"type": "string", "description": "Town or coordinates"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["place"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "count_ships",
            "description": "Ships seen since a given hour.",
            "parameters": {"type": "object", "properties": {"since_hour": {"type": "integer"}}, "required": []},
        },
    },
]

CHATS = [
    # (template, messages, add_generation_prompt, tools, what it covers)
    ("default", [{"role": "user", "content": "Hello!"}], True, None, "no system message: default one inserted"),
    (
        "default",
        [{"role": "system", "content": "You are a lighthouse keeper."}, {"role": "user", "content": "Any ships?"}],
        True,
        None,
        "explicit system message",
    ),
    (
        "default",
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3 + 3?"},
            {"role": "assistant", "content": "6"},
        ],
        False,
        None,
        "multi-turn ending with the assistant, no generation prompt",
    ),
    (
        "default",
        [
            {"role": "user", "content": "Name a bird."},
            {"role": "assistant", "content": "A gull."},
            {"role": "user", "content": "Another one?"},
        ],
        True,
        None,
        "multi-turn without system message, generation prompt",
    ),
    ("default", [{"role": "user", "content": "Hi there"}], False, None, "add_generation_prompt false"),
    (
        "default",
        [{"role": "user", "content": "你好！灯塔在哪里？ 🌊🚢 Crème brûlée, Łódź 👨‍👩‍👧"}],
        True,
        None,
        "non-ASCII content",
    ),
    (
        "default",
        [{"role": "system", "content": "\n  Be kind.  \n"}, {"role": "user", "content": "  \t spaced out \n\n"}],
        True,
        None,
        "content with surrounding whitespace: stripped by the template",
    ),
    (
        "tool_use",
        [
            {"role": "system", "content": "You watch the sea."},
            {"role": "user", "content": "What's the weather at Merrow Point?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"place": "Merrow Point"}}}
                ],
            },
            {"role": "tool", "content": '{"wind_kmh": 42, "sky": "cloudy"}'},
            {"role": "assistant", "content": "Windy, 42 km/h, and cloudy."},
            {"role": "user", "content": "Thanks!"},
        ],
        True,
        TOOLS,
        "tools rendered with tojson, a tool call and a tool response",
    ),
    (
        "tool_use",
        [{"role": "user", "content": "/think How many ships since noon?"}],
        True,
        TOOLS[1:],
        "tools without a system message; .startswith in the generation prompt",
    ),
    ("tool_use", [{"role": "user", "content": "No tools today."}], True, None, "tool_use template without tools"),
]

ERROR_CHAT = [{"role": "user", "content": "Beep?"}, {"role": "robot", "content": "Boop."}]


def render(tok, template, messages, add_generation_prompt, tools=None):
    return tok.apply_chat_template(
        messages, chat_template=template, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
    )


def chat_references(toks, raw_tok):
    """Rendered chats. The default template is rendered through all three folders' tokenizers
    (string in tokenizer_config.json, chat_template.jinja, named list) and must agree; the
    tool_use template exists only in tiny-sharded."""
    sharded = toks["tiny-sharded"]
    chats = []
    for template, messages, gen_prompt, tools, note in CHATS:
        if template == "default":
            texts = {render(t, None, messages, gen_prompt) for t in toks.values()}
            assert len(texts) == 1, texts
            text = texts.pop()
            assert text == render(sharded, "default", messages, gen_prompt)
        else:
            text = render(sharded, template, messages, gen_prompt, tools)
        ids = sharded(text, add_special_tokens=False).input_ids
        assert raw_tok.encode(text, add_special_tokens=False).ids == ids
        entry = {"template": template, "note": note, "messages": messages, "add_generation_prompt": gen_prompt}
        if tools is not None:
            entry["tools"] = tools
        entry.update({"text": text, "ids": ids})
        chats.append(entry)

    for name, t in toks.items():
        try:
            render(t, None, ERROR_CHAT, True)
        except Exception as e:  # jinja2 TemplateError raised by raise_exception
            error = {"type": type(e).__name__, "message": str(e)}
        else:
            raise AssertionError(f"{name}: rendering a 'robot' message did not fail")
    chats.append(
        {
            "template": "default",
            "note": "unsupported role: rendering raises via raise_exception",
            "messages": ERROR_CHAT,
            "add_generation_prompt": True,
            "error": error,
        }
    )
    return chats


def check_template_whitespace_insensitive():
    """The templates render the same with and without trim_blocks/lstrip_blocks, so a renderer
    that does not set them (unlike transformers) still matches the references."""
    import jinja2

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x):
        return json.dumps(x, ensure_ascii=False)

    for template, messages, gen_prompt, tools, _ in CHATS:
        source = DEFAULT_TEMPLATE if template == "default" else TOOL_USE_TEMPLATE
        outs = set()
        for trim in (False, True):
            env = jinja2.Environment(trim_blocks=trim, lstrip_blocks=trim)
            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = tojson
            outs.add(env.from_string(source).render(messages=messages, tools=tools, add_generation_prompt=gen_prompt))
        assert len(outs) == 1, (template, outs)


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def to_json(obj, indent=0):
    """JSON with lists of numbers on one line (token id lists would otherwise take a line each)."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {to_json(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list):
        if all(isinstance(x, (int, float, bool)) or x is None for x in obj):
            return json.dumps(obj)
        return "[\n" + ",\n".join(inner + to_json(x, indent + 1) for x in obj) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=HERE, help="output directory (default: this script's directory)")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)

    # CPU, f32, deterministic kernels: the references must not depend on the machine's GPU.
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # no dependence on the machine's core count (and no oversubscription)
    torch.set_default_dtype(torch.float32)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    tok_spec = train_tokenizer()
    raw_tok = Tokenizer.from_str(json.dumps(tok_spec))
    special_ids = {t: raw_tok.token_to_id(t) for t in SPECIAL_TOKENS}
    assert list(special_ids.values()) == [997, 998, 999], special_ids
    pad_id = special_ids["<|endoftext|>"]
    check_template_whitespace_insensitive()

    # Fixed inputs shared by all models (they share the tokenizer).
    enc = lambda text: raw_tok.encode(text, add_special_tokens=False).ids
    rows = [
        enc("The rock is still here, and so am I, said the keeper."),
        enc("<|im_start|>user\n灯塔 12345 🚀 façade<|im_end|>"),
    ]
    assert all(len(r) >= 11 for r in rows), [len(r) for r in rows]
    inputs = torch.tensor([r[:11] for r in rows], dtype=torch.int64)
    batch_prompts = [enc("Ships counted since noon:"), enc("Ada wrote three numbers in the green notebook every evening.")]
    assert len(batch_prompts[0]) != len(batch_prompts[1])

    tensors, toks, model_refs = {}, {}, {}
    for spec in MODELS:
        name = spec["name"]
        folder = os.path.join(out, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        write_tokenizer_files(spec, tok_spec, special_ids, folder)

        # The greedy prompt is a rendered chat, as an application would build it.
        tok = AutoTokenizer.from_pretrained(folder)
        chat = [{"role": "user", "content": "Tell me about the lighthouse."}]
        text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        greedy_prompt = tok(text, add_special_tokens=False).input_ids

        # Try seeds in order until greedy decoding is decisive (see MIN_MARGIN).
        seed = spec["seed"]
        while True:
            model = build_model(spec, seed)
            if check_margin(model, greedy_prompt, batch_prompts, pad_id) >= MIN_MARGIN:
                break
            seed += 1
        write_model_files(spec, model, folder)

        # References come from the folder as reloaded, which must match the in-memory model.
        tok, reloaded = load_folder(folder)
        for (k, a), (k2, b) in zip(sorted(model.state_dict().items()), sorted(reloaded.state_dict().items())):
            assert k == k2 and torch.equal(a, b), k
        assert reloaded.config.rope_parameters["rope_theta"] == spec["rope_theta"]
        assert reloaded.config.tie_word_embeddings == spec["tied"]
        toks[name] = tok
        ref = model_references(name, reloaded, inputs, greedy_prompt, batch_prompts, pad_id, tensors)
        ref = {
            "seed": seed,
            "folder": name,
            "num_hidden_layers": spec["layers"],
            "tie_word_embeddings": spec["tied"],
            "rope_theta": spec["rope_theta"],
            "weights_dtype": str(spec["dtype"]).removeprefix("torch."),
            **ref,
        }
        model_refs[name] = ref
        print(
            f"{name}: seed {seed}, greedy margin {ref['greedy']['min_margin']:.3f}, "
            f"batch margin {ref['batch_greedy']['min_margin']:.3f}, matches_unbatched {ref['batch_greedy']['matches_unbatched']}"
        )

    # Each folder's tokenizer.json (legacy or pair merges) loads to the same tokenizer.
    for spec in MODELS:
        from_file = Tokenizer.from_file(os.path.join(out, spec["name"], "tokenizer.json"))
        for text in ENCODE_SAMPLES:
            assert from_file.encode(text, add_special_tokens=False).ids == raw_tok.encode(text, add_special_tokens=False).ids

    reference = {
        "about": "Written by make_fixtures.py; see its docstring. Logits are in reference.safetensors.",
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "safetensors": safetensors.__version__,
            "special_tokens": special_ids,
            "tokenizer_len": raw_tok.get_vocab_size(with_added_tokens=True),
            "model_vocab_size": MODEL_VOCAB,
            "computed_on": "cpu, float32, eager attention, 1 thread, torch.use_deterministic_algorithms(True)",
        },
        "models": model_refs,
        "tokenizer": tokenizer_references(toks["tiny-tied"], raw_tok),
        "chats": chat_references(toks, raw_tok),
    }
    save_file(dict(sorted(tensors.items())), os.path.join(out, "reference.safetensors"))
    with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
        f.write(to_json(reference) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

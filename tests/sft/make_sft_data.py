"""Generate the synthetic chat SFT data set: add one to each digit (9 wraps to 0).

Task: the user writes "Add one <5 distinct digits>", the assistant answers with every digit
increased by one modulo 10, e.g.
  user: "Add one 10964"   assistant: "21075"
Each digit is one token of the fixture tokenizer (its pre-tokenizer splits digits one by one),
so the rendered conversation is 48 or 49 tokens with the template's default system message.
The digits of a prompt are distinct: the model then learns a content-based copy (find the input
digit after the one it just used) plus a per-digit map, which a 2-layer model picks up in a few
hundred steps; with repeated digits the copy is ambiguous and accuracy stalls around 80%.
A rule, not facts: the held-out digit strings never occur in training (30240 possible strings).

Writes (into --out, default: this script's directory):
  train.jsonl  --train lines (default 4000). Most are {"messages": [user, assistant]} with no
               system message (the chat template inserts its default one); about 20% carry an
               explicit system message; about 20% are in the conversational prompt/completion
               form {"prompt": [system?, user], "completion": [assistant]}.
  eval.jsonl   --eval lines (default 200), always {"messages": [user, assistant]}, no system
               message; the digit strings of eval and train are disjoint.
Deterministic: the same arguments give the same files (Python's random module only).

Run:  python3 make_sft_data.py [--out DIR] [--train N] [--eval N] [--seed S]
"""

import argparse
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS = 5
SYSTEM_FRACTION = 0.2
PC_FRACTION = 0.2
SYSTEM_PROMPT = "Add one to each digit."


def digit_string(rng):
    return "".join(rng.sample("0123456789", DIGITS))


def turn(s):
    answer = "".join(str((int(c) + 1) % 10) for c in s)
    return {"role": "user", "content": f"Add one {s}"}, {"role": "assistant", "content": answer}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=HERE)
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--eval", type=int, default=200)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()
    rng = random.Random(args.seed)

    # Held-out strings first, then training strings that are not among them (all distinct).
    seen = set()

    def fresh():
        while True:
            s = digit_string(rng)
            if s not in seen:
                seen.add(s)
                return s

    eval_strings = [fresh() for _ in range(args.eval)]
    train_strings = [fresh() for _ in range(args.train)]
    assert not set(eval_strings) & set(train_strings)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "eval.jsonl"), "w") as f:
        for s in eval_strings:
            f.write(json.dumps({"messages": list(turn(s))}) + "\n")
    with open(os.path.join(args.out, "train.jsonl"), "w") as f:
        for s in train_strings:
            user, assistant = turn(s)
            prompt = [user]
            if rng.random() < SYSTEM_FRACTION:
                prompt = [{"role": "system", "content": SYSTEM_PROMPT}, user]
            if rng.random() < PC_FRACTION:
                row = {"prompt": prompt, "completion": [assistant]}
            else:
                row = {"messages": prompt + [assistant]}
            f.write(json.dumps(row) + "\n")
    print(f"wrote {args.train} train and {args.eval} eval lines to {args.out}")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Trains the generation example: a character-level GPT (the `gpt` recipe) on Debian's fortunes.

    apt-get install fortunes            # /usr/share/games/fortunes: the text, nothing downloaded
    /usr/bin/python3 examples/fortunes/make_fortunes.py [--steps N]

Data: the prose-and-quotes files of the `fortunes` package (FILES below, 1.8 MB: not the
ASCII art, song lyrics, IRC logs, code or Zippy), in that order, fortunes kept whole and
separated by "%" lines as in the files: one kind of text is what a model this small can learn. Tokens are bytes: a character's id is its ASCII code (vocab_size 128); the few
non-ASCII bytes become '?'. The last 5% of the text is held out for the validation loss.

Model: shared/reference/gpt_reference.py's GPT(vocab_size=128, context=256, d_model=128,
nhead=4, num_layers=4, dim_feedforward=512), 0.84M parameters, the network file what
`tessera recipe gpt` writes for the same arguments (fortunes.json). Trained with AdamW on
random 256-character windows, 16 per step, cosine learning rate from 3e-3, embeddings
initialised N(0, 0.02^2) as GPT-2's. Weights are stored
as float16 (1.7 MB; tessera converts them on load) and the reference below is computed with
the float16-rounded weights, so both sides run the same model.

Writes, beside this script:
  fortunes.safetensors   the state_dict in float16, with fortunes.json in its metadata under
                         tessera.network
  prompt.safetensors     ids [2, 16] int64: two prompts (the start of a fortune)
  greedy.safetensors     ids [2, 16 + 200]: PyTorch's greedy continuation of each, by full
                         recomputation (argmax of the last logits, appended, 200 times); every
                         step's top-two margin is checked to be at least 1e-3, so an equally
                         accurate float32 computation cannot pick another token
fortunes.json must exist first: `tessera recipe gpt --set vocab_size=128 --set context=256
--set d_model=128 --set nhead=4 --set num_layers=4 --set dim_feedforward=512
--output examples/fortunes/fortunes.json`. Deterministic: torch.manual_seed(0), torch on one
thread and OpenBLAS on two. The default 5000 steps took 84 minutes on the 2-core Zen 3 machine
(with other work beside it; ~0.7 s a step alone): validation loss 4.84 -> 1.43 nats per
character (2400 steps had reached 1.55, and their samples read half as well).
"""
import argparse
import math
import os
import sys
import time

# The matrix products are 80% of a training step and run in OpenBLAS: its two threads with torch
# on one (set in main) took 0.69 s a step on the 2-core Zen 3; OpenBLAS on one thread and torch on
# two 0.83 s; both on two 1.2 s (they oversubscribe the cores).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
from gen_model_fixtures import gpt_class  # noqa: E402
from st_format import save_file  # noqa: E402

FORTUNES = "/usr/share/games/fortunes"
FILES = ["computers", "cookie", "definitions", "education", "food", "fortunes", "goedel",
         "humorists", "kids", "law", "literature", "love", "magic", "medicine", "men-women",
         "miscellaneous", "news", "people", "pets", "platitudes", "politics", "science", "sports",
         "wisdom", "work"]
CONFIG = dict(vocab_size=128, context=256, d_model=128, nhead=4, num_layers=4,
              dim_feedforward=512)
PROMPTS = ["%\nThe best way to", "%\nA computer is a"]
NEW_TOKENS = 200


def corpus():
    names = FILES
    missing = [n for n in names if not os.path.isfile(os.path.join(FORTUNES, n))]
    if missing:
        sys.exit(f"{FORTUNES} lacks {', '.join(missing)}: apt-get install fortunes")
    text = bytearray()
    for n in names:
        with open(os.path.join(FORTUNES, n), "rb") as f:
            data = f.read()
        text += b"%\n" + data.rstrip(b"%\n") + b"\n"
    return bytes(b if b < 128 else ord("?") for b in text), names


def encode(s):
    return torch.tensor([list(s.encode("ascii"))], dtype=torch.int64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--out", default=HERE, help="where the files go (default: beside this)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    text, names = corpus()
    data = torch.tensor(list(text), dtype=torch.int64)
    split = int(len(data) * 0.95)
    train, val = data[:split], data[split:]
    print(f"{len(names)} files, {len(data)} characters ({split} to train)")

    GPT = gpt_class()
    model = GPT(**CONFIG)
    # GPT-2's embedding init: with nn.Embedding's N(0, 1) the tied head starts at logits of
    # ~10 and a loss of 70.
    with torch.no_grad():
        model.tok.weight.normal_(0.0, 0.02)
        model.pos.weight.normal_(0.0, 0.02)
    print(f"{sum(p.numel() for p in model.parameters())} parameters")
    T, B = CONFIG["context"], 16
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.99))
    lr = lambda step: 3e-3 * (min(1.0, (step + 1) / 100) *
                              (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps))))

    def batch(src, gen=None):
        i = torch.randint(0, len(src) - T - 1, (B,), generator=gen)
        x = torch.stack([src[j:j + T] for j in i])
        y = torch.stack([src[j + 1:j + T + 1] for j in i])
        return x, y

    def val_loss():
        model.eval()
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            losses = [torch.nn.functional.cross_entropy(
                model(x).reshape(-1, 128), y.reshape(-1)).item()
                for x, y in (batch(val, gen) for _ in range(8))]
        model.train()
        return sum(losses) / len(losses)

    start = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr(step)
        x, y = batch(train)
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 128), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 250 == 0 or step == args.steps - 1:
            print(f"step {step}: train {loss.item():.3f} val {val_loss():.3f} "
                  f"({time.time() - start:.0f} s)", flush=True)

    # The shipped model: float16 weights; the reference runs them in float32.
    model.eval()
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    model.load_state_dict({k: v.float() for k, v in state.items()})
    prompts = torch.cat([encode(p) for p in PROMPTS])
    seq = prompts.clone()
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(seq)[:, -1, :]
            top2 = logits.topk(2, dim=-1).values
            margin = (top2[:, 0] - top2[:, 1]).min().item()
            if margin < 1e-3:
                sys.exit(f"greedy step {seq.shape[1]}: top-two margin {margin:.2e} < 1e-3; "
                         "choose other prompts")
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    for row in seq:
        print("----\n" + bytes(row.tolist()).decode("ascii"))

    with open(os.path.join(HERE, "fortunes.json")) as f:
        network = f.read()
    save_file(state, os.path.join(args.out, "fortunes.safetensors"),
              metadata={"format": "pt", "tessera.network": network})
    save_file({"ids": prompts}, os.path.join(args.out, "prompt.safetensors"))
    save_file({"ids": seq.contiguous()}, os.path.join(args.out, "greedy.safetensors"))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Trains the shipped example: a small torchvision VisionTransformer that reads handwritten digits.

    /usr/bin/python3 examples/digits/make_digits.py

Data: scikit-learn's bundled digits (1,797 8x8 grey images, 16 levels; python3-sklearn ships
them, nothing is downloaded), split 80/20 stratified (random_state 0): 1,437 to train, 360 held
out. Pixels are scaled to [0, 1] and the grey channel repeated three times (VisionTransformer's
patch projection takes RGB).

Model: torchvision.models.VisionTransformer(image_size=8, patch_size=2, num_layers=2,
num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=10): 16 patch tokens and the class token;
the network file is what `tessera recipe vision_transformer` writes for the same arguments
(vit_digits.json, committed; scripts/run_example.sh checks it is still what the recipe writes).

Writes, beside this script (the layout every examples/<name>/ has, tests/test_cli.cpp):
  digits.safetensors        model.state_dict() as is, with digits.json in its metadata under
                            tessera.network: one file that is the whole model
  input.safetensors         x [360, 3, 8, 8] float32: the held-out images
  expected.safetensors      y [360, 10]: PyTorch's eval-mode logits for them
  labels.safetensors        labels [360] int64: the true digits
digits.json must exist first: `tessera recipe vision_transformer --set image_size=8
--set patch_size=2 --set num_layers=2 --set num_heads=4 --set hidden_dim=32 --set mlp_dim=64
--set num_classes=10 --output examples/digits/digits.json`.
Deterministic: torch.manual_seed(0), one thread.
"""
import os
import sys

import numpy as np
import torch
import torchvision
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
from st_format import save_file  # noqa: E402

CONFIG = dict(image_size=8, patch_size=2, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64,
              num_classes=10)


def images(x):
    t = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    return t.expand(-1, 3, -1, -1).contiguous()


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.2, random_state=0, stratify=digits.target)
    xtr, xte = images(x_train), images(x_test)
    ytr, yte = torch.tensor(y_train, dtype=torch.int64), torch.tensor(y_test, dtype=torch.int64)

    model = torchvision.models.VisionTransformer(**CONFIG)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    epochs = 80
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=epochs * 23)
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), 64):
            idx = perm[i:i + 64]
            batch = xtr[idx]
            # Shifts by up to one pixel: a small augmentation for a small training set.
            dx, dy = np.random.randint(-1, 2, size=2)
            batch = torch.roll(batch, shifts=(int(dy), int(dx)), dims=(2, 3))
            loss = torch.nn.functional.cross_entropy(model(batch), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        if epoch % 20 == 19:
            model.eval()
            with torch.no_grad():
                acc = (model(xte).argmax(1) == yte).float().mean().item()
            print(f"epoch {epoch + 1}: loss {loss.item():.3f}, held-out accuracy {acc:.4f}")

    model.eval()
    with torch.no_grad():
        logits = model(xte)
    acc = (logits.argmax(1) == yte).float().mean().item()
    print(f"held-out accuracy {acc:.4f} ({int(round(acc * len(yte)))}/{len(yte)}), "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    with open(os.path.join(HERE, "digits.json")) as f:
        network = f.read()
    save_file(state, os.path.join(HERE, "digits.safetensors"),
              metadata={"format": "pt", "tessera.network": network})
    save_file({"x": xte}, os.path.join(HERE, "input.safetensors"))
    save_file({"y": logits.contiguous()}, os.path.join(HERE, "expected.safetensors"))
    save_file({"labels": yte}, os.path.join(HERE, "labels.safetensors"))


if __name__ == "__main__":
    np.random.seed(0)
    main()

"""The whole models benchmarks/models.py times: one dict, standard library only.

Shared by the runner (which must not import torch) and the torch-side helpers (prepare.py,
torch_model.py). Each entry:
  arch     the `tessera recipe` architecture (interfaces.md section 5)
  sets     its --set arguments (the PyTorch constructor's keyword arguments)
  inputs   name -> {"shape": [...], "dtype": "F32" | "I64", "high": N}: the recipe's input names,
           in the order the module's forward takes them; I64 ids are drawn in [0, high)
  outputs  the recipe's output names, in the order the module returns them (one here)
  what     one line for the report header
"""

GPT_SETS = {"vocab_size": 8192, "d_model": 512, "nhead": 8, "num_layers": 6, "dim_feedforward": 2048}

MODELS = {
    "vit_b_16": {
        "arch": "vit_b_16", "sets": {},
        "inputs": {"x": {"shape": [1, 3, 224, 224], "dtype": "F32"}},
        "outputs": ["y"],
        "what": "torchvision.models.vit_b_16(), 224x224 image, B=1",
    },
    "swin_t": {
        "arch": "swin_t", "sets": {},
        "inputs": {"x": {"shape": [1, 3, 224, 224], "dtype": "F32"}},
        "outputs": ["y"],
        "what": "torchvision.models.swin_t(), 224x224 image, B=1",
    },
    "gpt": {
        "arch": "gpt", "sets": GPT_SETS,
        "inputs": {"ids": {"shape": [1, 512], "dtype": "I64", "high": GPT_SETS["vocab_size"]}},
        "outputs": ["logits"],
        "what": "GPT(" + ", ".join(f"{k}={v}" for k, v in GPT_SETS.items())
                + ") of tests/fixtures/gpt_reference.py, prefill of T=512 ids, B=1",
    },
    "transformer": {
        "arch": "transformer", "sets": {},
        "inputs": {"src": {"shape": [1, 128, 512], "dtype": "F32"},
                   "tgt": {"shape": [1, 128, 512], "dtype": "F32"}},
        "outputs": ["y"],
        "what": "torch.nn.Transformer(batch_first=True) (base: 6+6 layers, d_model 512) "
                "called with the causal tgt_mask, B=1, S=T=128",
    },
}

# Bump when prepare.py changes what it writes: cached work directories are then rebuilt.
PREPARE_VERSION = 1
SEED = 0


def cache_key(name):
    m = MODELS[name]
    return {"model": name, "arch": m["arch"], "sets": m["sets"], "inputs": m["inputs"],
            "outputs": m["outputs"], "seed": SEED, "prepare_version": PREPARE_VERSION}

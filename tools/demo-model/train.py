#!/usr/bin/env python3
"""Train int4serve's demo model: a small Llama (GQA, head_dim 64) on the King
James Bible, with its own byte-level BPE tokenizer, exported as a Hugging
Face folder that int4serve and transformers both load.

  train.py --corpus DIR --out DIR [--seed 1234] [--steps 900] [--batch 32]
           [--dropout 0.2] [--lr 1.5e-3]

DIR/train.txt and DIR/heldout.txt come from corpus.py (documents, one per
chapter, separated by blank lines). Needs PyTorch with a CUDA GPU,
tokenizers, safetensors and transformers (the check at the end).

What it does, all seeded:
1. A byte-level BPE tokenizer (tokenizers' BpeTrainer, VOCAB ids, the 256
   byte symbols always in, "<s>" = 0 and "</s>" = 1) trained on train.txt
   alone; its post-processor puts "<s>" before every text.
2. The model (CONFIG) trained on random SEQ-token windows of the training
   stream, every chapter as <s> text </s>: AdamW, warm-up then cosine decay,
   bf16 autocast, dropout on the residual branches. Every EVAL_EVERY steps
   the held-out loss is measured (the windows of heldout_windows()) and the
   best state so far is kept: that one is exported (early stopping).
3. Export: config.json, model.safetensors (fp16, tied embeddings),
   tokenizer.json, tokenizer_config.json, generation_config.json and
   training.json (seed, split, steps, loss curve, held-out figures).
4. The check: transformers loads the folder (fp32, eager attention) and its
   held-out perplexity must equal this script's own model's within 1e-4
   relative; its greedy continuations of a few prompts are recorded in
   reference.json with the held-out figures that tests compare against.

Held-out perplexity, the definition every tool here shares: the held-out text
encoded without special tokens; window k is "<s>" followed by ids
[k (C - 1), (k + 1)(C - 1)); each window is scored alone, on its C - 1
predicted ids; perplexity = exp(mean NLL over every predicted id); only
whole windows count.
"""
import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 4096
SEQ = 512
EVAL_EVERY = 100
CONFIG = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
              num_attention_heads=6, num_key_value_heads=2, rope_theta=10000.0,
              rms_norm_eps=1e-5, max_position_embeddings=SEQ)
PROMPTS = ["In the beginning", "And the LORD said unto Moses,", "Psalms 23\n",
           "Blessed are the", "Once upon a time"]


def docs_of(path):
    with open(path, encoding="ascii") as f:
        return [d.strip("\n") for d in f.read().split("\n\n") if d.strip()]


def train_tokenizer(docs):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False,
                             special_tokens=["<s>", "</s>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=tr)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)])
    assert tok.token_to_id("<s>") == 0 and tok.token_to_id("</s>") == 1
    return tok


def fnv1a(ids):
    """FNV-1a 32 over the ids as little-endian uint32: the tests' fingerprint."""
    h = 0x811C9DC5
    for b in np.asarray(ids, dtype="<u4").tobytes():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


# ---- the model: Llama exactly as transformers computes it --------------------------
class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope(x, cos, sin):  # x [B, H, T, D], transformers' rotate_half convention
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * cos + rot * sin


class Block(nn.Module):
    def __init__(self, c, drop):
        super().__init__()
        d, self.nh, self.nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = d // self.nh
        self.input_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.q_proj = nn.Linear(d, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.gate_proj = nn.Linear(d, c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(d, c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], d, bias=False)
        self.drop = nn.Dropout(drop)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = self.nh // self.nkv  # query head j reads KV head j // rep, as repeat_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.o_proj(a.transpose(1, 2).reshape(B, T, -1)))
        h = self.post_attention_layernorm(x)
        return x + self.drop(self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)))


class Llama(nn.Module):
    def __init__(self, c, vocab, drop):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(vocab, c["hidden_size"])
        self.layers = nn.ModuleList(Block(c, drop) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.drop = nn.Dropout(drop)
        hd = c["hidden_size"] // c["num_attention_heads"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        self.register_buffer("inv_freq", inv, persistent=False)
        std = 0.02
        for n, p in self.named_parameters():
            if p.dim() == 2:
                s = std / math.sqrt(2 * c["num_hidden_layers"]) if n.endswith(
                    ("o_proj.weight", "down_proj.weight")) else std
                nn.init.normal_(p, 0.0, s)

    def forward(self, ids):
        T = ids.shape[1]
        pos = torch.arange(T, device=ids.device).float()
        f = torch.outer(pos, self.inv_freq)
        emb = torch.cat((f, f), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.drop(self.embed_tokens(ids))
        for l in self.layers:
            x = l(x, cos.to(x.dtype), sin.to(x.dtype))
        return F.linear(self.norm(x), self.embed_tokens.weight)  # tied lm_head


def heldout_windows(ids, ctx, bos=0):
    n = len(ids) // (ctx - 1)
    w = np.empty((n, ctx), dtype=np.int64)
    for k in range(n):
        w[k, 0] = bos
        w[k, 1:] = ids[k * (ctx - 1):(k + 1) * (ctx - 1)]
    return torch.from_numpy(w)


@torch.no_grad()
def nll_sum(logits_fn, windows, dev, bs=16):
    tot, n = 0.0, 0
    for i in range(0, len(windows), bs):
        w = windows[i:i + bs].to(dev)
        lg = logits_fn(w).float()
        tot += F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), w[:, 1:].reshape(-1),
                               reduction="sum").item()
        n += w[:, 1:].numel()
    return tot, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=900)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--max-seconds", type=float, default=330)
    a = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"

    train_docs = docs_of(os.path.join(a.corpus, "train.txt"))
    with open(os.path.join(a.corpus, "heldout.txt"), encoding="ascii") as f:
        heldout_text = f.read()
    tok = train_tokenizer(train_docs)
    stream = []
    for d in train_docs:
        stream += [0] + tok.encode(d, add_special_tokens=False).ids + [1]
    stream = torch.tensor(stream, dtype=torch.int64, device=dev)
    held = tok.encode(heldout_text, add_special_tokens=False).ids
    ev512 = heldout_windows(held, SEQ)
    print(f"tokenizer: {tok.get_vocab_size()} ids; train {len(stream)} tokens, "
          f"held-out {len(held)} ({len(ev512)} windows of {SEQ}); {time.time() - t0:.1f} s",
          flush=True)

    model = Llama(CONFIG, VOCAB, a.dropout).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), fused=True)
    g = torch.Generator(device=dev)
    g.manual_seed(a.seed)

    def lr_at(s):
        if s < a.warmup:
            return a.lr * (s + 1) / a.warmup
        p = (s - a.warmup) / max(1, a.steps - a.warmup)
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    def eval_loss():
        model.eval()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            t, n = nll_sum(model, ev512, dev)
        model.train()
        return t / n

    curve, evals, best, run_loss = [], [], None, None
    steps_done, t_first = 0, None
    step = 0
    while step < a.steps:
        if step == 10:
            torch.cuda.synchronize()
            t_first = time.time()
        if step == 40:  # fit the schedule to the time budget, so it always ends decayed
            torch.cuda.synchronize()
            dt = (time.time() - t_first) / 30
            fit = int((a.max_seconds - (time.time() - t0)) / (dt * 1.08)) + step
            if fit < a.steps:
                print(f"{dt * 1e3:.1f} ms a step: {fit} steps fit in --max-seconds, not "
                      f"{a.steps}", flush=True)
                a.steps = fit
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step)
        off = torch.randint(0, len(stream) - SEQ - 1, (a.batch,), device=dev, generator=g)
        idx = off[:, None] + torch.arange(SEQ + 1, device=dev)[None]
        xy = stream[idx]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lg = model(xy[:, :-1])
        loss = F.cross_entropy(lg.float().reshape(-1, VOCAB), xy[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        steps_done = step + 1
        if step % 25 == 0 or step == a.steps - 1:
            li = loss.item()
            run_loss = li if run_loss is None else 0.8 * run_loss + 0.2 * li
            curve.append([step, round(li, 4)])
        if steps_done % EVAL_EVERY == 0 or steps_done == a.steps:
            el = eval_loss()
            evals.append([steps_done, round(el, 4)])
            print(f"step {steps_done}: train {run_loss:.4f} held-out {el:.4f} "
                  f"lr {lr_at(step):.2e} {time.time() - t0:.0f} s", flush=True)
            if best is None or el < best[1]:
                best = (steps_done, el, {k: v.detach().clone() for k, v in
                                         model.state_dict().items()})
        if time.time() - t0 > a.max_seconds:
            print(f"stopping at step {steps_done}: --max-seconds {a.max_seconds}", flush=True)
            if not evals or evals[-1][0] != steps_done:
                el = eval_loss()
                evals.append([steps_done, round(el, 4)])
                if best is None or el < best[1]:
                    best = (steps_done, el, {k: v.detach().clone() for k, v in
                                             model.state_dict().items()})
            break
        step += 1
    train_seconds = time.time() - t0
    model.load_state_dict(best[2])
    model.eval()

    # ---- export ----------------------------------------------------------------------
    from safetensors.torch import save_file
    os.makedirs(a.out, exist_ok=True)
    tensors = {}
    for n, p in model.state_dict().items():
        name = "model." + n
        name = name.replace(".gate_proj", ".mlp.gate_proj").replace(".up_proj", ".mlp.up_proj")
        name = name.replace(".down_proj", ".mlp.down_proj")
        for pr in ("q_proj", "k_proj", "v_proj", "o_proj"):
            name = name.replace("." + pr, ".self_attn." + pr)
        tensors[name] = p.detach().to(torch.float16).contiguous().cpu()
    save_file(tensors, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
           **CONFIG, "head_dim": CONFIG["hidden_size"] // CONFIG["num_attention_heads"],
           "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
           "attention_dropout": 0.0, "rope_scaling": None, "tie_word_embeddings": True,
           "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float16",
           "initializer_range": 0.02, "use_cache": True}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1}, f, indent=2)
        f.write("\n")
    tok.save(os.path.join(a.out, "tokenizer.json"))
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "add_bos_token": True, "model_max_length": SEQ}, f,
                  indent=2)
        f.write("\n")

    # ---- the check against transformers, and the tests' reference figures ----------
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(a.out, dtype=torch.float32,
                                              attn_implementation="eager").to(dev).eval()
    ref = {"heldout": {"tokens": len(held), "fnv1a32": fnv1a(held)}, "perplexity": {},
           "greedy": []}
    model32 = model.float()
    # fp16 weights, as exported, on both sides
    model32.load_state_dict({k: v.to(torch.float16).float() for k, v in
                             model32.state_dict().items()})
    for ctx, nwin in ((256, 16), (256, None), (512, None)):
        w = heldout_windows(held, ctx)
        if nwin:
            w = w[:nwin]
        t_hf, n = nll_sum(lambda x: hf(x).logits, w, dev)
        t_own, _ = nll_sum(model32, w, dev)
        p_hf, p_own = math.exp(t_hf / n), math.exp(t_own / n)
        key = f"ctx{ctx}_windows{len(w)}"
        ref["perplexity"][key] = {"ctx": ctx, "windows": len(w), "predicted": n,
                                  "ppl_fp32": p_hf, "nll_fp32": t_hf / n}
        print(f"held-out {key}: transformers {p_hf:.5f}, own {p_own:.5f}", flush=True)
        assert abs(p_hf - p_own) <= 1e-4 * p_hf, "export does not match the trained model"
    for p in PROMPTS:
        ids = tok.encode(p).ids
        out = hf.generate(torch.tensor([ids], device=dev), max_new_tokens=32, do_sample=False,
                          eos_token_id=1, pad_token_id=1)
        gen = out[0, len(ids):].tolist()
        with torch.no_grad():
            lg = hf(out[:, :-1]).logits[0, len(ids) - 1:].float()
        top2 = lg.topk(2, dim=-1).values
        ref["greedy"].append({"prompt": p, "prompt_ids": ids, "ids": gen,
                              "text": tok.decode(gen),
                              "min_top2_gap": round((top2[:, 0] - top2[:, 1]).min().item(), 5)})
        print(f"{p!r} -> {tok.decode(gen)!r}", flush=True)
    for s in ["In the beginning God created the heaven and the earth.",
              "  Verily, verily, I say unto thee\n\nAmen. 1611 caf\u00e9 \U0001F600"]:
        ref.setdefault("tokenize", []).append({"text": s, "ids": tok.encode(s).ids})
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    split_path = os.path.join(a.corpus, "split.json")
    split = json.load(open(split_path)) if os.path.exists(split_path) else None
    log = {"data": split, "seed": a.seed, "steps_run": steps_done, "steps_planned": a.steps,
           "batch": a.batch, "seq": SEQ, "lr": a.lr, "warmup": a.warmup,
           "schedule": "linear warm-up, cosine to 0.1 lr", "dropout": a.dropout,
           "weight_decay": 0.1, "optimizer": "AdamW betas (0.9, 0.95), clip 1.0",
           "precision": "bf16 autocast, fp32 master weights; exported fp16",
           "parameters": n_params, "vocab": VOCAB, "config": CONFIG,
           "tokens": {"train": int(len(stream)), "heldout": len(held)},
           "best_step": best[0], "best_heldout_loss": round(best[1], 4),
           "train_seconds": round(train_seconds, 1),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "loss_curve": curve, "heldout_curve": evals}
    with open(os.path.join(a.out, "training.json"), "w") as f:
        json.dump(log, f)
        f.write("\n")
    print(f"done: {n_params} parameters, best step {best[0]} held-out loss {best[1]:.4f}, "
          f"{time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()

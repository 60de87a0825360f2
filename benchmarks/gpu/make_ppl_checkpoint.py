"""Make a small local Hugging Face Llama checkpoint for `tracestory eval ppl` on a machine with no
downloads: a word-level tokenizer built from a local text, a ~20 M-parameter Llama, trained for
``--seconds`` on the first 90% of the text (so perplexity is far below the vocabulary size and
precision effects are visible), saved with its tokenizer. The last 10% is written as the
held-out text to score.

    python benchmarks/gpu/make_ppl_checkpoint.py --text corpus.txt --out /tmp/ckpt --heldout /tmp/heldout.txt
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--vocab", type=int, default=8000)
    args = ap.parse_args()
    text = open(args.text, encoding="utf-8", errors="replace").read()
    cut = int(len(text) * 0.9)
    train_text, held = text[:cut], text[cut:]
    open(args.heldout, "w").write(held)

    tk = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.train_from_iterator([train_text], trainers.WordLevelTrainer(vocab_size=args.vocab, special_tokens=["[UNK]"]))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")
    tok.save_pretrained(args.out)

    cfg = transformers.LlamaConfig(vocab_size=tk.get_vocab_size(), hidden_size=512, intermediate_size=1408,
                                   num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
                                   max_position_embeddings=1024)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).cuda()
    ids = torch.tensor(tk.encode(train_text).ids, device="cuda")
    seq, batch = 256, 32
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    t0, step = time.time(), 0
    while time.time() - t0 < args.seconds:
        starts = torch.randint(0, len(ids) - seq - 1, (batch,), device="cuda")
        x = torch.stack([ids[s:s + seq] for s in starts.tolist()])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 100 == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    print(f"trained {step} steps in {time.time() - t0:.0f} s; {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params;"
          f" train tokens {len(ids)}; vocab {cfg.vocab_size}")
    model.save_pretrained(args.out)


if __name__ == "__main__":
    main()

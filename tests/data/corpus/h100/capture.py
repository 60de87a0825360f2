"""Capture small torch.profiler (Kineto) traces of other people's model code on a lent GPU machine.

The models come from Hugging Face ``transformers`` (built from a config, random weights, nothing
downloaded), ``torchvision.models`` (no weights) and ``diffusers`` (a small UNet2DConditionModel
config); the recommender is a plain ``torch.nn.EmbeddingBag`` + MLP model written here (torchrec is
not installed on the lent machine). Every trace uses plain ``torch.profiler.profile`` with
``record_shapes=True``, ``with_stack=False``, ``profile_memory=False`` and a schedule of one
warm-up step and one or two active steps; nothing else is labelled (no ``record_function``).

Usage on the GPU machine:

    python3 capture.py all --out DIR      # the first call's parts, in lanes over GPUs 0..3, each under `timeout`
    python3 capture.py all --parts llama_train_compile,whisper_generate,resnet50_graph_capture --out DIR
                                          # the second call's parts, one lane per GPU
    python3 capture.py part NAME --out DIR  # one part on the visible GPU (the lanes call this)

``all`` prints the versions (also written to DIR/versions.json) and runs every part as its own
process under ``timeout``; a part that fails or runs out of time leaves the others alone. The
2-rank DDP part runs under ``torchrun --nproc_per_node 2``. Each trace is written as
``DIR/<part>.pt.trace.json.gz`` (``DIR/ddp_resnet50_train/rank<r>.pt.trace.json.gz`` for DDP).
"""

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.abspath(__file__)
# "cpu" makes a quick local check of the model code possible (no GPU kernels then)
DEV = os.environ.get("CAPTURE_DEVICE", "cuda")

# part name -> (timeout in seconds, kind of launch)
PARTS = {
    "llama_generate": 150,
    "gpt2_train": 150,
    "bert_infer_compile": 300,
    "resnet50_train": 150,
    "resnet50_infer_cudagraphs": 300,
    "vit_b_16_infer": 150,
    "whisper_encoder_infer": 150,
    "unet2d_infer": 150,
    "dlrm_plain_train": 150,
    "ddp_resnet50_train": 200,
    # second call
    "llama_train_compile": 300,
    "whisper_generate": 150,
    "resnet50_graph_capture": 150,
}

# lanes run side by side; each lane runs its parts one after another on its GPUs
# (the first call ran these; `all --parts a,b,c` runs the named parts instead, one lane per GPU)
LANES = [
    ("0", ["resnet50_infer_cudagraphs", "llama_generate", "whisper_encoder_infer"]),
    ("1", ["bert_infer_compile", "gpt2_train", "vit_b_16_infer"]),
    ("2,3", ["ddp_resnet50_train", "resnet50_train", "unet2d_infer", "dlrm_plain_train"]),
]


def _gzip(src, dst):
    with open(src, "rb") as f_in, open(dst, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as f_out:
            shutil.copyfileobj(f_in, f_out)
    os.remove(src)


def profiled(step_fn, out_path, active=1):
    """Run step_fn under torch.profiler: 1 wait, 1 warm-up, `active` recorded steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    written = []

    def on_ready(prof):
        tmp = out_path[: -len(".gz")]
        prof.export_chrome_trace(tmp)
        _gzip(tmp, out_path)
        written.append(out_path)

    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=1, warmup=1, active=active, repeat=1),
        on_trace_ready=on_ready,
        record_shapes=True,
        with_stack=False,
        profile_memory=False,
    ) as prof:
        for _ in range(2 + active):
            step_fn()
            if DEV == "cuda":
                torch.cuda.synchronize()
            prof.step()
    assert written, "profiler wrote no trace"
    print(f"wrote {out_path} ({os.path.getsize(out_path)} bytes)", flush=True)


# ---------------------------------------------------------------- parts


def part_llama_generate(out):
    """transformers LlamaForCausalLM (4 small layers, GQA), bf16, eager: one generate() per step."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                      num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).to(DEV, torch.bfloat16).eval()
    ids = torch.randint(3, 32000, (4, 128), device=DEV)
    mask = torch.ones_like(ids)

    def step():
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=24,
                           min_new_tokens=24, do_sample=False, pad_token_id=0)

    profiled(step, out, active=1)


def part_gpt2_train(out):
    """transformers GPT2LMHeadModel (6 layers, d=768), bf16 autocast, AdamW, eager training."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=512, vocab_size=50257)
    model = GPT2LMHeadModel(cfg).to(DEV).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (8, 256), device=DEV)

    def step():
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    profiled(step, out, active=2)


def part_bert_infer_compile(out):
    """transformers BertModel (6 layers, d=768), fp16, torch.compile (default mode), inference."""
    import torch
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=3072)
    model = BertModel(cfg).to(DEV, torch.float16).eval()
    cmodel = torch.compile(model)
    ids = torch.randint(0, cfg.vocab_size, (16, 128), device=DEV)
    mask = torch.ones_like(ids)

    def step():
        with torch.inference_mode():
            cmodel(input_ids=ids, attention_mask=mask)

    for _ in range(3):  # compile outside the profiled window
        step()
    torch.cuda.synchronize()
    profiled(step, out, active=2)


def part_resnet50_train(out):
    """torchvision resnet50 (no weights), channels_last, bf16 autocast, SGD, eager training."""
    import torch
    import torchvision

    model = torchvision.models.resnet50(weights=None).to(DEV).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(32, 3, 224, 224, device=DEV).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (32,), device=DEV)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    profiled(step, out, active=2)


def part_resnet50_infer_cudagraphs(out):
    """torchvision resnet50, fp16, torch.compile(mode="reduce-overhead") (CUDA graphs), inference."""
    import torch
    import torchvision

    model = torchvision.models.resnet50(weights=None).to(DEV).half().eval()
    model = model.to(memory_format=torch.channels_last)
    cmodel = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(32, 3, 224, 224, device=DEV).half().to(memory_format=torch.channels_last)

    def step():
        with torch.inference_mode():
            cmodel(x)

    for _ in range(4):  # compile and record the graph outside the profiled window
        step()
    torch.cuda.synchronize()
    profiled(step, out, active=2)


def part_vit_b_16_infer(out):
    """torchvision vit_b_16 (no weights), bf16, eager inference, batch 32."""
    import torch
    import torchvision

    model = torchvision.models.vit_b_16(weights=None).to(DEV).to(torch.bfloat16).eval()
    x = torch.randn(32, 3, 224, 224, device=DEV, dtype=torch.bfloat16)

    def step():
        with torch.inference_mode():
            model(x)

    profiled(step, out, active=2)


def part_whisper_encoder_infer(out):
    """transformers Whisper encoder (6 layers, d=512, 80 mel bins, 30 s of frames), fp16, eager."""
    import torch
    from transformers import WhisperConfig, WhisperModel

    cfg = WhisperConfig(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                        decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                        num_mel_bins=80)
    encoder = WhisperModel(cfg).get_encoder().to(DEV, torch.float16).eval()
    feats = torch.randn(8, 80, 3000, device=DEV, dtype=torch.float16)

    def step():
        with torch.inference_mode():
            encoder(input_features=feats)

    profiled(step, out, active=2)


def part_unet2d_infer(out):
    """diffusers UNet2DConditionModel (small SD-like config) + DDIMScheduler, fp16: 4 denoising steps a step."""
    import torch
    from diffusers import DDIMScheduler, UNet2DConditionModel

    unet = UNet2DConditionModel(
        sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(128, 256, 512, 512), cross_attention_dim=768, attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                          "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                        "CrossAttnUpBlock2D"),
    ).to(DEV, torch.float16).eval()
    sched = DDIMScheduler(num_train_timesteps=1000)
    text = torch.randn(2, 77, 768, device=DEV, dtype=torch.float16)
    start = torch.randn(2, 4, 64, 64, device=DEV, dtype=torch.float16)

    def step():
        sched.set_timesteps(4)
        latents = start.clone()
        with torch.inference_mode():
            for t in sched.timesteps:
                noise = unet(latents, t, encoder_hidden_states=text).sample
                latents = sched.step(noise, t, latents).prev_sample

    profiled(step, out, active=1)


def part_dlrm_plain_train(out):
    """A DLRM-like recommender written plainly here: 8 EmbeddingBag tables (sum) + bottom/top MLPs,
    pairwise dot interaction, BCE loss, SGD; fp32 eager training, batch 2048."""
    import torch
    from torch import nn


    class Rec(nn.Module):
        def __init__(self, tables=8, rows=200_000, dim=64, dense=13):
            super().__init__()
            self.emb = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
            self.bottom = nn.Sequential(nn.Linear(dense, 512), nn.ReLU(), nn.Linear(512, 256),
                                        nn.ReLU(), nn.Linear(256, dim), nn.ReLU())
            n = tables + 1
            self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 512), nn.ReLU(),
                                     nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))

        def forward(self, dense, idx, offsets):
            feats = [self.bottom(dense)] + [e(i, o) for e, i, o in zip(self.emb, idx, offsets)]
            z = torch.stack(feats, dim=1)
            inter = torch.bmm(z, z.transpose(1, 2))
            iu = torch.triu_indices(z.shape[1], z.shape[1], offset=1, device=z.device)
            flat = inter[:, iu[0], iu[1]]
            return self.top(torch.cat([feats[0], flat], dim=1)).squeeze(1)

    model = Rec().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    b, per = 2048, 20
    dense = torch.randn(b, 13, device=DEV)
    idx = [torch.randint(0, 200_000, (b * per,), device=DEV) for _ in range(8)]
    offsets = [torch.arange(0, b * per, per, device=DEV) for _ in range(8)]
    label = torch.randint(0, 2, (b,), device=DEV).float()
    loss_fn = nn.BCEWithLogitsLoss()

    def step():
        loss = loss_fn(model(dense, idx, offsets), label)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    profiled(step, out, active=2)


def part_ddp_resnet50_train(out_dir):
    """torchvision resnet50 under DistributedDataParallel (NCCL), bf16 autocast, SGD; one rank each."""
    import torch
    import torch.distributed as dist
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    model = torchvision.models.resnet50(weights=None).to(DEV).to(memory_format=torch.channels_last)
    model = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(32, 3, 224, 224, device=DEV).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (32,), device=DEV)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    os.makedirs(out_dir, exist_ok=True)
    profiled(step, os.path.join(out_dir, f"rank{rank}.pt.trace.json.gz"), active=2)
    dist.barrier()
    dist.destroy_process_group()


def part_llama_train_compile(out):
    """transformers LlamaForCausalLM (4 small layers, GQA), bf16 autocast, fused AdamW, torch.compile
    (default mode) of the model; training, batch 8 x 512 tokens."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                      num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).to(DEV).train()
    cmodel = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=(DEV == "cuda"))
    ids = torch.randint(0, 32000, (8, 512), device=DEV)

    def step():
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss = cmodel(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):  # compile forward and backward outside the profiled window
        step()
    if DEV == "cuda":
        torch.cuda.synchronize()
    profiled(step, out, active=2)


def part_whisper_generate(out):
    """transformers WhisperForConditionalGeneration (6+6 layers, d=512), fp16, eager: one generate()
    per step (encoder once, then 24 greedy decoder steps with a KV cache)."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                        decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                        num_mel_bins=80)
    model = WhisperForConditionalGeneration(cfg).to(DEV, torch.float16).eval()
    feats = torch.randn(4, 80, 3000, device=DEV, dtype=torch.float16)

    def step():
        with torch.inference_mode():
            model.generate(input_features=feats, max_new_tokens=24, min_new_tokens=24, do_sample=False)

    profiled(step, out, active=1)


def part_resnet50_graph_capture(out):
    """torchvision resnet50, fp16, channels_last: each step captures the forward pass into a new
    torch.cuda.CUDAGraph (stream capture; nothing replayed), so the recorded step holds the capture only."""
    import torch
    import torchvision

    model = torchvision.models.resnet50(weights=None).to(DEV).half().eval()
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(32, 3, 224, 224, device=DEV).half().to(memory_format=torch.channels_last)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(3):  # warm-up on a side stream, as torch.cuda.graph's documentation asks
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graphs = []

    def step():
        g = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(g):
            model(x)
        graphs.append(g)

    profiled(step, out, active=1)


# ---------------------------------------------------------------- driver


def versions():
    v = {"python": platform.python_version()}
    for name in ("torch", "torchvision", "transformers", "diffusers", "torchrec", "triton"):
        try:
            mod = __import__(name)
            v[name] = getattr(mod, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 - record what is missing
            v[name] = f"not importable: {type(exc).__name__}: {exc}"[:200]
    try:
        import torch

        v["cuda_runtime"] = torch.version.cuda
        v["cudnn"] = torch.backends.cudnn.version()
        v["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        v["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as exc:  # noqa: BLE001
        v["torch_cuda"] = repr(exc)[:200]
    try:
        v["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except Exception as exc:  # noqa: BLE001
        v["nvidia_smi"] = repr(exc)[:200]
    return v


def run_lane(gpus, names, out, results):
    for name in names:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpus, PYTHONUNBUFFERED="1")
        if name == "ddp_resnet50_train":
            cmd = ["timeout", str(PARTS[name]), sys.executable, "-m", "torch.distributed.run",
                   "--nproc_per_node", "2", "--master_port", "29531", HERE, "part", name, "--out", out]
        else:
            env["CUDA_VISIBLE_DEVICES"] = gpus.split(",")[0]
            cmd = ["timeout", str(PARTS[name]), sys.executable, HERE, "part", name, "--out", out]
        t0 = time.time()
        with open(os.path.join(out, f"{name}.log"), "w") as log:  # each part logs to its own file
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        results[name] = {"rc": rc, "seconds": round(time.time() - t0, 1), "gpus": env["CUDA_VISIBLE_DEVICES"]}
        print(f"part {name}: rc={rc} in {results[name]['seconds']} s on GPU {env['CUDA_VISIBLE_DEVICES']}",
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["all", "part"])
    ap.add_argument("name", nargs="?")
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", help="with `all`: comma-separated parts, one lane per GPU")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for k, val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                   ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ[k] = val
    if args.what == "part":
        fn = globals()[f"part_{args.name}"]
        if args.name == "ddp_resnet50_train":
            fn(os.path.join(args.out, args.name))
        else:
            fn(os.path.join(args.out, f"{args.name}.pt.trace.json.gz"))
        return
    v = versions()
    print(json.dumps(v, indent=1), flush=True)
    results = {}
    lanes = LANES
    if args.parts:
        lanes = [(str(i % 4), [name]) for i, name in enumerate(args.parts.split(","))]
    threads = [threading.Thread(target=run_lane, args=(g, n, args.out, results)) for g, n in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    v["parts"] = results
    with open(os.path.join(args.out, "versions.json"), "w") as f:
        json.dump(v, f, indent=1)
    print(json.dumps(results, indent=1), flush=True)


if __name__ == "__main__":
    main()

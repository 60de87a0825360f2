"""Fresh-prompt chunk attention through cuDNN's frontend (one graph per bucket) against the flash
call the server makes now (one GPU).

For each layout of ``benchmarks/gpu/fresh_attn.py`` (chunk members' lengths in a bucket of ``R``
rows; ``cu`` of :func:`~tracestory.serve.fresh_attention.offsets` with 33 sequences: the members,
the padding rows, empty sequences) and a cache holding each prompt's K/V in consecutive 16-token
blocks, both variants gather K/V at the rows' slots and transpose Q to ``[R, 32, 128]`` as
:func:`~tracestory.serve.fresh_attention.attend` does, then:

* ``flash``: ``aten._flash_attention_forward`` over ``cu`` (the server's call);
* ``cudnn``: :class:`~tracestory.serve.fresh_cudnn.BucketGraph` of the bucket (built once per
  bucket, ``build_s``), lengths and ragged offsets computed from the device ``cu``.

Each eager and (``_graph``) replayed from a CUDA graph captured on another layout of the bucket
(one whole-bucket prompt) and fed this layout's Q, slots and ``cu`` through its static buffers.
Checked: every row (members and the padding sequence) against
:func:`~tracestory.serve.fresh_attention.reference` in float32 (``max_abs_err``). Empty sequences
are tried as they are (length 0 at offset ``R``); if that fails or errs, again with
``spare=True`` (length 1 at a spare row). Times: median of 20 (CUDA events, 3 warm-ups).

Usage: python benchmarks/gpu/cudnn_fe_attn.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time

import fresh_attn  # this folder: run as python3 benchmarks/gpu/cudnn_fe_attn.py
import torch
from roofs import cuda_times

from tracestory.serve import fresh_attention as fresh
from tracestory.serve import fresh_cudnn

H, KH, D, BS, M = 32, 8, 128, 16, 32
NSLOTS = 8192 * BS
LAYOUTS = [((2048,), 2048), ((1024, 1024), 2048), ((512,) * 4, 2048), ((700, 900), 2048),
           ((300, 200, 250), 1024), ((128,) * 16, 2048), ((512,), 512)]


def slots_of(lengths, R):
    """Slots [R]: each prompt in consecutive blocks (a gap between prompts), padding rows at the
    last slot of the cache."""
    out, b0 = [], 64
    for n in lengths:
        nblk = -(-n // BS)
        out += [(b0 + p // BS) * BS + p % BS for p in range(n)]
        b0 += nblk + 4
    out += [NSLOTS - BS] * (R - sum(lengths))
    return torch.tensor(out, device="cuda")


def variant(kernel):
    def run(q, kc, vc, slots, cu, R):
        k, v = kc[slots], vc[slots]
        return kernel(q.transpose(0, 1).contiguous(), k, v, cu, R)      # [R, H, D]
    return run


def flash_kernel(q, k, v, cu, R):
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, R, R, 0.0, True, False)[0]


def graph_of(fn, static, preset=False):
    """fresh_attn.graph_of; ``preset``: the cuDNN handles are pointed at the capture stream before
    the capture (so no cudnnSetStream runs in it)."""
    def point_handles(cap):
        import cudnn

        for h in fresh_cudnn._handles.values():
            cudnn.set_stream(h, cap.cuda_stream)
    return fresh_attn.graph_of(fn, static, point_handles if preset else None)


def run_all(kc, vc, gen, kernels, rows, tag):
    """Every layout through each of ``kernels`` (name -> fn(q, k, v, cu, R)): eager and replayed."""
    graphs, ok = {}, True
    for lengths, R in LAYOUTS:
        name = "+".join(map(str, lengths)) + f" in {R}"
        flops = 4 * D * H * sum(n * (n + 1) / 2 for n in lengths)
        q = torch.randn(H, R, D, generator=gen).to("cuda", torch.bfloat16)
        slots = slots_of(lengths, R)
        cu = torch.tensor(fresh.offsets(lengths, R, M + 1), device="cuda")
        ref = fresh.reference(q.transpose(0, 1).float(), kc[slots].float(), vc[slots].float(), cu)

        def err(o):
            return round((o.float() - ref).abs().max().item(), 5)

        def row(v, t=None, e=None, **kw):
            r = {"tag": tag, "layout": name, "variant": v, **kw}
            if t is not None:
                r.update(ms=round(t * 1e3, 4), tflops=round(flops / t / 1e12, 1))
            if e is not None:
                r["max_abs_err"] = e
            rows.append(r)
            print(json.dumps(r), flush=True)
            return r

        for vname, kern in kernels.items():
            fn = variant(kern)
            try:
                o = fn(q, kc, vc, slots, cu, R)
                e = err(o)
                ok &= e < 0.02
                row(vname, _time(lambda fn=fn: fn(q, kc, vc, slots, cu, R)), e)
            except Exception as ex:  # noqa: BLE001 -- report and go on
                ok = False
                row(vname, error=" ".join(str(ex).split())[:400])
                continue
            try:
                if (vname, R) not in graphs:
                    static = (torch.zeros(H, R, D, device="cuda", dtype=torch.bfloat16), kc, vc,
                              torch.full((R,), NSLOTS - BS, device="cuda", dtype=torch.long),
                              torch.tensor(fresh.offsets([R], R, M + 1), device="cuda"), R)
                    try:
                        graphs[vname, R] = (*graph_of(fn, static), static)
                    except Exception as ex:  # noqa: BLE001 -- once more, the stream set before the capture
                        row(vname + "_graph", error="capture: " + " ".join(str(ex).split())[:400])
                        torch.cuda.synchronize()
                        graphs[vname, R] = (*graph_of(fn, static, preset=True), static)
                        row(vname + "_graph", note="captured with the cuDNN stream set before the capture")
                g, so, static = graphs[vname, R]
                static[0].copy_(q)
                static[3].copy_(slots)
                static[4].copy_(cu)
                g.replay()
                e = err(so)
                ok &= e < 0.02
                row(vname + "_graph", _time(g.replay), e)
            except Exception as ex:  # noqa: BLE001 -- report and go on
                ok = False
                row(vname + "_graph", error=" ".join(str(ex).split())[:400])
                torch.cuda.synchronize()
    return ok


def _time(fn) -> float:
    return cuda_times(fn, warm=3)[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    head = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "torch_cudnn": torch.backends.cudnn.version(), "cuda": torch.version.cuda}
    try:
        head.update(fresh_cudnn.versions())
    except Exception as ex:  # noqa: BLE001
        head["import_error"] = " ".join(str(ex).split())[:300]
    print(json.dumps(head), flush=True)
    kc = torch.randn(NSLOTS, KH, D, generator=gen).to("cuda", torch.bfloat16)
    vc = torch.randn(NSLOTS, KH, D, generator=gen).to("cuda", torch.bfloat16)
    rows: list = []
    builds: list = []

    def cudnn_kernels(spare):
        bucket: dict = {}

        def kern(q, k, v, cu, R):
            if R not in bucket:
                last = None
                for causal in ("band", "flag"):
                    try:
                        torch.cuda.synchronize()
                        bg = fresh_cudnn.BucketGraph(R, M + 1, H, KH, D, torch.bfloat16, "cuda", spare=spare,
                                                     causal=causal)
                        b = {"rows": R, "count": M + 1, "spare": spare, "causal": causal,
                             "build_s": round(bg.build_s, 3), "workspace_bytes": bg.workspace_bytes}
                        try:
                            b["plan"] = bg.graph.get_plan_name_at_index(bg.graph._plan_index)
                        except Exception as ex:  # noqa: BLE001
                            b["plan"] = f"? {ex}"[:100]
                        builds.append(b)
                        print(json.dumps({"build": b}), flush=True)
                        bucket[R] = bg
                        break
                    except Exception as ex:  # noqa: BLE001 -- try the other spelling, then give up
                        last = ex
                        print(json.dumps({"build_error": {"rows": R, "causal": causal, "spare": spare,
                                                          "error": " ".join(str(ex).split())[:600]}}), flush=True)
                if R not in bucket:
                    raise RuntimeError(f"no cuDNN graph for {R} rows: {last}")
            return bucket[R](q, k, v, cu)
        return kern

    t0 = time.perf_counter()
    ok = run_all(kc, vc, gen, {"flash": flash_kernel, "cudnn": cudnn_kernels(False)}, rows, "zero")
    print(json.dumps({"zero_length_ok": ok, "s": round(time.perf_counter() - t0, 1)}), flush=True)
    if not ok:
        ok2 = run_all(kc, vc, gen, {"cudnn": cudnn_kernels(True)}, rows, "spare")
        print(json.dumps({"spare_ok": ok2}), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({**head, "builds": builds, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()

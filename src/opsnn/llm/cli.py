"""Command-line entry points ``opsnn generate`` and ``opsnn serve-bench`` (argparse inside;
``opsnn.cli`` dispatches to them).

    $ opsnn generate --model llama --prompt-tokens 1,2,3 --max-new-tokens 64 --layers 4 --hidden 256
    $ opsnn serve-bench --requests 32 --prompt-len 16,512 --new-tokens 16,128 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..errors import OpsnnError


def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _range(text: str) -> tuple[int, int]:
    v = _int_list(text)
    if len(v) == 1:
        v = v * 2
    if len(v) != 2:
        raise argparse.ArgumentTypeError(f"expected LO,HI, got {text!r}")
    return v[0], v[1]


def _model_args(ap: argparse.ArgumentParser, **defaults) -> None:
    g = ap.add_argument_group("model (deterministic random weights unless --weights)")
    g.add_argument("--model", default="llama", choices=["llama"], help="model family (default: llama)")
    g.add_argument("--layers", type=int, default=defaults.get("layers", 2))
    g.add_argument("--hidden", type=int, default=defaults.get("hidden", 128))
    g.add_argument("--heads", type=int, default=defaults.get("heads", 4))
    g.add_argument("--kv-heads", type=int, default=defaults.get("kv_heads"), help="default: --heads (no GQA)")
    g.add_argument("--vocab", type=int, default=defaults.get("vocab", 1024))
    g.add_argument("--intermediate", type=int, default=None, help="MLP width (default: LLaMA's 8/3 rule)")
    g.add_argument("--max-position", type=int, default=2048)
    g.add_argument("--init-seed", type=int, default=0, help="seed of the random weights")
    g.add_argument("--weights", default=None, help="local weight file with Hugging Face names")


def _build_model(args):
    from ..models import llama

    return llama(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        vocab=args.vocab,
        intermediate=args.intermediate,
        max_position=args.max_position,
        seed=args.init_seed,
        weights=args.weights,
    )


def _describe(model) -> str:
    c = model.config
    return (
        f"llama: {c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads, "
        f"{c.num_key_value_heads} KV heads, intermediate {c.intermediate_size}, vocab {c.vocab_size}"
    )


def cli_generate(argv: list[str] | None = None) -> int:
    """``opsnn generate``: stream the tokens of one prompt, then print the timing."""
    from .generate import generate, generate_no_cache

    ap = argparse.ArgumentParser(prog="opsnn generate", description="Generate tokens with a KV cache (streaming).")
    ap.add_argument("--prompt-tokens", type=_int_list, required=True, help="comma-separated prompt token ids")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=None, help="sampling seed")
    ap.add_argument("--stop-tokens", type=_int_list, default=[], help="comma-separated stop token ids")
    ap.add_argument("--max-seq", type=int, default=None, help="cache length (default: prompt + new tokens)")
    ap.add_argument(
        "--check",
        action="store_true",
        help="also generate without the cache (full re-forward per token) and compare (greedy only)",
    )
    ap.add_argument("--json", default=None, help="write tokens and timing to this file")
    _model_args(ap)
    args = ap.parse_args(argv)
    try:
        t0 = time.perf_counter()
        model = _build_model(args)
        print(f"{_describe(model)} (built in {time.perf_counter() - t0:.2f} s)", file=sys.stderr)
        out = sys.stdout
        streamed = []

        def stream(tok: int) -> None:
            out.write(f"{'' if streamed else 'tokens:'} {tok}")
            out.flush()
            streamed.append(tok)

        req = generate(
            model,
            args.prompt_tokens,
            args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop_tokens=args.stop_tokens,
            on_token=stream,
            max_seq=args.max_seq,
        )
        out.write("\n" if streamed else "tokens: (none)\n")
        m = req.metrics
        mpt = m.ms_per_token
        print(
            f"prompt {m.prompt_tokens} tokens, generated {m.generated_tokens} ({req.finish_reason}); "
            f"time to first token {m.ttft_s * 1e3:.1f} ms; decode "
            + (f"{mpt:.2f} ms/token ({1e3 / mpt:.1f} tokens/s)" if mpt else "n/a")
            + f"; total {m.latency_s * 1e3:.1f} ms"
        )
        result = {"tokens": req.tokens, "finish_reason": req.finish_reason, **m.as_dict()}
        if args.check:
            if args.temperature > 0 and args.top_k != 1:
                print("--check needs greedy decoding (--temperature 0)", file=sys.stderr)
                return 2
            ref = generate_no_cache(model, args.prompt_tokens, args.max_new_tokens, args.stop_tokens)
            ok = ref == req.tokens
            result["check"] = ok
            print(f"check against full re-forward without cache: {'match' if ok else 'MISMATCH'}")
            if not ok:
                return 1
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        return 0
    except OpsnnError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 2


def cli_serve_bench(argv: list[str] | None = None) -> int:
    """``opsnn serve-bench``: replay a deterministic mixed workload with dynamic batching and one
    request at a time; print throughput, latency percentiles and the ratio."""
    from .workload import mixed_workload, replay

    ap = argparse.ArgumentParser(
        prog="opsnn serve-bench", description="Replay a mixed generation workload: dynamic batching vs one at a time."
    )
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-len", type=_range, default=(16, 512), help="LO,HI prompt lengths (default 16,512)")
    ap.add_argument("--new-tokens", type=_range, default=(16, 128), help="LO,HI output lengths (default 16,128)")
    ap.add_argument("--seed", type=int, default=0, help="workload seed")
    ap.add_argument("--max-batch", type=int, default=32, help="cache slots for dynamic batching")
    ap.add_argument("--max-prefill-tokens", type=int, default=512, help="prompt tokens prefilled per step")
    ap.add_argument("--no-sequential", action="store_true", help="skip the one-at-a-time replay")
    ap.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tqdm progress bar (default: when stderr is a tty)",
    )
    ap.add_argument("--json", default=None, help="write the reports to this file")
    _model_args(ap, layers=4, hidden=256, heads=8, kv_heads=4, vocab=32000)
    args = ap.parse_args(argv)
    try:
        model = _build_model(args)
        items = mixed_workload(args.requests, args.prompt_len, args.new_tokens, args.vocab, args.seed)
        print(_describe(model))
        print(
            f"workload: {len(items)} requests, prompts {args.prompt_len[0]}-{args.prompt_len[1]} tokens "
            f"(total {sum(len(i.prompt) for i in items)}), outputs {args.new_tokens[0]}-{args.new_tokens[1]} "
            f"(total {sum(i.max_new_tokens for i in items)}), seed {args.seed}, greedy"
        )
        # warm-up: the same batch sizes and prompt lengths as the timed runs (kernel choice and compiled
        # specializations follow the row counts), few output tokens; both modes, so neither times compilation
        t_warm = time.perf_counter()
        warm = mixed_workload(min(args.requests, args.max_batch), args.prompt_len, (2, 3), args.vocab, args.seed + 1)
        replay(model, warm, max_batch_slots=args.max_batch, max_prefill_tokens=args.max_prefill_tokens, progress=False)
        if not args.no_sequential:
            replay(model, warm[:2], sequential=True, max_prefill_tokens=args.max_prefill_tokens, progress=False)
        print(f"warm-up (compiles kernels, not timed): {time.perf_counter() - t_warm:.1f} s")
        reports = [
            replay(
                model,
                items,
                max_batch_slots=args.max_batch,
                max_prefill_tokens=args.max_prefill_tokens,
                progress=args.progress,
            )
        ]
        if not args.no_sequential:
            reports.append(
                replay(
                    model, items, sequential=True, max_prefill_tokens=args.max_prefill_tokens, progress=args.progress
                )
            )
        for r in reports:
            print("\n".join(r.lines()))
        result = {
            "model": _describe(model),
            "workload": {
                "requests": args.requests,
                "prompt_len": args.prompt_len,
                "new_tokens": args.new_tokens,
                "seed": args.seed,
            },
            "reports": [r.as_dict() for r in reports],
        }
        if len(reports) == 2:
            same = reports[0].outputs == reports[1].outputs
            ratio = reports[0].tokens_per_s / reports[1].tokens_per_s
            result["throughput_ratio"] = ratio
            result["outputs_identical"] = same
            print(
                f"dynamic batching / one-at-a-time throughput: {ratio:.2f}x "
                f"(outputs {'identical' if same else 'DIFFER'})"
            )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
            print(f"wrote {args.json}")
        return 0
    except OpsnnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


__all__ = ["cli_generate", "cli_serve_bench"]

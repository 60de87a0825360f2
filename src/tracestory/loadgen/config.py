"""What a load run does: :class:`LoadConfig`, and the parsing of the flags that fill it.

The flags follow ``vllm bench serve`` (see docs/LOADGEN.md for the mapping). Two stop rules,
either or both: ``num_requests`` (vLLM's ``--num-prompts``) and ``duration_s`` (ours: the send
window; a request not sent when it closes is *not sent*). With neither, 1000 requests are
planned, as vLLM does.

Arrivals: ``request_rate`` requests per second with gamma-distributed gaps of shape
``burstiness`` (1 is a Poisson process; ``inf`` sends everything at once), gated by
``max_concurrency`` requests in flight. ``target_qps`` and ``concurrency`` are the older names
of ``request_rate`` and ``max_concurrency`` (``concurrency`` alone means an infinite rate,
that is a closed loop of that many requests).

Ramp-up (vLLM's ``--ramp-up-strategy linear|exponential --ramp-up-start-rps S --ramp-up-end-rps
E``): the rate of request ``i`` of ``N`` planned goes from S to E with the progress ``i / (N - 1)``,
linearly or geometrically (:func:`~.arrivals.ramp_rates`); it replaces ``request_rate``.

Sampling (``temperature``, ``top_p``, ``top_k``, ``min_p``; vLLM's flags) and ``extra_body`` (a
JSON object merged last into every request body) are sent as given; ``temperature`` is 0 (greedy)
when not given, as ``vllm bench serve`` sends it. ``stream`` False sends non-streaming requests.

Safety bounds (not in vLLM): at most ``max_requests`` planned requests (records are kept in
memory for the summary), at most ``max_in_flight`` requests in flight when no
``max_concurrency`` is given.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from dataclasses import dataclass, field

from ..errors import UsageError

ENDPOINT_ALIASES = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_NUM_REQUESTS = 1000
DEFAULT_MAX_REQUESTS = 100_000
DEFAULT_MAX_IN_FLIGHT = 1024
DATASETS = ("random", "sharegpt", "custom", "prefix_repetition", "sonnet")
RAMP_UP = ("linear", "exponential")
# body keys that --extra-body may not set: the run itself decides them
RESERVED_BODY_KEYS = ("model", "prompt", "messages", "stream", "stream_options", "max_tokens")


def validate_base_url(url: str, flag: str = "--base-url") -> str:
    """``url`` without a trailing slash when it is ``http(s)://HOST[:PORT][/PATH]``; else a
    one-line :class:`UsageError` saying what is wrong with it."""
    def bad(why: str) -> UsageError:
        return UsageError(f"{flag}: expected http://HOST[:PORT][/PATH] or https://..., found {url!r} ({why})")

    if not isinstance(url, str) or not url:
        raise bad("empty")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise bad("it contains whitespace or control characters")
    if "://" not in url:
        raise bad("no scheme: add http://")
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as e:             # an unclosed "[" of an IPv6 address
        raise bad(str(e)) from None
    if parts.scheme not in ("http", "https"):
        raise bad(f"scheme {parts.scheme!r}" if parts.scheme else "no scheme")
    if not parts.hostname:
        raise bad("no host")
    try:
        port = parts.port
    except ValueError:
        raise bad("the port is not a number from 0 to 65535") from None
    if port == 0:
        raise bad("port 0")
    if parts.query or parts.fragment:
        raise bad("a query or fragment; give the base URL only")
    if parts.username is not None or parts.password is not None:
        raise bad("credentials in the URL")
    return url.rstrip("/")


def resolve_endpoint(endpoint: str) -> str:
    """The request path: ``completions``/``chat`` or a path starting with ``/``."""
    path = ENDPOINT_ALIASES.get(endpoint, endpoint)
    if not isinstance(path, str) or not path.startswith("/") or any(c.isspace() for c in path):
        raise UsageError(f"--endpoint: expected a path such as /v1/completions or /v1/chat/completions, "
                         f"found {endpoint!r}")
    return path


def parse_goodput(words: list[str] | tuple[str, ...] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds, as vLLM).
    Metrics: ttft, tpot, e2el; each value > 0 and finite."""
    out: dict[str, float] = {}
    for w in words or ():
        name, sep, value = str(w).partition(":")
        name = name.strip().lower()
        if not sep or name not in ("ttft", "tpot", "e2el"):
            raise UsageError(f"--goodput: expected METRIC:MS with METRIC one of ttft, tpot, e2el, found {w!r}")
        try:
            ms = float(value)
        except ValueError:
            raise UsageError(f"--goodput: expected a number of milliseconds after {name}:, found {value!r}") from None
        if not (ms > 0 and math.isfinite(ms)):
            raise UsageError(f"--goodput: expected {name} > 0 ms, found {value}")
        if name in out:
            raise UsageError(f"--goodput: {name} given twice")
        out[name] = ms
    return out


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
    """``"ttft,tpot,itl"`` -> ``("ttft", "tpot", "itl")``; names from :data:`METRICS`."""
    names = tuple(x.strip().lower() for x in str(text).split(",") if x.strip())
    bad = [x for x in names if x not in METRICS]
    if not names or bad:
        raise UsageError(f"--percentile-metrics: expected a comma list of {', '.join(METRICS)}, found {text!r}")
    return tuple(dict.fromkeys(names))


def parse_metric_percentiles(text: str) -> tuple[float, ...]:
    """``"50,90,99"`` -> ``(50.0, 90.0, 99.0)``; each in (0, 100]."""
    out = []
    for x in str(text).split(","):
        if not x.strip():
            continue
        try:
            p = float(x)
        except ValueError:
            raise UsageError(f"--metric-percentiles: expected numbers such as 50,90,99, found {text!r}") from None
        if not (0 < p <= 100):
            raise UsageError(f"--metric-percentiles: expected values in (0, 100], found {x.strip()}")
        out.append(p)
    if not out:
        raise UsageError(f"--metric-percentiles: expected numbers such as 50,90,99, found {text!r}")
    return tuple(dict.fromkeys(out))


def parse_metadata(words: list[str] | None) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` -> dict (vLLM's ``--metadata``)."""
    out = {}
    for w in words or ():
        key, sep, value = str(w).partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--metadata: expected KEY=VALUE, found {w!r}")
        out[key.strip()] = value
    return out


def range_of(length: int, ratio: float, flag: str) -> tuple[int, int]:
    """vLLM's random-dataset range: integers in ``[floor(L (1 - r)), floor(L (1 + r))]``."""
    if not (0 <= ratio < 1):
        raise UsageError(f"--random-range-ratio: expected 0 <= ratio < 1, found {ratio}")
    lo, hi = int(length * (1 - ratio)), int(length * (1 + ratio))
    if lo < 1:
        raise UsageError(f"{flag}: expected lengths of at least 1 token, found {length} with range ratio {ratio} "
                         f"(smallest {lo})")
    return lo, hi


_MODEL = re.compile(r"\S+")


@dataclass(frozen=True)
class LoadConfig:
    url: str                                  # server base URL, e.g. http://127.0.0.1:8000
    model: str
    endpoint: str = "/v1/completions"         # a path, or "completions" / "chat"
    request_rate: float = math.inf            # requests per second (inf: all at once)
    burstiness: float = 1.0                   # gamma shape of the gaps (1: Poisson)
    max_concurrency: int | None = None
    num_requests: int | None = None           # --num-prompts
    duration_s: float | None = None           # send window
    prompt_len_min: int = 1024                # random dataset: input length range (inclusive)
    prompt_len_max: int = 1024
    max_new_tokens: int = 128                 # random dataset: output length range (inclusive)
    min_new_tokens: int | None = None         # None: equal to max_new_tokens
    dataset: str = "random"                   # one of DATASETS
    dataset_path: str | None = None
    sharegpt_output_len: int | None = None
    custom_output_len: int | None = None      # custom: None = a line's output_tokens, else 256; -1 = the line's
    disable_shuffle: bool = False             # sharegpt / custom: file order
    prefix_len: int = 256                     # prefix_repetition (vLLM's defaults)
    suffix_len: int = 256
    num_prefixes: int = 10
    prefix_output_len: int = 128
    sonnet_input_len: int = 550               # sonnet (vLLM's defaults)
    sonnet_output_len: int = 150
    sonnet_prefix_len: int = 200
    ramp_up_strategy: str | None = None       # None | "linear" | "exponential"
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    temperature: float | None = None          # None: 0.0 is sent (vLLM's default, greedy)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    extra_body: dict = field(default_factory=dict)
    stream: bool = True                       # False: one JSON response per request
    tokenizer: str | None = None              # a transformers tokenizer name or folder
    served_model_name: str | None = None      # the name sent in requests (default: model)
    seed: int = 0
    timeout_s: float = 30.0
    ignore_eos: bool = False                  # send vLLM's ``ignore_eos`` (exact output lengths)
    goodput_ms: dict = field(default_factory=dict)   # metric -> SLO in ms (parse_goodput)
    max_requests: int = DEFAULT_MAX_REQUESTS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    # older names
    target_qps: float | None = None
    concurrency: int | None = None
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None

    def __post_init__(self) -> None:
        if self.target_qps is not None:
            object.__setattr__(self, "request_rate", float(self.target_qps))
        if self.concurrency is not None:
            object.__setattr__(self, "max_concurrency", self.concurrency)
        slo = dict(self.goodput_ms)
        if self.slo_ttft_s is not None:
            slo.setdefault("ttft", self.slo_ttft_s * 1e3)
        if self.slo_itl_s is not None:
            slo.setdefault("tpot", self.slo_itl_s * 1e3)
        object.__setattr__(self, "goodput_ms", slo)

    # ------------------------------------------------------------ derived

    @property
    def path(self) -> str:
        return resolve_endpoint(self.endpoint)

    @property
    def chat(self) -> bool:
        return self.path.rstrip("/").endswith("/chat/completions")

    @property
    def request_url(self) -> str:
        return self.url.rstrip("/") + self.path

    @property
    def request_model(self) -> str:
        return self.served_model_name or self.model

    @property
    def open_ended(self) -> bool:
        """Infinite rate with only a duration: a closed loop, requests planned as slots free up."""
        return math.isinf(self.request_rate) and self.num_requests is None and self.duration_s is not None

    @property
    def planned_count(self) -> int:
        """Requests to plan (before the duration cuts them): the asked number, the default, or the cap."""
        if self.num_requests is not None:
            return min(self.num_requests, self.max_requests)
        if self.duration_s is None:
            return min(DEFAULT_NUM_REQUESTS, self.max_requests)
        return self.max_requests

    @property
    def expected_arrivals(self) -> float | None:
        """Arrivals the rate would give in the duration (None without a finite rate and a duration)."""
        if self.duration_s is None or math.isinf(self.request_rate):
            return None
        return self.request_rate * self.duration_s

    @property
    def in_flight_limit(self) -> int:
        return self.max_concurrency if self.max_concurrency is not None else self.max_in_flight

    @property
    def mode(self) -> str:
        """``poisson`` / ``gamma`` (finite rate), ``concurrency`` (infinite rate, bounded), ``burst``."""
        if self.ramp_up_strategy is not None:
            return f"ramp-up {self.ramp_up_strategy}"
        if math.isinf(self.request_rate):
            return "concurrency" if self.max_concurrency is not None else "burst"
        return "poisson" if self.burstiness == 1 else "gamma"

    @property
    def sampling(self) -> dict:
        """The sampling fields sent in every body (temperature 0 unless given, as vLLM)."""
        out = {"temperature": 0.0 if self.temperature is None else self.temperature}
        for name in ("top_p", "top_k", "min_p"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @property
    def min_output(self) -> int:
        return self.max_new_tokens if self.min_new_tokens is None else self.min_new_tokens

    def validate(self) -> None:
        validate_base_url(self.url)
        self.path  # noqa: B018  (raises on a bad endpoint)
        if not isinstance(self.model, str) or not _MODEL.fullmatch(self.model):
            raise UsageError(f"--model: expected a model name without spaces, found {self.model!r}")
        if not (self.request_rate > 0) or math.isnan(self.request_rate):
            raise UsageError(f"--request-rate: expected a rate > 0 requests/s or inf, found {self.request_rate}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise UsageError(f"--burstiness: expected a finite value > 0, found {self.burstiness}")
        checks = [("--max-concurrency", self.max_concurrency), ("--num-prompts", self.num_requests),
                  ("--duration", self.duration_s), ("--timeout", self.timeout_s),
                  ("--random-input-len", self.prompt_len_min), ("--random-output-len", self.max_new_tokens),
                  ("--random-output-len", self.min_new_tokens), ("--sharegpt-output-len", self.sharegpt_output_len),
                  ("--max-requests", self.max_requests), ("--max-in-flight", self.max_in_flight)]
        for flag, v in checks:
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise UsageError(f"{flag}: expected a value > 0, found {v}")
        if self.prompt_len_max < self.prompt_len_min:
            raise UsageError(f"--prompt-len-max: expected >= --prompt-len-min ({self.prompt_len_min}), "
                             f"found {self.prompt_len_max}")
        if self.max_new_tokens < self.min_output:
            raise UsageError(f"--random-output-len: expected the range's upper end >= its lower end "
                             f"({self.min_output}), found {self.max_new_tokens}")
        if self.dataset not in DATASETS:
            raise UsageError(f"--dataset-name: expected one of {', '.join(DATASETS)}, found {self.dataset!r}")
        if self.dataset in ("sharegpt", "custom", "sonnet") and not self.dataset_path:
            kind = {"sharegpt": "ShareGPT JSON", "custom": "JSONL", "sonnet": "text"}[self.dataset]
            raise UsageError(f"--dataset-path: expected a local {kind} file with --dataset-name {self.dataset}, "
                             "found none")
        if self.custom_output_len is not None and not (self.custom_output_len > 0 or self.custom_output_len == -1):
            raise UsageError(f"--custom-output-len: expected a value > 0, or -1 for each line's output_tokens, "
                             f"found {self.custom_output_len}")
        for flag, v in (("--prefix-repetition-prefix-len", self.prefix_len),
                        ("--prefix-repetition-suffix-len", self.suffix_len),
                        ("--prefix-repetition-num-prefixes", self.num_prefixes),
                        ("--prefix-repetition-output-len", self.prefix_output_len),
                        ("--sonnet-input-len", self.sonnet_input_len), ("--sonnet-output-len", self.sonnet_output_len)):
            if not (isinstance(v, int) and v >= 1):
                raise UsageError(f"{flag}: expected an integer >= 1, found {v}")
        if not (isinstance(self.sonnet_prefix_len, int) and self.sonnet_prefix_len >= 0):
            raise UsageError(f"--sonnet-prefix-len: expected an integer >= 0, found {self.sonnet_prefix_len}")
        self._validate_ramp_up()
        self._validate_sampling()
        for name, ms in self.goodput_ms.items():
            if name not in ("ttft", "tpot", "e2el") or not (ms > 0 and math.isfinite(ms)):
                raise UsageError(f"--goodput: expected ttft/tpot/e2el with a value > 0 ms, found {name}:{ms}")

    def _validate_ramp_up(self) -> None:
        s, a, b = self.ramp_up_strategy, self.ramp_up_start_rps, self.ramp_up_end_rps
        if s is None:
            if a is not None or b is not None:
                raise UsageError("--ramp-up-start-rps/--ramp-up-end-rps: expected with --ramp-up-strategy "
                                 "linear|exponential, found no strategy")
            return
        if s not in RAMP_UP:
            raise UsageError(f"--ramp-up-strategy: expected linear or exponential, found {s!r}")
        if a is None or b is None:
            raise UsageError(f"--ramp-up-strategy {s}: expected --ramp-up-start-rps and --ramp-up-end-rps, "
                             f"found {'neither' if a is None and b is None else 'only one'}")
        if not (math.isfinite(a) and math.isfinite(b) and a >= 0 and b > 0):
            raise UsageError(f"--ramp-up-start-rps/--ramp-up-end-rps: expected finite rates, start >= 0 and "
                             f"end > 0, found {a:g} and {b:g}")
        if a > b:
            raise UsageError(f"--ramp-up-start-rps: expected at most --ramp-up-end-rps ({b:g}), found {a:g}")
        if s == "exponential" and a <= 0:
            raise UsageError("--ramp-up-start-rps: expected > 0 with --ramp-up-strategy exponential, found 0")
        if not math.isinf(self.request_rate):
            raise UsageError(f"--request-rate: expected none with --ramp-up-strategy (the ramp sets the rate), "
                             f"found {self.request_rate:g}")
        if self.num_requests is None and self.duration_s is not None:
            raise UsageError("--ramp-up-strategy: expected --num-prompts (the ramp runs over the planned "
                             "requests), found only --duration")

    def _validate_sampling(self) -> None:
        t, p, k, m = self.temperature, self.top_p, self.top_k, self.min_p
        if t is not None and not (t >= 0 and math.isfinite(t)):
            raise UsageError(f"--temperature: expected a number >= 0, found {t}")
        if p is not None and not (0 < p <= 1):
            raise UsageError(f"--top-p: expected a number in (0, 1], found {p}")
        if k is not None and not (isinstance(k, int) and (k >= 1 or k in (0, -1))):
            raise UsageError(f"--top-k: expected an integer >= 1, or -1 / 0 for no limit, found {k}")
        if m is not None and not (0 <= m <= 1):
            raise UsageError(f"--min-p: expected a number in [0, 1], found {m}")
        if not isinstance(self.extra_body, dict):
            raise UsageError(f"--extra-body: expected a JSON object, found {type(self.extra_body).__name__}")
        taken = [key for key in RESERVED_BODY_KEYS if key in self.extra_body]
        if taken:
            raise UsageError(f"--extra-body: expected no {', '.join(map(repr, taken))} (set by the run: "
                             "--model, the dataset, --no-stream, the output length), found it")


def parse_extra_body(text: str | None, flag: str = "--extra-body") -> dict:
    """``--extra-body '{"key": value}'`` -> dict; one line for anything but a JSON object."""
    if text is None:
        return {}
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{flag}: expected a JSON object, found unreadable JSON ({e})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{flag}: expected a JSON object, found a JSON {type(doc).__name__}")
    return doc

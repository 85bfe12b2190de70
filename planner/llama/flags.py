"""llama.cpp command-line flags that decide memory placement, parsed the way the pinned build parses them.

Facts from common/arg.cpp, common/common.h and common/common.cpp of the llama.cpp vendored in
llama-cpp-python 0.3.36 (DESIGN.md pins it): defaults (-c 0 = training context, -b 2048,
-ub 512, -np 1, -ngl auto = every layer, -fa auto, f16 caches), `-ts` split on `,` or `/`,
`-ot` lists split on `,` then `=`, and `-cmoe`/`-ncmoe`/`-ncffn` appended to the same override
list in command-line order (llm_ffn_exps_cpu_override, llm_add_n_cpu_ffn_overrides).

`FLAGS` is the one table of spellings: each flag's names (the first is the one fitplan writes), whether
it takes a value, which programs read it, and llama-bench's spelling (tools/llama-bench/llama-bench.cpp
parses its own argv: lists joined by '/', every option takes a value). The parser reads every name of an
entry; every argv fitplan writes is built with `arg` / `bench_arg`, so a spelling lives here alone.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any

from planner.core.errors import FlagError
from planner.core.units import quote
from planner.hardware.limits import LLAMA_MAX_DEVICES
from planner.llama.override_regex import check_override_pattern

# common.h: LLM_FFN_EXPS_REGEX / LLM_FFN_DENSE_REGEX; blocks are named "blk\.%d" + regex.
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
FFN_DENSE_REGEX = r"\.ffn_(up|down|gate)\."
NGL_AUTO = -1   # common.h: -1 is "auto"; llama_model::n_gpu_layers() treats any negative as every layer
NGL_ALL = -2
MAX_DEVICES = LLAMA_MAX_DEVICES  # -ts with this many values or more is refused
# src/llama-hparams.h: #define LLAMA_MAX_LAYERS 512 (per-layer hparams are std::arrays of it)
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_SEQ = 256    # src/llama-cparams.h: the most sequences (-np) a context holds
INT_MIN, INT_MAX = -(2**31), 2**31 - 1   # std::stoi's range: common/arg.cpp reads int flags with it
SPLIT_MODES = ("none", "layer", "row", "tensor")
FA_MODES = ("on", "off", "auto")
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")
# common/speculative.cpp common_speculative_type_from_name_map, and the kinds that run a second model
# or context (COMMON_SPECULATIVE_TYPE_DRAFT_*: their n_max is --spec-draft-n-max).
SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
              "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DRAFT_SPEC_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"})
DRAFT_MTP = "draft-mtp"   # common_speculative_type_from_name_map: COMMON_SPECULATIVE_TYPE_DRAFT_MTP
# common.h need_n_rs_seq: the kinds whose target keeps recurrent rollback rows
ROLLBACK_SPEC_TYPES = frozenset({DRAFT_MTP, "draft-eagle3", "draft-dflash", "draft-dspark"})
_TRUTHY = ("on", "enabled", "true", "1")   # common/arg.cpp is_truthy / is_falsey
_FALSEY = ("off", "disabled", "false", "0")


class Tool(str, Enum):
    """Which llama.cpp programs read a flag."""

    COMMON = "common"   # common/arg.cpp: llama-server, llama-cli, llama-fit-params (each the options of its examples)
    SERVER = "server"   # common/arg.cpp options set_examples({LLAMA_EXAMPLE_SERVER}): llama-server only
    BENCH = "bench"     # tools/llama-bench/llama-bench.cpp, which parses its own argv


class Use(str, Enum):
    """What `parse_llama_flags` does with a flag fitplan reads."""

    SETS = "sets"         # changes a field of LlamaFlags
    IGNORED = "ignored"   # accepted, kept as written: it changes nothing in memory
    WRITTEN = "written"   # fitplan writes it itself (the model, where llama-server listens); not read from flags


@dataclass(frozen=True)
class Flag:
    """One llama.cpp option: its spellings in common/arg.cpp (fitplan writes the first), whether it takes a
    value, and llama-bench's spelling where llama-bench has the option (its own parser, other list syntax)."""

    names: tuple[str, ...] = ()   # common/arg.cpp; () for an option of llama-bench alone
    switch: bool = False          # takes no value in common/arg.cpp
    use: Use = Use.SETS
    server_only: bool = False     # common/arg.cpp set_examples({LLAMA_EXAMPLE_SERVER})
    bench: tuple[str, ...] = ()   # llama-bench.cpp's spellings; fitplan writes the first
    bench_sep: str = ","          # between a list's items in llama-bench
    bench_value: str = ""         # the value llama-bench takes for what this switch means (its options all take one)

    @property
    def programs(self) -> frozenset[Tool]:
        common = {Tool.SERVER} if self.server_only else {Tool.COMMON, Tool.SERVER}
        return frozenset((common if self.names else set()) | ({Tool.BENCH} if self.bench else set()))


# llama-bench reads ',' inside a value as another test row: its device and split lists use '/'
_BENCH_LIST = "/"


def _f(names: str, bench: str = "", **kw: Any) -> Flag:
    return Flag(tuple(names.split()), bench=tuple(bench.split()), **kw)


def _s(names: str, bench: str = "", **kw: Any) -> Flag:
    return _f(names, bench, switch=True, **kw)


# The one table of llama.cpp's spellings: parse_llama_flags reads every name of an entry, and every argv
# fitplan writes takes its spelling from here (`arg`, `bench_arg`). Keys are LlamaFlags' field names where
# there is one. Sources: common/arg.cpp, tools/llama-bench/llama-bench.cpp (cmd_params parsing).
FLAGS: dict[str, Flag] = {
    "n_ctx": _f("-c --ctx-size"),
    "n_batch": _f("-b --batch-size", "-b --batch-size"),
    "n_ubatch": _f("-ub --ubatch-size", "-ub --ubatch-size"),
    "n_parallel": _f("-np --parallel"),
    "n_gpu_layers": _f("-ngl --gpu-layers --n-gpu-layers", "-ngl --n-gpu-layers"),
    "split_mode": _f("-sm --split-mode", "-sm --split-mode"),
    "tensor_split": _f("-ts --tensor-split", "-ts --tensor-split", bench_sep=_BENCH_LIST),
    "main_gpu": _f("-mg --main-gpu", "-mg --main-gpu"),
    "devices": _f("-dev --device", "-dev --device", bench_sep=_BENCH_LIST),
    "rpc": _f("--rpc", "--rpc -rpc"),   # llama-bench: not a test parameter, servers separated by ','
    "override_tensor": _f("-ot --override-tensor", "-ot --override-tensor"),
    "n_cpu_moe": _f("-ncmoe --n-cpu-moe", "-ncmoe --n-cpu-moe"),
    "n_cpu_ffn": _f("-ncffn --n-cpu-ffn"),
    "cpu_moe": _s("-cmoe --cpu-moe"),
    "cache_type_k": _f("-ctk --cache-type-k", "-ctk --cache-type-k"),
    "cache_type_v": _f("-ctv --cache-type-v", "-ctv --cache-type-v"),
    "flash_attn": _f("-fa --flash-attn", "-fa --flash-attn"),   # llama-bench takes 0|1
    "load_mode": _f("-lm --load-mode"),
    "kv_unified": _s("-kvu --kv-unified"),
    "no_kv_unified": _s("-no-kvu --no-kv-unified"),
    "swa_full": _s("--swa-full"),
    "no_kv_offload": _s("-nkvo --no-kv-offload", "-nkvo --no-kv-offload", bench_value="1"),
    "kv_offload": _s("-kvo --kv-offload"),
    "no_repack": _s("-nr --no-repack", "--repack", bench_value="0"),
    "repack": _s("--repack", "--repack", bench_value="1"),
    "no_host": _s("--no-host", "--no-host", bench_value="1"),
    "no_op_offload": _s("--no-op-offload", "-nopo --no-op-offload", bench_value="1"),
    "op_offload": _s("--op-offload"),
    # older spellings of the load mode
    "mmap": _s("--mmap"),
    "no_mmap": _s("--no-mmap"),
    "mlock": _s("--mlock"),
    # companion models (common/arg.cpp: set_spec() options, mmproj_examples, --lora)
    "draft_model": _f("-md --model-draft --spec-draft-model"),
    "n_gpu_layers_draft": _f("-ngld --gpu-layers-draft --n-gpu-layers-draft --spec-draft-ngl"),
    "devices_draft": _f("-devd --device-draft --spec-draft-device"),
    "override_tensor_draft": _f("-otd --override-tensor-draft --spec-draft-override-tensor"),
    "n_cpu_moe_draft": _f("-ncmoed --n-cpu-moe-draft --spec-draft-ncmoe --spec-draft-n-cpu-moe"),
    "cpu_moe_draft": _s("-cmoed --cpu-moe-draft --spec-draft-cpu-moe"),
    "spec_draft_backend_sampling": _s("--spec-draft-backend-sampling"),
    "no_spec_draft_backend_sampling": _s("--no-spec-draft-backend-sampling"),
    "cache_type_k_draft": _f("-ctkd --cache-type-k-draft --spec-draft-type-k"),
    "cache_type_v_draft": _f("-ctvd --cache-type-v-draft --spec-draft-type-v"),
    "spec_draft_n_max": _f("--spec-draft-n-max --draft --draft-n --draft-max"),
    "spec_type": _f("--spec-type"),
    "spec_ngram_simple_size_m": _f("--spec-ngram-simple-size-m"),
    "spec_ngram_map_k_size_m": _f("--spec-ngram-map-k-size-m"),
    "spec_ngram_map_k4v_size_m": _f("--spec-ngram-map-k4v-size-m"),
    "spec_ngram_mod_n_max": _f("--spec-ngram-mod-n-max"),
    "mmproj": _f("-mm --mmproj"),
    "mmproj_device": _f("-mmdev --mmproj-device"),
    "mmproj_offload": _s("--mmproj-offload"),
    "no_mmproj_offload": _s("--no-mmproj-offload"),
    "image_min_tokens": _f("--image-min-tokens"),
    "image_max_tokens": _f("--image-max-tokens"),
    "lora": _f("--lora"),
    "lora_scaled": _f("--lora-scaled"),
    # accepted, changing nothing in memory, and written by fitplan's own commands
    "threads": _f("-t --threads", "-t --threads", use=Use.IGNORED),
    "fit": _f("-fit --fit", use=Use.IGNORED),
    "fit_target": _f("-fitt --fit-target", use=Use.IGNORED),
    "verbosity": _f("-lv --verbosity", use=Use.IGNORED),
    "verbose": _s("-v --verbose", use=Use.IGNORED),
    "host": _f("--host", use=Use.IGNORED, server_only=True),
    "port": _f("--port", use=Use.IGNORED, server_only=True),
    # what fitplan writes around a plan's flags: the model, and llama-bench's own test parameters
    "model": _f("-m --model", "-m --model", use=Use.WRITTEN),
    "model_url": _f("-mu --model-url", use=Use.WRITTEN),
    "fit_print": _f("--fit-print", use=Use.WRITTEN),   # llama-fit-params: print the fitted figures
    "models_preset": _f("--models-preset", use=Use.WRITTEN, server_only=True),   # the router's models (INI)
    "models_max": _f("--models-max", use=Use.WRITTEN, server_only=True),   # the router's most instances at once
    "embeddings": _s("--embeddings --embedding", use=Use.WRITTEN, server_only=True),
    "n_prompt": Flag(bench=("-p", "--n-prompt"), use=Use.WRITTEN),
    "n_gen": Flag(bench=("-n", "--n-gen"), use=Use.WRITTEN),
    "n_depth": Flag(bench=("-d", "--n-depth"), use=Use.WRITTEN),
    "repetitions": Flag(bench=("-r", "--repetitions"), use=Use.WRITTEN),
    "output": Flag(bench=("-o", "--output"), use=Use.WRITTEN),
}
_BY_NAME: dict[str, str] = {name: key for key, f in FLAGS.items() for name in f.names}


def _text(value: object, sep: str) -> str:
    """A value as llama.cpp reads it: numbers without a needless `.0`, lists joined by `sep`."""
    if isinstance(value, (tuple, list)):
        return sep.join(_text(v, sep) for v in value)
    if isinstance(value, float):
        return _fmt_float(value)
    return str(value)


def arg(key: str, value: object = None) -> list[str]:
    """The flag `key` as llama-server, llama-cli and llama-fit-params read it: `arg("n_gpu_layers", 99)` is
    ["-ngl", "99"], `arg("kv_unified")` ["-kvu"]; lists are joined by ','."""
    flag = FLAGS[key]
    if flag.switch != (value is None) or not flag.names:
        raise ValueError(f"llama.cpp flag {key}: {'a switch' if flag.switch else 'takes a value'}, got {value!r}")
    return [flag.names[0]] if value is None else [flag.names[0], _text(value, ",")]


def bench_arg(key: str, value: object = None) -> list[str]:
    """The flag `key` as llama-bench reads it: every option takes a value (a switch of llama.cpp takes the
    one that means it: `bench_arg("no_op_offload")` is ["-nopo", "1"]), device and split lists joined by '/'."""
    flag = FLAGS[key]
    if not flag.bench or (value is None and not flag.bench_value):
        raise ValueError(f"llama-bench has no option {key} (or it takes a value), got {value!r}")
    return [flag.bench[0], _text(flag.bench_value if value is None else value, flag.bench_sep)]


def spellings(key: str) -> frozenset[str]:
    """Every name the programs know the flag `key` by (llama-bench's included)."""
    return frozenset(FLAGS[key].names + FLAGS[key].bench)


def has_flag(key: str, argv: list[str] | tuple[str, ...]) -> bool:
    """Whether `argv` names the flag `key` (as an argument of its own, not `--name=value`)."""
    return not spellings(key).isdisjoint(argv)


def flag_key(name: str) -> str | None:
    """The table's key of a common/arg.cpp spelling (None: not in the table)."""
    return _BY_NAME.get(name)


def to_bench_argv(flags: list[str] | tuple[str, ...]) -> list[str]:
    """llama.cpp flags -> llama-bench's: its lists joined by '/' where ',' would start another test row, and
    llama.cpp switches written as the option with the value llama-bench takes for them (`--no-op-offload`
    is its `-nopo 1`); everything else as written."""
    out: list[str] = []
    for i, text in enumerate(flags):
        prev = FLAGS.get(_BY_NAME.get(flags[i - 1], "")) if i else None
        flag = FLAGS.get(_BY_NAME.get(text, ""))
        if prev is not None and not prev.switch and prev.bench and prev.bench_sep != ",":
            out.append(text.replace(",", prev.bench_sep))
        elif flag is not None and flag.switch and flag.bench_value:
            out += [flag.bench[0], flag.bench_value]
        else:
            out.append(text)
    return out


class OverrideKind(str, Enum):
    """The flags that override where tensors go, by llama.cpp's spelling without the dash."""

    OT = "ot"          # -ot PATTERN=BUFT[,...]
    CMOE = "cmoe"      # -cmoe: every routed expert on the CPU
    NCMOE = "ncmoe"    # -ncmoe N: the first N layers' routed experts on the CPU
    NCFFN = "ncffn"    # -ncffn N: the first N layers' dense FFN on the CPU

    @property
    def key(self) -> str:
        """The flag's key in FLAGS."""
        return _OVERRIDE_KEY[self]

    @property
    def flag(self) -> str:
        return FLAGS[self.key].names[0]

    @property
    def takes_value(self) -> bool:
        return self is not OverrideKind.CMOE


_OVERRIDE_KEY = {OverrideKind.OT: "override_tensor", OverrideKind.CMOE: "cpu_moe", OverrideKind.NCMOE: "n_cpu_moe",
                 OverrideKind.NCFFN: "n_cpu_ffn"}


@dataclass(frozen=True)
class OverrideArg:
    """One override flag as written, in command-line order."""

    kind: OverrideKind
    value: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OverrideKind(self.kind))   # accepts the spelling too


@dataclass(frozen=True)
class TensorOverride:
    pattern: str      # a std::regex searched in the tensor name
    target: str       # a buffer type name: CPU, CUDA0, RPC0[host:port], ...


def overrides_of(args: tuple[OverrideArg, ...]) -> tuple[TensorOverride, ...]:
    """The tensor buffer-type overrides of an override list in llama.cpp's order (first match wins)."""
    out: list[TensorOverride] = []
    for arg in args:
        if arg.kind is OverrideKind.OT:
            for item in arg.value.split(","):
                pattern, _, target = item.partition("=")
                out.append(TensorOverride(pattern, target))
        elif arg.kind is OverrideKind.CMOE:
            out.append(TensorOverride(FFN_EXPS_REGEX, "CPU"))
        else:
            regex = FFN_EXPS_REGEX if arg.kind is OverrideKind.NCMOE else FFN_DENSE_REGEX
            # llama.cpp adds one override per layer (llm_add_n_cpu_ffn_overrides); those past
            # LLAMA_MAX_LAYERS match no tensor, so -ncmoe 100000000 is -ncmoe 512 here
            n = min(int(arg.value), LLAMA_MAX_LAYERS)
            out.extend(TensorOverride(rf"blk\.{i}{regex}", "CPU") for i in range(n))
    return tuple(out)


@dataclass(frozen=True)
class DraftFlags:
    """The drafter's own flags (common_params_speculative_draft); everything else it inherits from the
    target's (common_base_params_to_speculative: -c, -np, -b, -ub, -fa, -ts, -sm, -mg, -kvu, -nkvo ...)."""

    model: str = ""                          # -md
    n_gpu_layers: int = NGL_AUTO             # -ngld (auto = every layer)
    devices: tuple[str, ...] | None = None   # -devd; None follows -dev
    override_args: tuple[OverrideArg, ...] = ()   # -otd, -cmoed, -ncmoed
    cache_type_k: str = "f16"                # -ctkd
    cache_type_v: str = "f16"                # -ctvd
    n_max: int = 3                           # --spec-draft-n-max
    # mtp: --[no-]spec-draft-backend-sampling: draft-mtp's top-k sampler in its context's graph (on by default)
    backend_sampling: bool = True

    @property
    def overrides(self) -> tuple[TensorOverride, ...]:
        return overrides_of(self.override_args)


@dataclass(frozen=True)
class SpecFlags:
    """Speculative decoding: `--spec-type` appends to llama.cpp's default list ["none"]."""

    types: tuple[str, ...] = ("none",)
    draft: DraftFlags = DraftFlags()
    # the proposal lengths of the n-gram kinds (common.h defaults), for the target's output rows
    ngram_simple_size_m: int = 48
    ngram_map_k_size_m: int = 48
    ngram_map_k4v_size_m: int = 48
    ngram_mod_n_max: int = 64

    @property
    def has_draft(self) -> bool:
        return bool(self.draft.model)

    @property
    def mtp_context(self) -> bool:
        """draft-mtp without -md: llama-server makes an MTP draft context on the target's own model
        (common/speculative.cpp common_speculative_init_result)."""
        return DRAFT_MTP in self.types and not self.has_draft

    @property
    def n_rs_seq(self) -> int:
        """common_params_speculative::need_n_rs_seq: the rollback rows each sequence's recurrent state keeps
        (cparams.n_rs_seq of the target's context) while a drafter of these kinds speculates."""
        return max(0, self.draft.n_max) if ROLLBACK_SPEC_TYPES.intersection(self.types) else 0

    @property
    def n_max(self) -> int:
        """common_speculative_n_max: the longest proposal of the enabled kinds (0 with none)."""
        by_type = {"ngram-simple": self.ngram_simple_size_m, "ngram-map-k": self.ngram_map_k_size_m,
                   "ngram-map-k4v": self.ngram_map_k4v_size_m, "ngram-mod": self.ngram_mod_n_max,
                   "ngram-cache": 8}
        sizes = [max(0, self.draft.n_max) if t in DRAFT_SPEC_TYPES else by_type.get(t, 0) for t in self.types]
        return max(sizes, default=0)


@dataclass(frozen=True)
class MmprojFlags:
    """The multimodal projector (mtmd): -mm, --no-mmproj-offload, -mmdev, --image-min/max-tokens."""

    path: str = ""
    use_gpu: bool = True                 # --mmproj-offload / --no-mmproj-offload
    device: str | None = None            # -mmdev; "none" keeps it on the CPU; None: the first of -dev
    image_min_tokens: int = -1           # -1: read from the model
    image_max_tokens: int = -1


@dataclass(frozen=True)
class LoraArg:
    path: str
    scale: float = 1.0


@dataclass(frozen=True)
class LlamaFlags:
    n_ctx: int = 0
    n_batch: int = 2048
    n_ubatch: int = 512
    n_parallel: int = 1
    kv_unified: bool = False
    n_gpu_layers: int = NGL_AUTO
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = 0
    devices: tuple[str, ...] | None = None   # -dev; ("none",) keeps everything on the CPU
    rpc: tuple[str, ...] = ()
    override_args: tuple[OverrideArg, ...] = ()
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"
    swa_full: bool = False
    kv_offload: bool = True
    repack: bool = True
    no_host: bool = False
    op_offload: bool = True      # --no-op-offload: host-weight ops stay on the CPU (cparams.op_offload)
    load_mode: str = "auto"
    spec: SpecFlags = SpecFlags()               # speculative decoding and its drafter
    mmproj: MmprojFlags = MmprojFlags()         # the multimodal projector
    loras: tuple[LoraArg, ...] = ()             # --lora / --lora-scaled, in order
    ignored: tuple[str, ...] = ()   # accepted flags that change nothing in memory, as written

    @property
    def overrides(self) -> tuple[TensorOverride, ...]:
        """The tensor buffer-type overrides in llama.cpp's order (first match wins)."""
        return overrides_of(self.override_args)

    @property
    def has_companions(self) -> bool:
        """A drafter (or draft-mtp's context on the target), a projector or an adapter: what llama-server and
        llama-cli load beside the target."""
        return self.spec.has_draft or self.spec.mtp_context or bool(self.mmproj.path) or bool(self.loras)

    @property
    def n_gpu_layers_all(self) -> bool:
        return self.n_gpu_layers < 0


def _int(flag: str, text: str, minimum: int | None = None) -> int:
    """An int as std::stoi reads one: ASCII digits ('٣' is none), within int32 (std::out_of_range)."""
    if not re.fullmatch(r"\s*[+-]?[0-9]{1,10}\s*", text, re.ASCII) or not INT_MIN <= int(text) <= INT_MAX:
        raise FlagError(f"{flag}: expected an integer from {INT_MIN} to {INT_MAX}, got {quote(text)}")
    value = int(text)
    if minimum is not None and value < minimum:
        raise FlagError(f"{flag}: {value} is out of range (minimum {minimum})")
    return value


def _n_parallel(text: str) -> int:
    """-np: llama_context refuses n_seq_max > LLAMA_MAX_SEQ (src/llama-context.cpp:101, "n_seq_max must
    be <= 256"; LLAMA_MAX_SEQ in src/llama-cparams.h)."""
    value = _int("-np", text, 1)
    if value > LLAMA_MAX_SEQ:
        raise FlagError(f"-np {value}: llama.cpp refuses it (n_seq_max must be <= {LLAMA_MAX_SEQ})")
    return value


def _choice(flag: str, text: str, choices: tuple[str, ...]) -> str:
    if text not in choices:
        raise FlagError(f"{flag}: invalid value {quote(text)}; expected one of {', '.join(choices)}")
    return text


def _ngl(text: str) -> int:
    if text == "auto":
        return NGL_AUTO
    if text == "all":
        return NGL_ALL
    return _int("-ngl", text)


def _tensor_split(text: str) -> tuple[float, ...]:
    parts = [p for p in re.split(r"[,/]+", text)]
    if len(parts) >= MAX_DEVICES:
        raise FlagError(f"-ts: got {len(parts)} values, llama.cpp accepts at most {MAX_DEVICES - 1}")
    try:
        if not text.isascii():   # float() reads '٣' as 3; std::stof does not
            raise ValueError(text)
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise FlagError(f"-ts: expected numbers separated by ',' or '/', got {quote(text)}") from None
    if not all(math.isfinite(v) and v >= 0 for v in values):
        # std::stof takes nan and inf, and llama_model's split arithmetic (cumulative shares, then
        # upper_bound) has no answer for them: refused, not placed by NaN comparisons
        raise FlagError(f"-ts {quote(text)}: expected finite proportions >= 0")
    return values


def _cache_type(flag: str, text: str) -> str:
    from planner.model.costs import CACHE_TYPES  # here: the command line's option table loads no gguf or numpy

    if text.lower() not in CACHE_TYPES:
        raise FlagError(f"{flag}: unsupported cache type {quote(text)}; expected one of {', '.join(CACHE_TYPES)}")
    return text.lower()


def _fa(text: str) -> str:
    if text in _TRUTHY:
        return "on"
    if text in _FALSEY:
        return "off"
    return _choice("-fa", text, FA_MODES)


def _ot(text: str) -> OverrideArg:
    for item in text.split(","):
        pattern, eq, target = item.partition("=")
        if not eq or not pattern or not target:
            raise FlagError(f"-ot: {quote(item)} is not PATTERN=BUFFER_TYPE")
        check_override_pattern(pattern)
    return OverrideArg(OverrideKind.OT, text)


Setter = Callable[[LlamaFlags, str], LlamaFlags]

# Every spelling of a flag that sets something -> how it changes LlamaFlags (the names come from FLAGS).
_VALUED: dict[str, Setter] = {}
_SWITCHES: dict[str, Setter] = {}


def _register(key: str, setter: Setter, switch: bool) -> None:
    flag = FLAGS[key]
    if flag.switch != switch or flag.use is not Use.SETS:
        raise ValueError(f"FLAGS[{key!r}] does not match its setter")   # caught by any import of this module
    for name in flag.names:
        (_SWITCHES if switch else _VALUED)[name] = setter


def _valued(key: str, setter: Setter) -> None:
    _register(key, setter, False)


def _switch(key: str, setter: Setter) -> None:
    _register(key, setter, True)


_valued("n_ctx", lambda f, v: replace(f, n_ctx=_int("-c", v, 0)))
_valued("n_batch", lambda f, v: replace(f, n_batch=_int("-b", v, 1)))
_valued("n_ubatch", lambda f, v: replace(f, n_ubatch=_int("-ub", v, 1)))
_valued("n_parallel", lambda f, v: replace(f, n_parallel=_n_parallel(v)))
_valued("n_gpu_layers", lambda f, v: replace(f, n_gpu_layers=_ngl(v)))
_valued("split_mode", lambda f, v: replace(f, split_mode=_choice("-sm", v, SPLIT_MODES)))
_valued("tensor_split", lambda f, v: replace(f, tensor_split=_tensor_split(v)))
_valued("main_gpu", lambda f, v: replace(f, main_gpu=_int("-mg", v)))
_valued("devices", lambda f, v: replace(f, devices=tuple(d.strip() for d in v.split(","))))
# a DNS name is at most 253 characters (RFC 1035); ggml-rpc.cpp parse_endpoint wants HOST:PORT and fails the
# server otherwise
MAX_HOST_CHARS = 253


def _rpc(text: str) -> tuple[str, ...]:
    out = []
    for e in (e.strip() for e in text.split(",")):
        if not e:
            continue
        host, sep, port = e.rpartition(":")
        if not sep or not host or len(host) > MAX_HOST_CHARS or not (port.isascii() and port.isdigit()) \
                or not 0 < int(port) < 65536:
            raise FlagError(f"--rpc: {quote(e)} is not HOST:PORT (ggml-rpc.cpp parse_endpoint)")
        out.append(e)
    return tuple(out)


_valued("rpc", lambda f, v: replace(f, rpc=f.rpc + _rpc(v)))
_valued("override_tensor", lambda f, v: replace(f, override_args=f.override_args + (_ot(v),)))
_valued("n_cpu_moe", lambda f, v: replace(
    f, override_args=f.override_args + (OverrideArg(OverrideKind.NCMOE, str(_int("-ncmoe", v, 0))),)))
_valued("n_cpu_ffn", lambda f, v: replace(
    f, override_args=f.override_args + (OverrideArg(OverrideKind.NCFFN, str(_int("-ncffn", v, 0))),)))
_valued("cache_type_k", lambda f, v: replace(f, cache_type_k=_cache_type("-ctk", v)))
_valued("cache_type_v", lambda f, v: replace(f, cache_type_v=_cache_type("-ctv", v)))
_valued("flash_attn", lambda f, v: replace(f, flash_attn=_fa(v)))
_valued("load_mode", lambda f, v: replace(f, load_mode=_choice("-lm", v, LOAD_MODES)))


def _draft(f: LlamaFlags, **changes: Any) -> LlamaFlags:
    return replace(f, spec=replace(f.spec, draft=replace(f.spec.draft, **changes)))


def _spec(f: LlamaFlags, **changes: Any) -> LlamaFlags:
    return replace(f, spec=replace(f.spec, **changes))


def _mmproj(f: LlamaFlags, **changes: Any) -> LlamaFlags:
    return replace(f, mmproj=replace(f.mmproj, **changes))


def _spec_types(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(","))
    for t in names:
        _choice("--spec-type", t, SPEC_TYPES)
    return names


def _mmproj_device(f: LlamaFlags, text: str) -> LlamaFlags:
    """-mmdev: "none" keeps the projector on the CPU; one device only (common/arg.cpp)."""
    devs = [d.strip() for d in text.split(",") if d.strip()]
    if devs == ["none"]:
        return _mmproj(f, use_gpu=False, device=None)
    if len(devs) != 1:
        raise FlagError("-mmdev: only one device may be specified for mmproj")
    return _mmproj(f, use_gpu=True, device=devs[0])


def _lora_scaled(text: str) -> tuple[LoraArg, ...]:
    out = []
    for item in text.split(","):
        path, sep, scale = item.rpartition(":")
        if not sep or not path:
            raise FlagError(f"--lora-scaled: {quote(item)} is not FNAME:SCALE")
        try:
            out.append(LoraArg(path, float(scale)))
        except ValueError:
            raise FlagError(f"--lora-scaled: {quote(scale)} is not a number") from None
    return tuple(out)


# Companion models (common/arg.cpp: set_spec() options, mmproj_examples, --lora).
_valued("draft_model", lambda f, v: _draft(f, model=v))
_valued("n_gpu_layers_draft",
        lambda f, v: _draft(f, n_gpu_layers=_ngl(v)))
_valued("devices_draft",
        lambda f, v: _draft(f, devices=tuple(d.strip() for d in v.split(","))))
_valued("override_tensor_draft",
        lambda f, v: _draft(f, override_args=f.spec.draft.override_args + (_ot(v),)))
_valued("n_cpu_moe_draft", lambda f, v: _draft(
    f, override_args=f.spec.draft.override_args + (OverrideArg(OverrideKind.NCMOE, str(_int("-ncmoed", v, 0))),)))
_switch("cpu_moe_draft",
        lambda f, _: _draft(f, override_args=f.spec.draft.override_args + (OverrideArg(OverrideKind.CMOE),)))
_switch("spec_draft_backend_sampling", lambda f, _: _draft(f, backend_sampling=True))
_switch("no_spec_draft_backend_sampling", lambda f, _: _draft(f, backend_sampling=False))
_valued("cache_type_k_draft",
        lambda f, v: _draft(f, cache_type_k=_cache_type("-ctkd", v)))
_valued("cache_type_v_draft",
        lambda f, v: _draft(f, cache_type_v=_cache_type("-ctvd", v)))
_valued("spec_draft_n_max",
        lambda f, v: _draft(f, n_max=_int("--spec-draft-n-max", v, 0)))
_valued("spec_type", lambda f, v: _spec(f, types=f.spec.types + _spec_types(v)))
_valued("spec_ngram_simple_size_m",
        lambda f, v: _spec(f, ngram_simple_size_m=_int("--spec-ngram-simple-size-m", v, 0)))
_valued("spec_ngram_map_k_size_m", lambda f, v: _spec(f, ngram_map_k_size_m=_int("--spec-ngram-map-k-size-m", v, 0)))
_valued("spec_ngram_map_k4v_size_m",
        lambda f, v: _spec(f, ngram_map_k4v_size_m=_int("--spec-ngram-map-k4v-size-m", v, 0)))
_valued("spec_ngram_mod_n_max", lambda f, v: _spec(f, ngram_mod_n_max=_int("--spec-ngram-mod-n-max", v, 0)))
_valued("mmproj", lambda f, v: _mmproj(f, path=v))
_valued("mmproj_device", _mmproj_device)
_switch("mmproj_offload", lambda f, _: _mmproj(f, use_gpu=True))
_switch("no_mmproj_offload", lambda f, _: _mmproj(f, use_gpu=False))
_valued("image_min_tokens", lambda f, v: _mmproj(f, image_min_tokens=_int("--image-min-tokens", v)))
_valued("image_max_tokens", lambda f, v: _mmproj(f, image_max_tokens=_int("--image-max-tokens", v)))
_valued("lora", lambda f, v: replace(f, loras=f.loras + tuple(LoraArg(p.strip()) for p in v.split(",") if p.strip())))
_valued("lora_scaled", lambda f, v: replace(f, loras=f.loras + _lora_scaled(v)))

_switch("cpu_moe", lambda f, _: replace(f, override_args=f.override_args + (OverrideArg(OverrideKind.CMOE),)))
_switch("kv_unified", lambda f, _: replace(f, kv_unified=True))
_switch("no_kv_unified", lambda f, _: replace(f, kv_unified=False))
_switch("swa_full", lambda f, _: replace(f, swa_full=True))
_switch("no_kv_offload", lambda f, _: replace(f, kv_offload=False))
_switch("kv_offload", lambda f, _: replace(f, kv_offload=True))
_switch("no_repack", lambda f, _: replace(f, repack=False))
_switch("repack", lambda f, _: replace(f, repack=True))
_switch("no_host", lambda f, _: replace(f, no_host=True))
_switch("no_op_offload", lambda f, _: replace(f, op_offload=False))
_switch("op_offload", lambda f, _: replace(f, op_offload=True))
# Older spellings of the load mode; the fit dry run never maps, so they change no figure here.
_switch("mmap", lambda f, _: replace(f, load_mode="mmap"))
_switch("no_mmap", lambda f, _: replace(f, load_mode="none"))
_switch("mlock", lambda f, _: replace(f, load_mode="mlock"))

# Accepted flags that change nothing llama.cpp's memory breakdown counts (threads, sampling,
# server, logging); valued ones take one argument.
_IGNORED_VALUED_WORDS = """
-tb --threads-batch -C --cpu-mask -Cb --cpu-mask-batch --prio --prio-batch
-n --predict --n-predict -s --seed --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n
-a --alias --keep -p --prompt -f --file -sys --system-prompt --chat-template --jinja-file
--log-file -ctxcp --ctx-checkpoints -cram --cache-ram --numa
-fitc --fit-ctx --timeout --threads-http --reasoning-budget --reasoning-format -to --timeout
-td --threads-draft --spec-draft-threads -tbd --threads-batch-draft --spec-draft-threads-batch
--spec-draft-n-min --draft-min --draft-n-min --spec-draft-p-split --draft-p-split --spec-draft-p-min --draft-p-min
--spec-ngram-mod-n-min --spec-ngram-mod-n-match --spec-ngram-simple-size-n --spec-ngram-simple-min-hits
--spec-ngram-map-k-size-n --spec-ngram-map-k-min-hits --spec-ngram-map-k4v-size-n --spec-ngram-map-k4v-min-hits
--mtmd-batch-max-tokens
"""
_IGNORED = [f for f in FLAGS.values() if f.use is Use.IGNORED]
IGNORED_VALUED = frozenset(_IGNORED_VALUED_WORDS.split()).union(*(f.names for f in _IGNORED if not f.switch))
_IGNORED_SWITCHES_WORDS = """
--log-disable --log-colors --no-warmup --warmup -cnv --conversation -no-cnv --no-conversation
--jinja --no-jinja -cb --cont-batching -nocb --no-cont-batching --context-shift --no-context-shift
--metrics --slots --no-slots --no-perf --perf -i --interactive --simple-io --no-display-prompt
-e --escape --no-escape --check-tensors -dio --direct-io
--lora-init-without-apply
--mmproj-auto --no-mmproj --no-mmproj-auto
"""
IGNORED_SWITCHES = frozenset(_IGNORED_SWITCHES_WORDS.split()).union(*(f.names for f in _IGNORED if f.switch))


def parse_llama_flags(argv: list[str] | tuple[str, ...]) -> LlamaFlags:
    """Parse llama.cpp flags; an unknown flag or a value llama.cpp refuses raises FlagError."""
    flags = LlamaFlags()
    ignored: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in _VALUED or name in IGNORED_VALUED:
            if eq:
                value = inline
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise FlagError(f"{name}: expected a value")
            if name in _VALUED:
                flags = _VALUED[name](flags, value)
            else:
                ignored += [name, value]
        elif name in _SWITCHES and not eq:
            flags = _SWITCHES[name](flags, "")
        elif name in IGNORED_SWITCHES and not eq:
            ignored.append(name)
        else:
            raise FlagError(f"unknown llama.cpp flag {quote(arg)}")
        i += 1
    return replace(flags, ignored=tuple(ignored))


def _fmt_float(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


# the settings flags_to_argv writes where they differ from llama.cpp's default, in this order
_SETTINGS = ("n_ctx", "n_batch", "n_ubatch", "n_parallel", "split_mode", "main_gpu", "cache_type_k", "cache_type_v",
             "flash_attn", "load_mode")


def _ngl_text(n: int) -> str | int:
    return "all" if n == NGL_ALL else n


def flags_to_argv(flags: LlamaFlags) -> list[str]:
    """The shortest llama.cpp argv that parses back to `flags` (defaults are left out)."""
    d = LlamaFlags()
    out: list[str] = []
    if flags.rpc:
        out += arg("rpc", flags.rpc)
    if flags.devices is not None:
        out += arg("devices", flags.devices)
    if flags.n_gpu_layers != d.n_gpu_layers:
        out += arg("n_gpu_layers", _ngl_text(flags.n_gpu_layers))
    if flags.tensor_split:
        out += arg("tensor_split", flags.tensor_split)
    for key in _SETTINGS:
        if getattr(flags, key) != getattr(d, key):
            out += arg(key, getattr(flags, key))
    for o in flags.override_args:
        out += arg(o.kind.key, o.value if o.kind.takes_value else None)
    for key, on in (("kv_unified", flags.kv_unified), ("swa_full", flags.swa_full),
                    ("no_kv_offload", not flags.kv_offload), ("no_repack", not flags.repack),
                    ("no_host", flags.no_host), ("no_op_offload", not flags.op_offload)):
        if on:
            out += arg(key)
    return out + companion_argv(flags) + list(flags.ignored)


def companion_argv(flags: LlamaFlags) -> list[str]:
    """The drafter, projector and adapter flags, in llama.cpp's spelling (defaults left out)."""
    out = _spec_argv(flags.spec)
    mm = flags.mmproj
    if mm.path:
        out += arg("mmproj", mm.path)
        if not mm.use_gpu:
            out += arg("no_mmproj_offload")
        elif mm.device is not None:
            out += arg("mmproj_device", mm.device)
        out += _changed((("image_min_tokens", mm.image_min_tokens, -1),
                         ("image_max_tokens", mm.image_max_tokens, -1)))
    for lora in flags.loras:
        out += (arg("lora", lora.path) if lora.scale == 1.0
                else arg("lora_scaled", f"{lora.path}:{_fmt_float(lora.scale)}"))
    return out


def _changed(triples: tuple[tuple[str, object, object], ...]) -> list[str]:
    return [x for key, value, default in triples if value != default for x in arg(key, value)]


_DRAFT_OVERRIDE_KEY = {OverrideKind.OT: "override_tensor_draft", OverrideKind.CMOE: "cpu_moe_draft",
                       OverrideKind.NCMOE: "n_cpu_moe_draft"}


def _spec_argv(spec: SpecFlags) -> list[str]:
    dd, ds, draft = DraftFlags(), SpecFlags(), spec.draft
    out: list[str] = arg("draft_model", draft.model) if draft.model else []
    if draft.devices is not None:
        out += arg("devices_draft", draft.devices)
    if draft.n_gpu_layers != dd.n_gpu_layers:
        out += arg("n_gpu_layers_draft", _ngl_text(draft.n_gpu_layers))
    for o in draft.override_args:
        out += arg(_DRAFT_OVERRIDE_KEY[o.kind], o.value if o.kind.takes_value else None)
    out += _changed((("cache_type_k_draft", draft.cache_type_k, dd.cache_type_k),
                     ("cache_type_v_draft", draft.cache_type_v, dd.cache_type_v),
                     ("spec_draft_n_max", draft.n_max, dd.n_max)))
    if not draft.backend_sampling:
        out += arg("no_spec_draft_backend_sampling")
    added = list(spec.types[1:]) if spec.types[:1] == ("none",) else list(spec.types)
    if added:
        out += arg("spec_type", added)
    return out + _changed((
        ("spec_ngram_simple_size_m", spec.ngram_simple_size_m, ds.ngram_simple_size_m),
        ("spec_ngram_map_k_size_m", spec.ngram_map_k_size_m, ds.ngram_map_k_size_m),
        ("spec_ngram_map_k4v_size_m", spec.ngram_map_k4v_size_m, ds.ngram_map_k4v_size_m),
        ("spec_ngram_mod_n_max", spec.ngram_mod_n_max, ds.ngram_mod_n_max)))


def changed_fields(flags: LlamaFlags) -> list[str]:
    """Names of the fields that differ from llama.cpp's defaults (for reports)."""
    d = LlamaFlags()
    return [f.name for f in fields(flags) if getattr(flags, f.name) != getattr(d, f.name)]


def takes_value(name: str) -> bool | None:
    """Whether llama.cpp reads the next argument as this flag's value (True), it is a switch
    (False), or fitplan does not know the flag (None)."""
    if name in _VALUED or name in IGNORED_VALUED:
        return True
    if name in _SWITCHES or name in IGNORED_SWITCHES:
        return False
    return None

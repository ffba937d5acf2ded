"""A profile's sections and the `Profile` itself: pydantic models, strict types, unknown keys forbidden.

What a valid profile is, field by field; the rules that span fields are `rules.py`, and turning
YAML into one (with every problem's file and line) is `validate.py`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ddtree_ops.errors import ProfileError

MODES = ("nextn", "dflash", "ddtree-shadow", "ddtree")
Mode = Literal["nextn", "dflash", "ddtree-shadow", "ddtree"]

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # a pattern validation names in words (validate.py)
ABS_PATH = r"^/"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True, frozen=True)


Fraction = Annotated[float, Field(gt=0, lt=1)]
Port = Annotated[int, Field(ge=1, le=65535)]
PosInt = Annotated[int, Field(ge=1)]
AbsPath = Annotated[str, Field(pattern=ABS_PATH)]
Seconds = Annotated[float, Field(gt=0)]

AttentionBackend = Literal[
    "flashinfer", "triton", "fa3", "fa4", "trtllm_mha", "trtllm_mla", "flashmla",
    "cutlass_mla", "torch_native", "flex_attention",
]


class HostSection(_Strict):
    # ssh: reached through ssh_config by ssh_host; local: the tool runs on the GPU host itself
    # (a cron smoke check or diagnose there, or a machine without sshd)
    transport: Literal["ssh", "local"] = "ssh"
    ssh_host: Annotated[str, Field(min_length=1)] | None = None
    user: str | None = None
    port: Port | None = None
    sudo: bool = False
    host_key_policy: Literal["accept-new", "strict"] = "accept-new"


class GpuSection(_Strict):
    model: str
    memory_mib: Annotated[int, Field(ge=1024, le=1 << 22)]
    arch: Annotated[str, Field(pattern=r"^sm_\d{2,3}$")]
    count: Annotated[int, Field(ge=1, le=64)] = 1


CardIndex = Annotated[int, Field(ge=0, le=63)]


class ParallelSection(_Strict):
    """SGLang's own parallel sizes, under their flag names (--tp-size, --dp-size, --pp-size,
    --ep-size). GPUs a service needs: dp x tp x pp in all (dp counts replicas, as `--dp-size` does
    since attention DP moved to its own flag), split evenly over its nodes."""

    tp_size: Annotated[int, Field(ge=1, le=64)] = 1
    dp_size: Annotated[int, Field(ge=1, le=64)] = 1
    pp_size: Annotated[int, Field(ge=1, le=64)] = 1
    ep_size: Annotated[int, Field(ge=1, le=64)] = 1

    @property
    def world(self) -> int:
        return self.dp_size * self.tp_size * self.pp_size


class GpuCard(_Strict):
    """One card the service owns: its index on the host (nvidia-smi's, rendered into
    CUDA_VISIBLE_DEVICES) and, where it differs from the `gpu:` section, its own facts."""

    index: CardIndex
    model: str | None = None
    memory_mib: Annotated[int, Field(ge=1024, le=1 << 22)] | None = None
    arch: Annotated[str, Field(pattern=r"^sm_\d{2,3}$")] | None = None


@dataclass(frozen=True)
class Card:
    """A card with every fact filled in (from its own entry, else the profile's gpu section)."""

    index: int
    model: str
    memory_mib: int
    arch: str


class MultinodeSection(_Strict):
    """One SGLang service over several hosts: the same launch line on each node, with --nnodes,
    --node-rank and --dist-init-addr. Written in a service file (profiles/services/<name>.yaml);
    the tool fills in `service` and `node_rank` from the file's name and the order of `nodes`."""

    nodes: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=2, max_length=64)]
    # rank 0's address as the OTHER nodes reach it (torch's TCPStore listens there): an IP or a name
    # they resolve; ssh_config's HostName is how this machine reaches it, which may be another network
    dist_init_host: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:\[\]-]+$")]
    dist_init_port: Port = 20000
    # SGLang's --dist-timeout: how long the store waits for every node, and how long a collective
    # waits for a dead peer before NCCL's watchdog takes the survivors down
    dist_timeout_s: Annotated[int, Field(ge=1, le=86400)] | None = None
    service: str = ""
    node_rank: Annotated[int, Field(ge=0)] = 0

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def dist_init_addr(self) -> str:
        host = f"[{self.dist_init_host}]" if ":" in self.dist_init_host and not self.dist_init_host.startswith("[") \
            else self.dist_init_host
        return f"{host}:{self.dist_init_port}"


class ServiceSection(_Strict):
    unit: Annotated[str, Field(pattern=r"^[A-Za-z0-9:_.@-]+\.service$")]
    python: AbsPath
    listen_host: str = "127.0.0.1"
    port: Port = 30000
    user: str = "root"
    model_path: AbsPath
    served_model_name: str | None = None
    restart_sec: Seconds = 30
    start_limit_burst: PosInt = 3
    start_limit_interval_s: Seconds = 600
    timeout_start_s: Seconds = 1800
    timeout_stop_s: Seconds = 120
    state_dir: AbsPath = "/var/lib/ddtree-ops"
    env_dir: AbsPath = "/etc/ddtree-ops"
    env: dict[Annotated[str, Field(pattern=ENV_NAME)], str] = {}
    # launch flags the profile does not model (e.g. --load-format dummy), appended as given;
    # checked by the host's own SGLang parser at preflight
    extra_args: list[str] = []
    # name -> "env:VAR" (read on the control machine at render time), "file:/path", or a literal
    secrets: dict[Annotated[str, Field(pattern=ENV_NAME)], str] = {}


class MemorySection(_Strict):
    mem_fraction_static: Fraction
    context_length: Annotated[int, Field(ge=256, le=4_194_304)]
    max_running_requests: Annotated[int, Field(ge=1, le=4096)]
    attention_backend: AttentionBackend
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    kv_cache_dtype: Literal["auto", "fp8_e5m2", "fp8_e4m3", "bf16"] = "auto"
    page_size: Annotated[int, Field(ge=1, le=1024)] = 1
    cuda_graph: bool = True
    cuda_graph_max_bs: Annotated[int, Field(ge=1, le=1024)] | None = 8
    chunked_prefill_size: Annotated[int, Field(ge=64)] | None = None
    quantization: str | None = None


class NextnMode(_Strict):
    algorithm: Literal["NEXTN"] = "NEXTN"
    # None for MTP-bearing checkpoints, where SGLang uses the target's own MTP layers
    draft_model_path: AbsPath | None = None
    num_steps: Annotated[int, Field(ge=1, le=16)] = 3
    eagle_topk: Annotated[int, Field(ge=1, le=16)] = 1
    num_draft_tokens: Annotated[int, Field(ge=2, le=64)] = 4


class DflashMode(_Strict):
    algorithm: Literal["DFLASH"] = "DFLASH"
    draft_model_path: AbsPath
    block_size: Annotated[int, Field(ge=2, le=64)] = 16
    draft_attention_backend: AttentionBackend | None = None


class ShadowSettings(_Strict):
    share: Annotated[float, Field(ge=0, le=1)] = 0.25
    report_every: PosInt = 64


class DDTreeShadowMode(_Strict):
    algorithm: Literal["DDTREE"] = "DDTREE"
    draft_model_path: AbsPath
    block_size: Annotated[int, Field(ge=2, le=64)] = 16
    budget: Annotated[int, Field(ge=1, le=4096)] = 64
    draft_attention_backend: AttentionBackend | None = None
    shadow: ShadowSettings = ShadowSettings()


class TreeServingSettings(_Strict):
    # the share of verify rounds that verify the chain's spine alone (DFlash's own round), so that the
    # tree's verify cost against the chain's is measured on the same traffic (DDTREE_CHAIN_SHARE)
    chain_share: Annotated[float, Field(ge=0, le=0.5)] = 0.05
    report_every: PosInt = 64


class DDTreeMode(_Strict):
    """Tree serving: the DDTree tree is verified and committed, the chain's spine inside it, so every
    round also measures the chain (the plugin's DDTREE_MODE=tree). The tree a host serves is the one
    its shadow measured: draft, block size, budget and draft attention backend left out are
    modes.ddtree-shadow's (`Profile.mode` fills them in); given, they must be the same (a rule)."""

    algorithm: Literal["DDTREE"] = "DDTREE"
    draft_model_path: AbsPath | None = None
    block_size: Annotated[int, Field(ge=2, le=64)] | None = None
    budget: Annotated[int, Field(ge=1, le=4096)] | None = None
    draft_attention_backend: AttentionBackend | None = None
    tree: TreeServingSettings = TreeServingSettings()

    def resolved_from(self, shadow: DDTreeShadowMode | None) -> DDTreeMode:
        """This mode with what it leaves out taken from the shadow's (else the shadow's defaults)."""
        base = shadow or DDTreeShadowMode.model_construct(draft_model_path=self.draft_model_path)
        fill = {k: getattr(base, k) for k in INHERITED if getattr(self, k) is None}
        return self.model_copy(update=fill) if fill else self


# what mode ddtree takes from mode ddtree-shadow when it does not say
INHERITED = ("draft_model_path", "block_size", "budget", "draft_attention_backend")


ModeConfig = Union[NextnMode, DflashMode, DDTreeShadowMode, DDTreeMode]


class ModesSection(_Strict):
    nextn: NextnMode
    dflash: DflashMode | None = None
    ddtree_shadow: DDTreeShadowMode | None = Field(default=None, alias="ddtree-shadow")
    ddtree: DDTreeMode | None = None


class GateSection(_Strict):
    startup_deadline_s: Seconds = 900
    stay_healthy_s: Annotated[float, Field(ge=0)] = 30
    poll_interval_s: Annotated[float, Field(gt=0, le=60)] = 0.25
    http_timeout_s: Seconds = 10


class SmokeSection(_Strict):
    prompt: Annotated[str, Field(min_length=1)] = "The capital of France is"
    max_new_tokens: Annotated[int, Field(ge=1, le=4096)] = 16
    latency_warning_s: Seconds = 2.0
    latency_critical_s: Seconds = 5.0
    accept_len_warning: Annotated[float, Field(ge=1)] = 1.5
    accept_len_critical: Annotated[float, Field(ge=1)] = 1.1
    golden: str | None = None


class ReleasesSection(_Strict):
    keep: Annotated[int, Field(ge=2, le=100)] = 5


class RollbackSection(_Strict):
    # known-good-mode: the last release of `known_good_mode` (NEXTN) that passed, the mission's
    # baseline; last-good: the last release of any mode that passed (an operator's opt-in)
    target: Literal["known-good-mode", "last-good"] = "known-good-mode"


class PromoteSection(_Strict):
    """What `promote` asks of the shadow before the switch, and of the served tree after it."""

    min_rounds: Annotated[int, Field(ge=20, le=10_000_000)] = 1000  # exact greedy rounds, before and live
    min_speedup: Annotated[float, Field(ge=1.0, le=10.0)] = 1.05  # the projected speedup's 95% lower bound
    tolerance: Annotated[float, Field(gt=0, lt=1)] = 0.03  # served tau_tree this far below the prediction: a miss
    live_deadline_s: Seconds = 600  # no verdict live by then (no traffic included) is a miss
    poll_s: Annotated[float, Field(gt=0, le=300)] = 5.0


class Profile(_Strict):
    name: str
    host: HostSection
    gpu: GpuSection
    service: ServiceSection
    memory: MemorySection
    # the mode this host should run: `deploy HOST` converges to it, `--mode` overrides it for one run
    # (YAML `mode:`; the attribute is `desired_mode` because `mode()` looks a mode's settings up)
    desired_mode: Mode = Field(default="nextn", alias="mode")
    known_good_mode: Mode = "nextn"
    rollback: RollbackSection = RollbackSection()
    promote: PromoteSection = PromoteSection()
    modes: ModesSection
    gate: GateSection = GateSection()
    smoke: SmokeSection = SmokeSection()
    releases: ReleasesSection = ReleasesSection()
    # None: the service owns card 0 alone and the launch line says nothing about parallelism (as
    # before these sections existed); set, the launch line names its sizes and its cards
    parallel: ParallelSection | None = None
    gpus: Annotated[list[GpuCard], Field(min_length=1, max_length=64)] | None = None
    multinode: MultinodeSection | None = None

    @field_validator("gpus", mode="before")
    @classmethod
    def _card_indexes(cls, value: Any) -> Any:
        # `gpus: [0, 1]` is the short form of `gpus: [{index: 0}, {index: 1}]`
        if isinstance(value, list):
            return [{"index": v} if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        return value

    def mode(self, name: str) -> ModeConfig:
        cfg = {"nextn": self.modes.nextn, "dflash": self.modes.dflash,
               "ddtree-shadow": self.modes.ddtree_shadow, "ddtree": self.modes.ddtree}.get(name)
        if isinstance(cfg, DDTreeMode):
            cfg = cfg.resolved_from(self.modes.ddtree_shadow)
        if cfg is None:
            configured = ", ".join(self.configured_modes())
            raise ProfileError([f"{self.name}: mode {name!r} is not configured (configured: {configured})"])
        return cfg

    def configured_modes(self) -> list[str]:
        return [m for m, c in (("nextn", self.modes.nextn), ("dflash", self.modes.dflash),
                               ("ddtree-shadow", self.modes.ddtree_shadow), ("ddtree", self.modes.ddtree))
                if c is not None]

    @property
    def arch_number(self) -> int:
        return int(self.gpu.arch.removeprefix("sm_"))

    @property
    def sizes(self) -> ParallelSection:
        return self.parallel or ParallelSection()

    @property
    def nnodes(self) -> int:
        return self.multinode.nnodes if self.multinode else 1

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.sizes.world // self.nnodes)

    def cards(self) -> list[Card]:
        """The cards this service owns on this host, each with its facts; card 0 alone when the
        profile lists none (what SGLang uses with one rank and no CUDA_VISIBLE_DEVICES)."""
        g = self.gpu
        entries = self.gpus or [GpuCard(index=0)]
        return [Card(c.index, c.model or g.model, c.memory_mib or g.memory_mib, c.arch or g.arch) for c in entries]

    def resolved(self) -> dict[str, Any]:
        """The resolved profile as plain data, with mode keys as operators write them."""
        return self.model_dump(mode="json", by_alias=True)

    def sha256(self) -> str:
        """Hash of the resolved profile; secrets enter by reference, never by value."""
        canon = json.dumps(self.resolved(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()

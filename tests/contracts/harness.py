"""vLLM's real scheduler and HiState's real worker connector, with a model that writes pages.

What a contract test needs from an engine, without a GPU or a model forward: vLLM's
`Scheduler` (whatever version is installed) builds the steps and drives
`HiStateConnector`'s scheduler side; a second `HiStateConnector` in the worker role owns
CPU tensors laid out as vLLM lays a hybrid model's caches and moves bytes through its real
worker (DRAM pool, SSD store). The "model" writes, at each step, what a real forward would
leave behind, as a function of the tokens alone:
- attention page of block j: `page(tokens[: end of block j], layer)`;
- recurrent state after computing `n` tokens: `page(tokens[:n], layer)` in the request's
  running state block (align mode: block `(n - 1) // block_size`).
Before it computes anything for a request it checks what that step reads: every attention
block before the first computed token and the running state there hold exactly the pages
of the tokens so far. A restore that brought a wrong, stale or shifted byte fails there.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from vllm import SamplingParams
from vllm.config import KVTransferConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from histate_vllm.connector import HiStateConnector

ATTN = "model.layers.3.self_attn.attn"
# An EAGLE-type drafter's attention layer (MTP), in a KV cache group of its own.
DRAFT = "mtp.layers.0.self_attn.attn"
STATES = ("model.layers.0.linear_attn", "model.layers.1.linear_attn",
          "model.layers.2.linear_attn")
EOS = 2047


def page(tokens, layer: str, nbytes: int) -> np.ndarray:
    """What a forward over `tokens` leaves in one page of `layer`: bytes only they decide."""
    digest = hashlib.blake2b(np.asarray(tokens, dtype=np.int64).tobytes(),
                             key=layer.encode()[:64], digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    return rng.integers(-128, 128, nbytes, dtype=np.int8)


def vllm_config(model: str, extra: dict, *, block_size: int, num_blocks: int,
                step_tokens: int, kv_events: bool = False, speculative: dict | None = None):
    from vllm.config import KVEventsConfig

    args = EngineArgs(
        model=model, enable_prefix_caching=True, max_model_len=16384,
        max_num_batched_tokens=step_tokens, block_size=block_size,
        num_gpu_blocks_override=num_blocks, async_scheduling=False,
        kv_transfer_config=KVTransferConfig(
            kv_connector="HiStateConnector", kv_connector_module_path="histate_vllm.connector",
            kv_role="kv_both", kv_connector_extra_config=extra),
        kv_events_config=(KVEventsConfig(enable_kv_cache_events=True, publisher="null")
                          if kv_events else None),
        **({"speculative_config": speculative} if speculative else {}),
    )
    config = args.create_engine_config()
    config.cache_config.num_gpu_blocks = num_blocks
    return config


def allocations(aliased: bool, drafter: bool | str = False) -> list[list[str]]:
    """Layers by the allocation they share (vLLM overlays a hybrid model's groups)."""
    extra = [[DRAFT]] if drafter else []
    if aliased:
        return [[ATTN, STATES[0]], [STATES[1]], [STATES[2]]] + extra
    return [[name] for name in (ATTN, *STATES)] + extra


def layer_tensors(kv_config: KVCacheConfig, aliased: bool,
                  drafter: bool | str = False) -> dict[str, torch.Tensor]:
    """Each layer's [num_blocks, page] int8 cache, zeroed; aliased layers share one."""
    out = {}
    for names in allocations(aliased, drafter):
        buf = torch.zeros(kv_config.num_blocks, kv_config.kv_cache_tensors[0].block_stride,
                          dtype=torch.int8)
        out.update(dict.fromkeys(names, buf))
    return out


def kv_cache_config(block_size: int, num_blocks: int, *, aliased: bool,
                    drafter: bool | str = False) -> KVCacheConfig:
    """A hybrid model's two groups as vLLM builds them: one attention layer and three
    recurrent layers whose state pages are padded to the attention page. `aliased`: the
    attention layer shares its tensor with the first recurrent layer (vLLM's hybrid
    allocation), else every layer has its own. `drafter`: a third group, an EAGLE-type
    drafter's attention layer as vLLM marks it (`is_eagle_group`); "other-heads": with a
    head layout of its own (same page size), so vLLM looks its blocks up apart from the
    target's attention (an EAGLE head on another model's layout)."""
    attn = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=32,
                             dtype=torch.bfloat16)
    state = MambaSpec(block_size=block_size, shapes=((3, 64), (2, 16, 16)),
                      dtypes=(torch.bfloat16, torch.float32),
                      page_size_padded=attn.page_size_bytes, mamba_cache_mode="align")
    pg = attn.page_size_bytes
    tensors = [KVCacheTensor(size=pg * num_blocks, layers=[name], layer_stride=pg * num_blocks,
                             block_stride=pg)
               for names in allocations(aliased, drafter) for name in names]
    groups = [KVCacheGroupSpec([ATTN], attn), KVCacheGroupSpec(list(STATES), state)]
    if drafter:
        spec = attn if drafter is True else FullAttentionSpec(
            block_size=block_size, num_kv_heads=2, head_size=16, dtype=torch.bfloat16)
        assert spec.page_size_bytes == attn.page_size_bytes
        groups.append(KVCacheGroupSpec([DRAFT], spec, is_eagle_group=True))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors,
                         kv_cache_groups=groups)


class Engine:
    """One engine: vLLM's scheduler, HiState's worker connector, the page-writing model."""

    def __init__(self, model: str, extra: dict, *, block_size: int = 256,
                 num_blocks: int = 64, step_tokens: int = 1024, aliased: bool = True,
                 kv_events: bool = False, drafter: bool | str = False,
                 speculative: dict | None = None):
        self.bs = block_size
        self.attn_layers = (ATTN, DRAFT) if drafter else (ATTN,)
        self.config = vllm_config(model, extra, block_size=block_size, num_blocks=num_blocks,
                                  step_tokens=step_tokens, kv_events=kv_events,
                                  speculative=speculative)
        self.kv_config = kv_cache_config(block_size, num_blocks, aliased=aliased,
                                         drafter=drafter)
        self.scheduler = Scheduler(
            vllm_config=self.config, kv_cache_config=self.kv_config,
            structured_output_manager=StructuredOutputManager(self.config),
            block_size=block_size, log_stats=True)
        self.connector = self.scheduler.connector
        assert isinstance(self.connector, HiStateConnector)
        self.worker = HiStateConnector(self.config, KVConnectorRole.WORKER, self.kv_config)
        self.tensors = layer_tensors(self.kv_config, aliased, drafter)
        self.worker.register_kv_caches(self.tensors)
        init_none_hash(sha256)
        # With an EAGLE-type drafter vLLM 0.34 hashes the token(s) after each block too.
        lookahead = getattr(self.config, "num_hash_lookahead_tokens", 0)
        self._hasher = get_request_block_hasher(block_size, sha256,
                                                *([lookahead] if lookahead else []))
        self._n = 0
        self.tokens: dict[str, list[int]] = {}
        self.checked: dict[str, int] = {}  # request -> tokens its pages are written for
        self.outputs = []  # every ModelRunnerOutput's KVConnectorOutput
        self.resumed: dict[str, int] = {}  # request -> first token it computed (its hit)
        self.verified: dict[str, int] = {}  # request -> resume point whose pages it checked
        self.chunk_ends: dict[str, list[int]] = {}  # request -> where its prefill steps ended
        self.stats: list[dict] = []  # the scheduler's connector-stats payloads, in order
        self.events: list = []  # KV cache events the scheduler published, in order
        if kv_events:
            self.scheduler.kv_event_publisher.publish = (
                lambda batch: self.events.extend(batch.events))

    # --- requests ---

    def add(self, tokens: list[int], max_tokens: int = 2) -> str:
        req_id = f"r{self._n}"
        self._n += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        self.scheduler.add_request(Request(
            request_id=req_id, prompt_token_ids=list(tokens), sampling_params=params,
            pooling_params=None, block_hasher=self._hasher))
        self.tokens[req_id] = list(tokens)
        return req_id

    def run(self, tokens: list[int], max_tokens: int = 2, max_steps: int = 200) -> str:
        """Serve one request to its end (and the steps its stores need)."""
        req_id = self.add(tokens, max_tokens)
        for _ in range(max_steps):
            self.step()
            if req_id not in self.scheduler.requests:
                break
        else:
            raise AssertionError(f"{req_id} did not finish in {max_steps} steps")
        self.settle()
        return req_id

    def settle(self, max_steps: int = 200) -> None:
        """Step until no transfer or SSD write is in flight."""
        for _ in range(max_steps):
            if not self.scheduler.has_requests() and not self._busy():
                return
            self.step()
        raise AssertionError("transfers did not settle")

    def _busy(self) -> bool:
        """A transfer job in flight, or SSD work vLLM keeps stepping the engine for."""
        return (bool(self.connector.connector_scheduler._jobs)
                or self.connector.has_pending_push_work()
                or not self.worker.connector_worker.worker.ssd_settled())

    # --- one engine step ---

    def step(self) -> ModelRunnerOutput:
        out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        self.worker.handle_preemptions(meta)
        self.worker.bind_connector_metadata(meta)
        if getattr(out, "has_sync_kv_loads", False):
            self.worker.start_load_kv(None)
        self._forward(out)
        if not getattr(out, "has_sync_kv_loads", False):
            self.worker.start_load_kv(None)
        self.worker.wait_for_save()
        conn = self._connector_output(out)
        self.worker.clear_connector_metadata()
        req_ids = [r for r in out.num_scheduled_tokens
                   if self._prefill_done(r, out.num_scheduled_tokens[r])]
        ids = list(out.num_scheduled_tokens)
        fields = dict(req_ids=ids, kv_connector_output=conn,
                      sampled_token_ids=[[self._next_token(r)] if r in req_ids else []
                                         for r in ids])
        if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:  # vLLM 0.32
            fields["req_id_to_index"] = {r: i for i, r in enumerate(ids)}
        mro = ModelRunnerOutput(**fields)
        self.outputs.append(conn)
        for eco in self.scheduler.update_from_output(out, mro).values():
            stats = getattr(eco, "scheduler_stats", None)
            if stats is not None and stats.kv_connector_stats:
                self.stats.append(stats.kv_connector_stats)
        return mro

    def _connector_output(self, out) -> KVConnectorOutput:
        w = self.worker
        res = w.get_transfer_results(out.finished_req_ids)
        return KVConnectorOutput(
            finished_sending=res.finished_sending or None,
            finished_recving=res.finished_recving or None,
            failed_recving=set(res.failed_recving or ()),
            kv_connector_stats=w.get_kv_connector_stats(),
            kv_cache_events=w.get_kv_connector_kv_cache_events(),
            kv_connector_worker_meta=w.build_connector_worker_meta(),
        )

    def _req(self, req_id: str):
        return self.scheduler.requests[req_id]

    def _prefill_done(self, req_id: str, n: int) -> bool:
        r = self._req(req_id)
        return r.num_computed_tokens >= r.num_tokens

    def _next_token(self, req_id: str) -> int:
        toks = self._req(req_id).all_token_ids
        return (sum(toks[-8:]) * 31 + len(toks)) % (EOS - 1)

    def _forward(self, out) -> None:
        bs = self.bs
        for req_id, n in out.num_scheduled_tokens.items():
            r = self._req(req_id)
            # vLLM advances num_computed_tokens when it schedules the step.
            start, end = r.num_computed_tokens - n, r.num_computed_tokens
            toks = list(r.all_token_ids)[:end]
            attn_ids, state_ids, *draft_ids = (list(b) for b in self._block_ids(req_id))
            ids = {ATTN: attn_ids, DRAFT: draft_ids[0] if draft_ids else None}
            self.resumed.setdefault(req_id, start)
            if start and self.checked.get(req_id) != start:
                self._check(req_id, toks, start, ids, state_ids)
                self.verified[req_id] = start
            if end <= r.num_prompt_tokens:
                self.chunk_ends.setdefault(req_id, []).append(end)
            for j in range(start // bs, -(-end // bs)):
                for layer in self.attn_layers:
                    self._write(layer, ids[layer][j], toks[: min(end, (j + 1) * bs)])
            run = state_ids[(end - 1) // bs]
            for name in STATES:
                self._write(name, run, toks[:end])
            self.checked[req_id] = end

    def _check(self, req_id: str, toks, start: int, ids, state_ids) -> None:
        bs = self.bs
        for j in range(start // bs):
            for layer in self.attn_layers:
                self._expect(layer, ids[layer][j], toks[: (j + 1) * bs],
                             f"{req_id} KV block {j}")
        if start % bs == 0:  # a resume point: the running state is the one there
            block = state_ids[start // bs - 1]
            for name in STATES:
                self._expect(name, block, toks[:start], f"{req_id} state at {start}")

    def _expect(self, layer: str, block: int, toks, what: str) -> None:
        got = self.tensors[layer][block].numpy()
        want = page(toks, layer, got.size)
        if layer not in self.attn_layers:  # a state page's padding vLLM never writes
            content = self.kv_config.kv_cache_groups[1].kv_cache_spec.state_content_size_bytes
            got, want = got[:content], want[:content]
        if not np.array_equal(got, want):
            raise AssertionError(f"{what}: page of {layer} in block {block} is not the "
                                 f"one its {len(toks)} tokens produce")

    def _write(self, layer: str, block: int, toks) -> None:
        t = self.tensors[layer][block]
        t.copy_(torch.from_numpy(page(toks, layer, t.numel())))

    def _block_ids(self, req_id: str):
        return self.scheduler.kv_cache_manager.get_block_ids(req_id)

    # --- what the scheduler side knows ---

    @property
    def hiworker(self):
        return self.worker.connector_worker.worker

    def metrics_text(self) -> str:
        """/metrics as vLLM's Prometheus logger would show it after every payload so far
        (HiState's metric class, fed each payload through `observe`)."""
        import prometheus_client
        from prometheus_client import Counter, Gauge, Histogram

        registry = prometheus_client.CollectorRegistry()

        def bind(cls):
            return lambda *a, **kw: cls(*a, registry=registry, **kw)

        prom = HiStateConnector.build_prom_metrics(
            self.config, {Counter: bind(Counter), Gauge: bind(Gauge), Histogram: bind(Histogram)},
            ["model_name"], {0: ["tiny"]})
        for payload in self.stats:
            prom.observe(payload, 0)
        return prometheus_client.generate_latest(registry).decode()

    def close(self) -> None:
        """Shut down as an engine does: the worker drains its SSD writes, the scheduler
        side releases the store."""
        self.worker.shutdown()
        self.connector.shutdown()

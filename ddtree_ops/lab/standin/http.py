"""The stand-in's HTTP side: SGLang's endpoints and response shapes over a small asyncio HTTP/1.1
server, with uvicorn's log lines (bind errors come from asyncio itself, with uvicorn's exact text)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Optional

from . import lines, sglog, textgen, treesim
from .shadow import Job

NOT_FOUND = {"detail": "Not Found"}


@dataclass
class Stats:
    num_requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    spec_verify_ct: int = 0
    spec_accept_tokens: int = 0
    last_accept_length: float = 0.0
    last_gen_throughput: float = 0.0
    e2e: list[float] = field(default_factory=list)


@dataclass
class State:
    """What the endpoints read. `phase` moves starting -> ready, or to hung (a scheduler that never
    answers: /health stays 503 and generation requests wait)."""

    model_path: str
    served_model_name: str
    context_len: int
    max_total_num_tokens: int
    speculative: bool
    accept_mean: float
    accept_spread: float
    draft_window: int
    step_s: float
    server_info: dict[str, Any]
    model_info: dict[str, Any]
    enable_metrics: bool
    cuda_graph: bool
    decode_log_interval: int = 40
    shadow: Any = None  # the ddtree plugin's worker (shadow.ShadowRun) when DDTREE is served by it
    phase: str = "starting"
    stats: Stats = field(default_factory=Stats)
    log_batches: bool = True
    inflight: dict[str, float] = field(default_factory=dict)  # rid -> start (the drain waits for these)
    shutting_down: bool = False

    def ready(self) -> bool:
        return self.phase == "ready"


def _json(status: int, doc: Any) -> tuple[int, bytes, str]:
    return status, json.dumps(doc).encode(), "application/json"


class Handler:
    def __init__(self, state: State) -> None:
        self.state = state

    # ------------------------------------------------------------------ generation
    def _generate_one(self, prompt: str, params: dict[str, Any]) -> tuple[dict[str, Any], float, list[int]]:
        """One prompt: its output, its latency and the tokens each forward step committed."""
        s = self.state
        max_new = int(params.get("max_new_tokens", 128) or 128)
        toks, finish = textgen.continuation(prompt, max_new)
        completion = len(toks)
        prompt_tokens = textgen.count_tokens(prompt)
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex, "finish_reason": ({"type": "length", "length": max_new} if finish == "length"
                                                      else {"type": "stop", "matched": textgen.EOS_TOKEN_ID}),
            "prompt_tokens": prompt_tokens, "weight_version": "default", "total_retractions": 0,
            "completion_tokens": completion, "cached_tokens": 0}
        steps = [1] * completion
        if s.speculative:
            st = textgen.spec_stats(prompt, completion, mean=s.accept_mean, spread=s.accept_spread, cap=s.draft_window)
            steps = textgen.round_commits(prompt, completion, st.verify_ct)
            meta.update({"spec_verify_ct": st.verify_ct, "spec_accept_length": round(st.accept_length, 4),
                         "spec_accept_rate": round(st.accept_rate, 4), "spec_num_correct_drafts": st.num_correct_drafts,
                         "spec_num_proposed_drafts": st.num_proposed_drafts,
                         "spec_accepted_drafts": st.num_correct_drafts, "spec_proposed_drafts": st.num_proposed_drafts})
            s.stats.spec_verify_ct += st.verify_ct
            s.stats.spec_accept_tokens += completion
            s.stats.last_accept_length = st.accept_length
        latency = 0.004 + prompt_tokens * 0.0002 + len(steps) * s.step_s
        meta["e2e_latency"] = round(latency, 4)
        s.stats.num_requests += 1
        s.stats.prompt_tokens += prompt_tokens
        s.stats.generation_tokens += completion
        s.stats.last_gen_throughput = completion / latency if latency else 0.0
        s.stats.e2e.append(latency)
        out = {"text": "".join(toks), "output_ids": [1000 + (hash(t) % 150000) for t in toks], "meta_info": meta}
        return out, latency, steps

    def _plugin_rounds(self, outs: list[dict[str, Any]], steps: list[list[int]], params: dict[str, Any],
                       slowest: float) -> tuple[list[list[int]], float]:
        """The request's prompts as one batch through the ddtree plugin's worker (`shadow.ShadowRun`):
        in shadow mode the chain's rounds are the ones above (the plugin accounts the tree beside them);
        in tree mode the served tree's rounds replace them, and with them the request's acceptance
        figures. The latency is the simulated verify forwards' time where the card's cost is known."""
        s = self.state
        temperature = params.get("temperature")
        greedy = params.get("top_k") == 1 or (temperature is not None and float(temperature) <= 1e-6)
        jobs = [Job(o["meta_info"]["prompt_tokens"], o["meta_info"]["completion_tokens"], st or [1], greedy)
                for o, st in zip(outs, steps)]
        served, seconds = s.shadow.serve(jobs)
        if s.shadow.tree:
            for o, chain, tree in zip(outs, steps, served):
                meta, completion = o["meta_info"], o["meta_info"]["completion_tokens"]
                verify_ct = max(1, len(tree))
                correct = completion - verify_ct
                s.stats.spec_verify_ct += verify_ct - len(chain)
                meta.update({"spec_verify_ct": verify_ct, "spec_accept_length": round(completion / verify_ct, 4),
                             "spec_num_correct_drafts": correct, "spec_accepted_drafts": correct,
                             "spec_accept_rate": round(correct / max(meta["spec_num_proposed_drafts"], 1), 4)})
                s.stats.last_accept_length = completion / verify_ct
        if seconds:
            prompt_s = max(o["meta_info"]["prompt_tokens"] for o in outs) * 0.0002
            slowest = 0.004 + prompt_s + seconds
            for o in outs:
                o["meta_info"]["e2e_latency"] = round(slowest, 4)
        return served, slowest

    def _log_batches(self, outs: list[dict[str, Any]], steps: list[list[int]]) -> None:
        """The scheduler's batch lines: one prefill for the batch, then a decode line every
        --decode-log-interval forward steps (SGLang's format)."""
        s = self.state
        n = len(outs)
        new = sum(o["meta_info"]["prompt_tokens"] for o in outs)
        sglog.info(f"Prefill batch, #new-seq: {n}, #new-token: {new}, #cached-token: 0, token usage: 0.00, "
                   f"#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: {s.cuda_graph}, "
                   f"input throughput (token/s): {new / 0.02:.2f}")
        done = [0] * n
        interval = max(1, s.decode_log_interval)
        for step in range(max((len(x) for x in steps), default=0)):
            for i, x in enumerate(steps):
                done[i] += x[step] if step < len(x) else 0
            if (step + 1) % interval:
                continue
            msg = (f"Decode batch, #running-req: {n}, #token: {new + sum(done)}, "
                   f"token usage: {(new + sum(done)) / max(s.max_total_num_tokens, 1):.2f}, ")
            if s.speculative:
                metas = [o["meta_info"] for o in outs]
                acc = sum(m["spec_accept_length"] for m in metas) / n
                rate = sum(m["spec_accept_rate"] for m in metas) / n
                msg += f"accept len: {acc:.2f}, accept rate: {rate:.2f}, "
            msg += (f"cuda graph: {s.cuda_graph}, gen throughput (token/s): {s.stats.last_gen_throughput * n:.2f}, "
                    "#queue-req: 0")
            sglog.info(msg)

    async def generate(self, body: dict[str, Any]) -> tuple[int, Any, Optional[list[dict[str, Any]]]]:
        text = body.get("text")
        if text is None and body.get("input_ids") is not None:
            ids = body["input_ids"]
            text = " ".join(str(i) for i in ids) if ids and not isinstance(ids[0], list) else [" ".join(map(str, i)) for i in ids]
        if text is None:
            return 400, {"error": {"message": "Either text or input_ids should be provided."}}, None
        params = body.get("sampling_params") or {}
        prompts = text if isinstance(text, list) else [text]
        outs, steps, slowest = [], [], 0.0
        for p in prompts:
            out, latency, st = self._generate_one(str(p), params)
            outs.append(out)
            steps.append(st)
            slowest = max(slowest, latency)
        wait = slowest
        if self.state.shadow is not None and self.state.speculative:
            steps, slowest = self._plugin_rounds(outs, steps, params, slowest)
            wait = slowest * treesim.PACE    # the plugin's simulated rounds, compressed (treesim.PACE)
        rids = [o["meta_info"]["id"] for o in outs]
        for rid in rids:
            self.state.inflight[rid] = time.monotonic()
        try:
            if self.state.log_batches:
                self._log_batches(outs, steps)
            await asyncio.sleep(wait)
        finally:
            for rid in rids:
                self.state.inflight.pop(rid, None)
        return 200, (outs if isinstance(text, list) else outs[0]), outs

    # ------------------------------------------------------------------ routes
    async def route(self, method: str, path: str, body: bytes) -> tuple[int, bytes, str, list[bytes] | None]:
        s = self.state
        path = path.split("?", 1)[0]
        doc: Any
        if path in ("/health", "/health_generate"):
            if s.shutting_down:
                sglog.info(lines.HEALTH_DURING_SHUTDOWN)
                return 503, b"", "text/plain", None
            if not s.ready():  # SGLang answers 503 while ServerStatus is Starting
                return 503, b"", "text/plain", None
            # a one-token generation (input_ids [0]); SGLang answers once it has seen the scheduler
            # respond, checking every second
            sglog.info("Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: 0.00, "
                       "#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
                       "input throughput (token/s): 2.12")
            await asyncio.sleep(1.0)
            return 200, b"", "text/plain", None
        if s.phase == "hung" and path in ("/generate", "/v1/chat/completions", "/v1/completions"):
            await asyncio.sleep(3600)  # the scheduler never answers: the request just waits
        if path == "/generate" and method == "POST":
            req = _parse(body)
            if req is None:
                return (*_json(400, {"error": {"message": "invalid JSON body"}}), None)
            status, doc, _ = await self.generate(req)
            if req.get("stream"):
                return status, b"", "text/event-stream", _sse(doc if isinstance(doc, dict) else doc[0])
            return (*_json(status, doc), None)
        if path in ("/v1/chat/completions", "/v1/completions") and method == "POST":
            req = _parse(body) or {}
            return (*_json(*await self.openai(path, req)), None)
        if path == "/v1/models":
            return (*_json(200, {"object": "list", "data": [{
                "id": s.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": s.model_path, "parent": None, "max_model_len": s.context_len}]}), None)
        if path in ("/server_info", "/get_server_info"):
            if path == "/get_server_info":
                sglog.warning("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                              "Please use '/server_info' instead.")
            return (*_json(200, self.server_info()), None)
        if path in ("/model_info", "/get_model_info"):
            if path == "/get_model_info":
                sglog.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                              "Please use '/model_info' instead.")
            return (*_json(200, s.model_info), None)
        if path == "/metrics" and s.enable_metrics:
            return 200, self.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8", None
        if path == "/flush_cache":
            return (200, b"Cache flushed.\nPlease check backend logs for more details. (When there are running or "
                    b"waiting requests, the operation will not be performed.)\n", "text/plain", None)
        return (*_json(404, NOT_FOUND), None)

    async def openai(self, path: str, req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        s = self.state
        if path.endswith("chat/completions"):
            msgs = req.get("messages") or []
            prompt = next((m.get("content", "") for m in reversed(msgs) if m.get("role") == "user"), "")
            prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
        else:
            prompt = str(req.get("prompt", ""))
        params = {"max_new_tokens": req.get("max_tokens") or req.get("max_completion_tokens") or 128}
        status, out, _ = await self.generate({"text": prompt, "sampling_params": params})
        meta = out["meta_info"]
        finish = meta["finish_reason"]["type"]
        usage = {"prompt_tokens": meta["prompt_tokens"], "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
                 "completion_tokens": meta["completion_tokens"], "prompt_tokens_details": None}
        base = {"id": meta["id"], "created": int(time.time()), "model": s.served_model_name, "usage": usage}
        if path.endswith("chat/completions"):
            choice = {"index": 0, "message": {"role": "assistant", "content": out["text"], "reasoning_content": None,
                                              "tool_calls": None}, "logprobs": None, "finish_reason": finish,
                      "matched_stop": meta["finish_reason"].get("matched")}
            return 200, {**base, "object": "chat.completion", "choices": [choice]}
        choice = {"index": 0, "text": out["text"], "logprobs": None, "finish_reason": finish,
                  "matched_stop": meta["finish_reason"].get("matched")}
        return 200, {**base, "object": "text_completion", "choices": [choice]}

    def server_info(self) -> dict[str, Any]:
        s = self.state
        st = s.stats
        avg = st.spec_accept_tokens / st.spec_verify_ct if st.spec_verify_ct else (s.accept_mean if s.speculative else None)
        internal = {"last_gen_throughput": round(st.last_gen_throughput, 2), "#running-req": 0, "#queue-req": 0,
                    "memory_usage": {"kvcache": round(s.server_info.get("_kv_gb", 0.0), 2), "weight": round(s.server_info.get("_weight_gb", 0.0), 2)}}
        if s.speculative:
            internal["avg_spec_accept_length"] = round(avg or 0.0, 4)
        doc = {k: v for k, v in s.server_info.items() if not k.startswith("_")}
        doc["internal_states"] = [internal]
        return doc

    def metrics(self) -> str:
        s, st = self.state, self.state.stats
        labels = f'{{engine_type="unified",model_name="{s.served_model_name}",pp_rank="0",tp_rank="0"}}'
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float) -> None:
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{labels} {value}"])

        metric("sglang:num_running_reqs", "gauge", "The number of running requests.", 0.0)
        metric("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", 0.0)
        metric("sglang:num_used_tokens", "gauge", "The number of used tokens.", 0.0)
        metric("sglang:token_usage", "gauge", "The token usage.", 0.0)
        metric("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.",
               float(s.max_total_num_tokens))
        metric("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", round(st.last_gen_throughput, 2))
        metric("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", 0.0)
        if s.speculative:
            avg = st.spec_accept_tokens / st.spec_verify_ct if st.spec_verify_ct else 0.0
            metric("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
                   round(avg, 4))
            metric("sglang:spec_accept_rate", "gauge", "The average acceptance rate of speculative decoding "
                   "(`accepted tokens / total draft tokens` in batch).",
                   round(max(avg - 1, 0) / max(s.draft_window - 1, 1), 4))
        metric("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", float(st.prompt_tokens))
        metric("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
               float(st.generation_tokens))
        metric("sglang:num_requests_total", "counter", "Number of requests processed.", float(st.num_requests))
        buckets = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
        out += ["# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds",
                "# TYPE sglang:e2e_request_latency_seconds histogram"]
        for b in buckets:
            out.append(f'sglang:e2e_request_latency_seconds_bucket{labels[:-1]},le="{b}"}} {sum(1 for e in st.e2e if e <= b)}')
        out.append(f'sglang:e2e_request_latency_seconds_bucket{labels[:-1]},le="+Inf"}} {len(st.e2e)}')
        out.append(f"sglang:e2e_request_latency_seconds_count{labels} {len(st.e2e)}")
        out.append(f"sglang:e2e_request_latency_seconds_sum{labels} {round(sum(st.e2e), 6)}")
        text = "\n".join(out) + "\n"
        if s.shadow is not None:  # the ddtree plugin's gauges, as it exports them
            text += s.shadow.metrics_text()
        return text


def _parse(body: bytes) -> Optional[dict[str, Any]]:
    try:
        doc = json.loads(body.decode("utf-8") or "{}")
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _sse(out: dict[str, Any]) -> list[bytes]:
    return [b"data: " + json.dumps(out).encode() + b"\n\n", b"data: [DONE]\n\n"]


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> None:
    peer = writer.get_extra_info("peername") or ("127.0.0.1", 0)
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = (lines[0].split(" ") + ["", "", ""])[:3]
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        length = int(headers.get("content-length", "0") or 0)
        body = await reader.readexactly(length) if length else b""
        status, payload, ctype, chunks = await handler.route(method, target, body)
        sglog.uvicorn(logging.INFO, f'{peer[0]}:{peer[1]} - "{method} {target} {version}" {status} '
                                    f"{HTTPStatus(status).phrase}")
        if chunks is not None:
            payload = b"".join(chunks)
        writer.write((f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: {ctype}\r\n"
                      f"content-length: {len(payload)}\r\nconnection: close\r\nserver: uvicorn\r\n\r\n").encode() + payload)
        await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, ValueError, asyncio.LimitOverrunError):
        pass
    finally:
        try:
            writer.close()
        except Exception:  # noqa: BLE001
            pass


async def serve(state: State, host: str, port: int) -> asyncio.AbstractServer:
    """Bind like uvicorn does (asyncio's create_server): a busy port raises OSError with the text
    `[Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use`."""
    handler = Handler(state)
    return await asyncio.get_running_loop().create_server(lambda: _protocol(handler), host, port, backlog=2048)


def _protocol(handler: Handler) -> asyncio.StreamReaderProtocol:
    reader = asyncio.StreamReader(limit=1 << 24)

    def connected(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        asyncio.ensure_future(_handle(r, w, handler))

    return asyncio.StreamReaderProtocol(reader, connected)


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

from . import sglog, textgen

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
    phase: str = "starting"
    stats: Stats = field(default_factory=Stats)
    log_batches: bool = True

    def ready(self) -> bool:
        return self.phase == "ready"


def _json(status: int, doc: Any) -> tuple[int, bytes, str]:
    return status, json.dumps(doc).encode(), "application/json"


class Handler:
    def __init__(self, state: State) -> None:
        self.state = state

    # ------------------------------------------------------------------ generation
    def _generate_one(self, prompt: str, params: dict[str, Any]) -> tuple[dict[str, Any], float]:
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
        steps = completion
        if s.speculative:
            st = textgen.spec_stats(prompt, completion, mean=s.accept_mean, spread=s.accept_spread, cap=s.draft_window)
            steps = st.verify_ct
            meta.update({"spec_verify_ct": st.verify_ct, "spec_accept_length": round(st.accept_length, 4),
                         "spec_accept_rate": round(st.accept_rate, 4), "spec_num_correct_drafts": st.num_correct_drafts,
                         "spec_num_proposed_drafts": st.num_proposed_drafts,
                         "spec_accepted_drafts": st.num_correct_drafts, "spec_proposed_drafts": st.num_proposed_drafts})
            s.stats.spec_verify_ct += st.verify_ct
            s.stats.spec_accept_tokens += completion
            s.stats.last_accept_length = st.accept_length
        latency = 0.004 + prompt_tokens * 0.0002 + steps * s.step_s
        meta["e2e_latency"] = round(latency, 4)
        s.stats.num_requests += 1
        s.stats.prompt_tokens += prompt_tokens
        s.stats.generation_tokens += completion
        s.stats.last_gen_throughput = completion / latency if latency else 0.0
        s.stats.e2e.append(latency)
        if s.log_batches:
            self._log_batches(prompt_tokens, completion, meta)
        return {"text": "".join(toks), "output_ids": [1000 + (hash(t) % 150000) for t in toks], "meta_info": meta}, latency

    def _log_batches(self, prompt_tokens: int, completion: int, meta: dict[str, Any]) -> None:
        s = self.state
        usage = (prompt_tokens + completion) / max(s.max_total_num_tokens, 1)
        sglog.info(f"Prefill batch, #new-seq: 1, #new-token: {prompt_tokens}, #cached-token: 0, token usage: 0.00, "
                   f"#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
                   f"input throughput (token/s): {prompt_tokens / 0.02:.2f}")
        msg = f"Decode batch, #running-req: 1, #token: {prompt_tokens + completion}, token usage: {usage:.2f}, "
        if s.speculative:
            msg += (f"accept len: {meta['spec_accept_length']:.2f}, accept rate: {meta['spec_accept_rate']:.2f}, ")
        msg += f"cuda graph: {s.cuda_graph}, gen throughput (token/s): {s.stats.last_gen_throughput:.2f}, #queue-req: 0"
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
        outs, slowest = [], 0.0
        for p in prompts:
            out, latency = self._generate_one(str(p), params)
            outs.append(out)
            slowest = max(slowest, latency)
        await asyncio.sleep(slowest)
        return 200, (outs if isinstance(text, list) else outs[0]), outs

    # ------------------------------------------------------------------ routes
    async def route(self, method: str, path: str, body: bytes) -> tuple[int, bytes, str, list[bytes] | None]:
        s = self.state
        path = path.split("?", 1)[0]
        doc: Any
        if path in ("/health", "/health_generate"):
            if not s.ready():  # SGLang answers 503 while ServerStatus is Starting
                return 503, b"", "text/plain", None
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
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float) -> None:
            lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{labels} {value}"])

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
        lines += ["# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds",
                  "# TYPE sglang:e2e_request_latency_seconds histogram"]
        for b in buckets:
            lines.append(f'sglang:e2e_request_latency_seconds_bucket{labels[:-1]},le="{b}"}} {sum(1 for e in st.e2e if e <= b)}')
        lines.append(f'sglang:e2e_request_latency_seconds_bucket{labels[:-1]},le="+Inf"}} {len(st.e2e)}')
        lines.append(f"sglang:e2e_request_latency_seconds_count{labels} {len(st.e2e)}")
        lines.append(f"sglang:e2e_request_latency_seconds_sum{labels} {round(sum(st.e2e), 6)}")
        return "\n".join(lines) + "\n"


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


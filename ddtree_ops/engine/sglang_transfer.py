"""A sampled round's tensors on their way to the host: one staging buffer, one copy, one event.

The plugin once made five device-to-host copies and a new CUDA event per sampled round. Now the
round's parts (draft top-K tokens and scores, the verified block, the committed lengths, the
bonus, the prefix lengths) are packed into one int64 staging buffer on the device (one `cat`
kernel), copied to a pinned host buffer in one asynchronous copy, and an event is recorded
behind it. Host buffers and events come from pools and go back once the round is accounted, so
a steady stream of sampled rounds allocates nothing.

The staging buffer is reused by every round: each round's pack and copy are queued on the
stream that runs DFlash's forward, after the previous round's copy, so the stream orders them.
Nothing here waits for the GPU; `ready()` asks the event, `wait()` blocks (the accounting thread,
or the end of a test).
"""

from __future__ import annotations

import threading
from typing import Any


class Landing:
    """One round in flight: the host buffer it lands in, its event, the parts' sizes."""

    __slots__ = ("host", "event", "sizes", "total", "meta")

    def __init__(self, host: Any, event: Any, sizes: list[int], total: int, meta: Any) -> None:
        self.host, self.event, self.sizes, self.total, self.meta = host, event, sizes, total, meta

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def parts(self) -> list[list[int]]:
        """The parts as flat lists of ints, in the order they were sent (one `tolist`)."""
        flat = self.host[:self.total].tolist()
        out, at = [], 0
        for n in self.sizes:
            out.append(flat[at:at + n])
            at += n
        return out


class RoundTransfer:
    """Packs, copies and pools. Thread-safe where the accounting thread gives buffers back."""

    def __init__(self) -> None:
        self.staging: Any = None
        self._free_host: list[Any] = []
        self._free_events: list[Any] = []
        self._lock = threading.Lock()
        self.sent = 0
        self.host_allocs = 0
        self.event_allocs = 0

    def send(self, parts: list[Any], meta: Any = None) -> Landing:
        import torch

        flat = [p.reshape(-1).to(torch.int64) for p in parts]
        sizes = [int(f.numel()) for f in flat]
        total = sum(sizes)
        device = flat[0].device
        if self.staging is None or self.staging.device != device or self.staging.numel() < total:
            self.staging = torch.empty(max(total, 2 * (self.staging.numel() if self.staging is not None else 0)),
                                       dtype=torch.int64, device=device)
        torch.cat(flat, out=self.staging[:total])
        cuda = device.type == "cuda"
        host = self._take_host(total, cuda)
        host[:total].copy_(self.staging[:total], non_blocking=cuda)
        event = None
        if cuda:
            event = self._take_event()
            event.record()
        self.sent += 1
        return Landing(host, event, sizes, total, meta)

    def release(self, landing: Landing) -> None:
        """The round is accounted: its host buffer and event serve another."""
        with self._lock:
            self._free_host.append(landing.host)
            if landing.event is not None:
                self._free_events.append(landing.event)

    def _take_host(self, total: int, pinned: bool) -> Any:
        import torch

        with self._lock:
            for i, buf in enumerate(self._free_host):
                if buf.numel() >= total:
                    return self._free_host.pop(i)
        self.host_allocs += 1
        return torch.empty(max(total, 1024), dtype=torch.int64, pin_memory=pinned)

    def _take_event(self) -> Any:
        import torch

        with self._lock:
            if self._free_events:
                return self._free_events.pop()
        self.event_allocs += 1
        return torch.cuda.Event()

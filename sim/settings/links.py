"""Link presets between a prefill pool and a decode pool: what moves a request's KV
blocks and conv state from the replica that prefilled it to the one that decodes it
(``deployment/disaggregated.py``).

A transfer of ``b`` bytes takes ``latency_us * 1e-6 + b / bw_bytes_s`` seconds: the
bandwidth is the link's vendor figure per direction (``docs/presets.md`` names the
datasheets), the latency NCCL's cost model's figure for one bulk message over that kind
of link (``src/graph/tuning.cc``, ``hwLat``, ring, Simple protocol: 3.4 µs over NVLink,
9.6 µs over the network). Transfers do not share the link: each runs at its full
bandwidth (a lower bound on the time where many overlap).
"""

from __future__ import annotations

import math

import attrs

#: NCCL's ``hwLat`` for a bulk (Simple protocol) ring step over NVLink and the network.
NVLINK_MESSAGE_US = 3.4
NETWORK_MESSAGE_US = 9.6


@attrs.frozen
class KvLink:
    """A link from a prefill replica to a decode replica.

    Attributes:
        name: what ``disaggregation.link`` says.
        part: the link in words, for the summary.
        bw_bytes_s: bytes per second in one direction (``inf``: no transfer time).
        latency_us: one transfer's fixed time.
    """

    name: str
    part: str
    bw_bytes_s: float
    latency_us: float

    def transfer_s(self, num_bytes: float) -> float:
        """Seconds to move ``num_bytes`` over the link."""
        return self.latency_us * 1e-6 + num_bytes / self.bw_bytes_s


#: Every link preset, by name.
KV_LINKS: dict[str, KvLink] = {
    link.name: link
    for link in (
        # H100 SXM datasheet: NVLink 4 at 900 GB/s, both directions together
        KvLink("nvlink", "NVLink 4 (450 GB/s per direction)", 450e9, NVLINK_MESSAGE_US),
        # NVIDIA ConnectX-7 / Quantum-2: InfiniBand NDR, 400 Gb/s per port
        KvLink("infiniband-400", "InfiniBand NDR 400 Gb/s (50 GB/s)", 50e9, NETWORK_MESSAGE_US),
        # IEEE 802.3 100GBASE (e.g. ConnectX-6 Dx): 100 Gb/s per port
        KvLink("ethernet-100", "Ethernet 100 Gb/s (12.5 GB/s)", 12.5e9, NETWORK_MESSAGE_US),
        # the bound where moving the state costs nothing: prefill and decode co-located
        KvLink("instant", "no transfer time (the co-located bound)", math.inf, 0.0),
    )
}
#: The names ``disaggregation.link`` takes.
KV_LINK_NAMES = tuple(KV_LINKS)

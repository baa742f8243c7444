"""Where the ranks of a Ray-dispatched torch.distributed group meet: rank 0's address and a free port."""

from __future__ import annotations

import socket

import ray


def rendezvous_address() -> tuple[str, int]:
    """This node's address as Ray sees it and a port free on it now, for the group's TCP store."""
    address = ray.util.get_node_ip_address()
    with socket.socket() as sock:
        sock.bind((address, 0))
        return address, sock.getsockname()[1]

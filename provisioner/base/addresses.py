"""Network addresses as the spec and the hosts write them."""

from __future__ import annotations

import ipaddress


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: an address only this machine reaches."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"

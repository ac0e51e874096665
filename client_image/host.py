"""What this host offers the client: its torch devices and network interfaces.

Checked when `psyche-client train` starts, so that an option naming something the host
does not have is a usage error (exit 2) before the client joins a run, not a failure
at warm-up that makes it rejoin every epoch.
"""

from __future__ import annotations

import typer


def resolve_device(text: str) -> str:
    """`auto` (CUDA when present, else CPU) or a torch device this host has; anything else
    is a usage error now, not a warm-up failure after joining the run."""
    import torch

    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise typer.BadParameter(f"{text!r} is not a torch device (auto, cpu, cuda, cuda:N)",
                                 param_hint="--device") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise typer.BadParameter(f"{text}: this host has no CUDA device",
                                     param_hint="--device")
        if device.index is not None and device.index >= count:
            raise typer.BadParameter(f"{text}: this host has {count} CUDA device(s)",
                                     param_hint="--device")
    elif device.type != "cpu":
        raise typer.BadParameter(f"{text}: this client trains on cpu or cuda devices",
                                 param_hint="--device")
    return text


def bind_address(text: str | None) -> tuple[str, str | None]:
    """(bind IP, interface pattern) for --bind-p2p-interface: an IP address, or the name
    pattern of an interface of this host that has an IPv4 address."""
    import ipaddress

    if not text:
        return "0.0.0.0", None
    try:
        return str(ipaddress.ip_address(text)), None
    except ValueError:
        pass
    from client_image.p2p.transport import interface_ipv4

    try:
        interface_ipv4(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--bind-p2p-interface") from None
    return "0.0.0.0", text

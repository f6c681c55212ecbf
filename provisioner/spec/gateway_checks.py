"""Pass 2 for `gateways:`: names, hosts, the served names each routes, replicas it can reach, and
one API key per route (the gateway passes the client's Authorization header through to any replica)."""

from __future__ import annotations

import difflib
import math
from pathlib import Path

from provisioner.base.addresses import is_loopback
from provisioner.base.secrets import read_api_key
from provisioner.spec.errors import Problem
from provisioner.spec.gateways import Replica, routes, served_names
from provisioner.spec.models import Gateway
from provisioner.spec.parts import SpecParts, present


def gateway_problems(parts: SpecParts, check_files: bool = True) -> list[Problem]:
    problems: list[Problem] = []
    gateways = list(present(parts.gateways))
    if not gateways:
        return problems
    seen: dict[str, int] = {}
    for index, gateway in gateways:
        where = f"gateways[{index}]"
        if gateway.name in seen:
            problems.append(Problem(f"{where}.name", f"duplicate gateway name '{gateway.name}' (also "
                                    f"gateways[{seen[gateway.name]}]) — give each gateway its own name"))
        seen.setdefault(gateway.name, index)
        problems += _host_problems(index, gateway, parts)
        problems += _model_problems(index, gateway, parts)
        if check_files and gateway.tls_certificate:
            problems += _certificate_problems(index, gateway.tls_certificate)
    problems += _reach_problems(gateways, parts)
    if check_files:
        problems += _key_problems(gateways, parts)
    return problems


def _host_problems(index: int, gateway: Gateway, parts: SpecParts) -> list[Problem]:
    known = parts.host_names
    if known is None or gateway.host in known:
        return []
    guess = difflib.get_close_matches(gateway.host, known, n=1)
    hint = f"did you mean '{guess[0]}'? " if guess else ""
    return [Problem(f"gateways[{index}].host",
                    f"unknown host '{gateway.host}' — {hint}hosts in this spec: {', '.join(known) or 'none'}")]


def _model_problems(index: int, gateway: Gateway, parts: SpecParts) -> list[Problem]:
    where = f"gateways[{index}]"
    served = served_names(parts.instances)
    if gateway.models is None:
        if not served:
            return [Problem(where, f"no instance serves a model for gateway '{gateway.name}' to route — add "
                                   "instances, or remove the gateway")]
        return [Problem(where, f"the served name {name!r} holds a quote, which an HAProxy route cannot match — "
                               "serve it under another name (served-model-name)") for name in served if "'" in name
                ] + _rate_problems(index, gateway, served)
    if not gateway.models:
        return [Problem(f"{where}.models", "is empty — list the served names to route, or leave models out to "
                                           "route every served name")]
    problems = _rate_problems(index, gateway, served)
    for model_index, name in enumerate(gateway.models):
        path = f"{where}.models[{model_index}]"
        if gateway.models.index(name) != model_index:
            problems.append(Problem(path, f"'{name}' is listed twice — list each served name once"))
        elif "'" in name:
            problems.append(Problem(path, f"the served name {name!r} holds a quote, which an HAProxy route cannot "
                                          "match — serve it under another name (served-model-name)"))
        elif name not in served:
            problems.append(Problem(path, f"no instance serves '{name}' (served names in this spec: "
                                          f"{', '.join(served) or 'none'}) — add an instance that serves it, "
                                          "or remove it from models"))
    return problems


def _rate_problems(index: int, gateway: Gateway, served: list[str]) -> list[Problem]:
    """Each stated rate is of a route the gateway has, a positive finite number of requests per second."""
    routed = served if gateway.models is None else gateway.models
    problems = []
    for name, rate in gateway.rates.items():
        path = f"gateways[{index}].rates.{name}"
        if name not in routed:
            problems.append(Problem(path, f"the gateway has no route '{name}' (its routes: {', '.join(routed) or 'none'})"
                                          " — state rates of the served names it routes"))
        elif not math.isfinite(rate) or rate <= 0:
            problems.append(Problem(path, f"{rate} is not a rate — give the requests per second the route must carry, "
                                          "above 0 (e.g. 120)"))
    return problems


def _certificate_problems(index: int, path: str) -> list[Problem]:
    where = f"gateways[{index}].tls_certificate"
    what = "the certificate and its private key (PEM, as HAProxy's `ssl crt` reads them)"
    if Path(path).is_dir():
        return [Problem(where, f"{path} is a folder, not a file — name the file that holds {what}")]
    if not Path(path).is_file():
        return [Problem(where, f"{path} does not exist — create it with {what} or correct the path")]
    if Path(path).stat().st_size == 0:
        return [Problem(where, f"{path} is empty — put {what} in it")]
    return []


def _reach_problems(gateways: list[tuple[int, Gateway]], parts: SpecParts) -> list[Problem]:
    """An instance on loopback is a replica only for a gateway on its own host."""
    problems = []
    reported: set[int] = set()
    for index, gateway in gateways:
        for name, replicas in routes(gateway, parts.instances).items():
            for replica in replicas:
                instance = replica.instance
                if replica.index in reported or instance.host == gateway.host or not is_loopback(instance.bind):
                    continue
                reported.add(replica.index)
                problems.append(Problem(
                    f"instances[{replica.index}].bind",
                    f"{instance.bind} is reachable from host {instance.host} only, but gateway '{gateway.name}' "
                    f"(gateways[{index}]) on host {gateway.host} routes '{name}' to this instance — bind 0.0.0.0 "
                    "or the host's address"))
    return problems


UNREADABLE = object()  # a key file the instance's own checks report (missing, not UTF-8)


def _key(replica: Replica) -> str | None | object:
    """The API key as the roles read it; None: no key; UNREADABLE."""
    path = replica.instance.api_key_file
    if path is None:
        return None
    try:
        return read_api_key(path)
    except (OSError, UnicodeDecodeError):
        return UNREADABLE


def _key_problems(gateways: list[tuple[int, Gateway]], parts: SpecParts) -> list[Problem]:
    problems = []
    reported: set[tuple[int, str]] = set()
    for index, gateway in gateways:
        for name, replicas in routes(gateway, parts.instances).items():
            if not replicas:
                continue
            first, first_key = replicas[0], _key(replicas[0])
            for replica in replicas[1:]:
                key = _key(replica)
                if key == first_key or (replica.index, name) in reported or UNREADABLE in (key, first_key):
                    continue
                reported.add((replica.index, name))
                other = f"instance '{first.instance.name}' (instances[{first.index}])"
                if key is None or first_key is None:
                    which = (f"{other} has an API key and this instance none" if key is None
                             else f"this instance has an API key and {other} none")
                else:
                    which = f"this file's content differs from the key of {other}"
                problems.append(Problem(
                    f"instances[{replica.index}].api_key_file",
                    f"the replicas of '{name}' behind gateway '{gateway.name}' (gateways[{index}]) must share one "
                    f"API key (the client's key goes to any of them), but {which} — give every replica of "
                    f"'{name}' the same api_key_file content"))
    return problems

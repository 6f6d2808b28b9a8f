#!/usr/bin/env python3
"""A fleet of delta xDS clients that meshd did not write: Python grpcio (gRPC C-core),
one channel and connection per proxy, each subscribing as Envoy does (wildcard CDS and
LDS, then EDS for the clusters and RDS for the routes it was sent), ACKing every response.
It connects PROXIES proxies across NAMESPACES namespaces (beyond the first WARM, in worker
processes of at most PER_PROCESS proxies each), waits until each has its configuration,
then samples meshd's RSS (from /proc/PID) until it stops falling, and prints a JSON line:
proxies, RSS before and after, and bytes per added proxy.

    python3 scripts/grpcio-fleet.py --xds 127.0.0.1:15010 --pid PID --proxies 500

Needs `pip install grpcio` (in a venv; scripts/server-compare.sh takes its python as
PYTHON). Messages are encoded and decoded here with the few protobuf fields xDS
subscription needs, so no generated code is required.
"""
import argparse
import json
import queue
import subprocess
import sys
import threading
import time

import grpc

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, payload):
    """A length-delimited field."""
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def fields(buf):
    """(number, wire type, value) of a message's fields; length-delimited as bytes."""
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(buf, i)
        elif wire == 2:
            n, i = read_varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def read_varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, i
        shift += 7


def node(proxy_id, namespace):
    # Node: id (1), cluster (2), metadata (3) as a Struct with NAMESPACE.
    value = field(3, namespace)  # Value.string_value
    entry = field(1, "NAMESPACE") + field(2, value)
    metadata = field(1, entry)  # Struct.fields map entry
    return field(1, proxy_id) + field(2, "sidecar") + field(3, metadata)


def request(type_url, subscribe=(), nonce="", first_node=None):
    # DeltaDiscoveryRequest: node (1), type_url (2), resource_names_subscribe (3),
    # response_nonce (6).
    out = b""
    if first_node:
        out += field(1, first_node)
    out += field(2, type_url)
    for name in subscribe:
        out += field(3, name)
    if nonce:
        out += field(6, nonce)
    return out


def response(buf):
    """type_url, nonce and the names and route names of a DeltaDiscoveryResponse."""
    type_url, nonce, names, routes = "", "", [], []
    for number, _, value in fields(buf):
        if number == 4:
            type_url = value.decode()
        elif number == 5:
            nonce = value.decode()
        elif number == 2:  # Resource
            for n, _, v in fields(value):
                if n == 3:
                    names.append(v.decode())
                elif n == 2 and type_url_of_any(v) == LDS:
                    routes.extend(route_names(v))
    return type_url, nonce, names, routes


def type_url_of_any(any_bytes):
    for n, _, v in fields(any_bytes):
        if n == 1:
            return v.decode()
    return ""


ROUTES = {}


def route_names(any_bytes):
    """RDS names a listener refers to, found once per distinct listener (every proxy of a
    namespace is sent the same bytes)."""
    key = bytes(any_bytes)
    if key not in ROUTES:
        ROUTES[key] = find_route_names(key)
    return ROUTES[key]


def find_route_names(any_bytes):
    """RDS names a listener refers to: every string field named like a route config
    (the HttpConnectionManager's rds.route_config_name sits deep in filter chains; any
    nested string that meshd uses as a route name is taken: a port number or host:port)."""
    found = []

    def walk(buf, depth):
        if depth > 12:
            return
        try:
            for n, wire, v in fields(buf):
                if wire != 2:
                    continue
                try:
                    s = v.decode()
                except UnicodeDecodeError:
                    s = None
                if s is not None and n == 2 and depth > 3 and s.isprintable() and is_route_name(s):
                    found.append(s)
                walk(v, depth + 1)
        except (ValueError, IndexError):
            return

    walk(any_bytes, 0)
    return found


def is_route_name(s):
    # Istio's route configuration names: a port ("9080") or "host:port".
    return s.isdigit() or (":" in s and s.rsplit(":", 1)[1].isdigit() and "/" not in s)


class Proxy:
    def __init__(self, address, index, namespaces):
        self.ns = f"ns-{index % namespaces}"
        self.id = f"sidecar~10.{index // 65536}.{index // 256 % 256}.{index % 256}~p-{index}.{self.ns}~{self.ns}.svc.cluster.local"
        # A channel of its own: C-core shares subchannels between channels with the
        # same target and arguments, so each proxy gets a distinct argument.
        self.channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1), ("meshd.proxy", index)])
        self.requests = queue.Queue()
        self.ready = threading.Event()
        self.seen = set()

    def run(self):
        call = self.channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)
        self.requests.put(request(CDS, first_node=node(self.id, self.ns)))
        self.requests.put(request(LDS))
        responses = call(iter(self.requests.get, None))
        eds_asked = rds_asked = False
        for raw in responses:
            type_url, nonce, names, routes = response(raw)
            self.requests.put(request(type_url, nonce=nonce))
            self.seen.add(type_url)
            if type_url == CDS and not eds_asked:
                eds_asked = True
                self.requests.put(request(EDS, [n for n in names if n.startswith("outbound|")]))
            if type_url == LDS and not rds_asked:
                rds_asked = True
                self.requests.put(request(RDS, sorted(set(routes))))
            if {CDS, LDS, EDS, RDS} <= self.seen:
                self.ready.set()


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def settled(pid, quiet=5.0, limit=120.0):
    """RSS once it has not fallen for `quiet` seconds."""
    low, since, start = rss(pid), time.time(), time.time()
    while time.time() - since < quiet and time.time() - start < limit:
        time.sleep(0.5)
        now = rss(pid)
        if now < low:
            low, since = now, time.time()
    return low


def connect(address, indices, namespaces, batch):
    """Proxies `indices`, in batches each given its own time, once each holds its
    configuration."""
    proxies = []
    indices = list(indices)
    for start in range(0, len(indices), batch):
        group = [Proxy(address, i, namespaces) for i in indices[start:start + batch]]
        for proxy in group:
            threading.Thread(target=proxy.run, daemon=True).start()
        deadline = time.time() + 300
        for proxy in group:
            if not proxy.ready.wait(max(0.0, deadline - time.time())):
                raise SystemExit(f"{proxy.id} got no full configuration: {sorted(proxy.seen)}")
        proxies.extend(group)
    return proxies


def child(args):
    """One worker process: its share of the fleet, held until stdin closes."""
    held = connect(args.xds, range(args.first, args.first + args.count), args.namespaces, args.batch)
    print("ready", flush=True)
    sys.stdin.read()
    del held


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--xds", default="127.0.0.1:15010")
    p.add_argument("--pid", type=int)
    p.add_argument("--proxies", type=int, default=500)
    p.add_argument("--namespaces", type=int, default=50)
    p.add_argument("--warm", type=int, default=50, help="proxies connected first (one per namespace)")
    p.add_argument("--batch", type=int, default=250, help="proxies a process connects at a time")
    p.add_argument("--per-process", type=int, default=500,
                   help="proxies per worker process: one process's channels and threads slow "
                        "down past a few hundred, so a large fleet is split")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if args.pid is None:
        p.error("--pid is required")

    warm = connect(args.xds, range(args.warm), args.namespaces, args.batch)
    before = settled(args.pid)
    workers = []
    for first in range(args.warm, args.proxies, args.per_process):
        count = min(args.per_process, args.proxies - first)
        workers.append(subprocess.Popen(
            [sys.executable, __file__, "--child", "--xds", args.xds, "--namespaces", str(args.namespaces),
             "--batch", str(args.batch), "--first", str(first), "--count", str(count)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for w in workers:
        if w.stdout.readline().strip() != "ready":
            raise SystemExit("a worker of the fleet failed")
    after = settled(args.pid)
    for w in workers:
        w.stdin.close()
        w.wait()
    added = args.proxies - args.warm
    print(json.dumps({
        "client": f"grpcio {grpc.__version__}",
        "proxies": args.proxies,
        "warm": args.warm,
        "processes": 1 + len(workers),
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "rss_per_added_proxy_bytes": round((after - before) / added) if added else None,
    }))
    del warm


if __name__ == "__main__":
    main()

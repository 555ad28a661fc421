#!/usr/bin/env python3
"""A toy inventory service: the backend of the example provider (components/example-inventory).

    python3 testdata/inventory/inventory.py [--listen 127.0.0.1:0] [--tls-cert PEM --tls-key PEM]
                                            [--token-file FILE] [--hang] [--seed NAME]

Prints `url: http(s)://127.0.0.1:PORT` once it listens. Standard library only, state in memory.
The host's broker injects a credential only over https: with --token-file, give --tls-cert and
--tls-key too (a certificate for 127.0.0.1, made for example by
`openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj /CN=inventory
-addext subjectAltName=IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE -keyout key.pem
-out cert.pem`; the grant's `tls.caFile` is then cert.pem).

API (JSON):
  GET    /health                 200 {"ok": true}
  GET    /vms?name=N             the VMs named N        GET /vms?label=K=V   the VMs with label K=V
  POST   /vms                    {"name", "labels", "userData"} -> 201 the VM; a taken name is 409
  GET    /vms/ID                 the VM (404 when there is none); it runs, with an address, from
                                 its second read on
  POST   /vms/ID/start           200 the VM: a stopped VM provisions again, then runs (a running
                                 one is left alone); 404 when there is none
  DELETE /vms/ID                 204 (404 when there is none)
  POST   /_egress-test/stop      the conformance suite's test-backend hook (docs/contract.md):
                                 body {"name": N}; every VM named N stops (as if its host stopped
                                 it): 200 {"hook": "stop", "stopped": [ID...]}, 404
                                 {"hook": "stop", "error": ...} when no VM has that name
A VM is {"id", "name", "state", "address", "labels"}. With --token-file, every request needs
`Authorization: Bearer <the file's content>` (401 otherwise): the host's broker adds it, the
provider never sees it. With --hang, /health never answers (for deadline tests). `--seed NAME`
adds a VM without the operator's mark (a foreign VM) at start.
"""

import argparse
import json
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Inventory:
    def __init__(self):
        self.lock = threading.Lock()
        self.vms = {}
        self.next_id = 1
        self.reads = {}

    def add(self, name, labels, user_data):
        vm = {"id": str(self.next_id), "name": name, "state": "provisioning", "address": None,
              "labels": labels, "userData": user_data}
        self.vms[vm["id"]] = vm
        self.next_id += 1
        return vm


def public(vm):
    return {key: vm[key] for key in ("id", "name", "state", "address", "labels")}


def make_handler(inventory, token, hang):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def answer(self, status, value=None):
            body = b"" if value is None else json.dumps(value).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def route(self, method):
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            if token is not None and self.headers.get("authorization") != f"Bearer {token}":
                return self.answer(401, {"error": "unauthorized"})
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            parts = [p for p in url.path.split("/") if p]
            if method == "GET" and parts == ["health"]:
                if hang:
                    time.sleep(3600)
                return self.answer(200, {"ok": True})
            with inventory.lock:
                if parts == ["vms"] and method == "GET":
                    found = list(inventory.vms.values())
                    if "name" in query:
                        found = [vm for vm in found if vm["name"] == query["name"]]
                    if "label" in query:
                        key, _, value = query["label"].partition("=")
                        found = [vm for vm in found if vm["labels"].get(key) == value]
                    return self.answer(200, [public(vm) for vm in found])
                if parts == ["vms"] and method == "POST":
                    try:
                        request = json.loads(body)
                        name, labels = request["name"], dict(request.get("labels") or {})
                    except (ValueError, KeyError, TypeError):
                        return self.answer(400, {"error": "expected {name, labels, userData}"})
                    if any(vm["name"] == name for vm in inventory.vms.values()):
                        return self.answer(409, {"error": f"a VM named {name} exists"})
                    vm = inventory.add(name, labels, request.get("userData", ""))
                    return self.answer(201, public(vm))
                if parts == ["_egress-test", "stop"] and method == "POST":
                    return self.stop_hook(body)
                if len(parts) == 3 and parts[0] == "vms" and parts[2] == "start" and method == "POST":
                    vm = inventory.vms.get(parts[1])
                    if vm is None:
                        return self.answer(404, {"error": "no such VM"})
                    if vm["state"] == "stopped":
                        vm["state"] = "provisioning"
                    return self.answer(200, public(vm))
                if len(parts) == 2 and parts[0] == "vms":
                    vm = inventory.vms.get(parts[1])
                    if vm is None:
                        return self.answer(404, {"error": "no such VM"})
                    if method == "GET":
                        reads = inventory.reads[vm["id"]] = inventory.reads.get(vm["id"], 0) + 1
                        if reads >= 2 and vm["state"] == "provisioning":
                            vm["state"], vm["address"] = "running", f"192.0.2.{int(vm['id']) % 250 + 1}"
                        return self.answer(200, public(vm))
                    if method == "DELETE":
                        del inventory.vms[vm["id"]]
                        return self.answer(204)
            return self.answer(404, {"error": "no such route"})

        def stop_hook(self, body):
            # Called with the inventory's lock held.
            try:
                name = json.loads(body)["name"]
            except (ValueError, KeyError, TypeError):
                return self.answer(400, {"hook": "stop", "error": "expected {\"name\": ...}"})
            named = [vm for vm in inventory.vms.values() if vm["name"] == name]
            if not named:
                return self.answer(404, {"hook": "stop", "error": f"no VM named {name}"})
            for vm in named:
                vm["state"], vm["address"] = "stopped", None
            return self.answer(200, {"hook": "stop", "stopped": [vm["id"] for vm in named]})

        def do_GET(self):
            self.route("GET")

        def do_POST(self):
            self.route("POST")

        def do_DELETE(self):
            self.route("DELETE")

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--token-file")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--seed", action="append", default=[])
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    token = open(args.token_file).read().strip() if args.token_file else None
    inventory = Inventory()
    for name in args.seed:
        inventory.add(name, {"owner": "someone-else"}, "")
    server = ThreadingHTTPServer((host, int(port)), make_handler(inventory, token, args.hang))
    server.daemon_threads = True
    scheme = "http"
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    print(f"url: {scheme}://{host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

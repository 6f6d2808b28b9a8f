#!/usr/bin/env python3
"""Stand-ins for the Bookinfo workloads of examples/bookinfo: one HTTP server per
workload on the port its EndpointSlice names, each answering any path with its name."""
import http.server
import threading

WORKLOADS = {
    "productpage-v1": 19081,
    "details-v1": 19082,
    "reviews-v1": 19083,
    "reviews-v2": 19084,
    "reviews-v3": 19085,
    "ratings-v1": 19086,
}


def handler(name):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"{name} {self.path}\n".encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


if __name__ == "__main__":
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", port), handler(name)) for name, port in WORKLOADS.items()]
    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("serving", ", ".join(f"{n} on :{p}" for n, p in WORKLOADS.items()), flush=True)
    servers[0].serve_forever()

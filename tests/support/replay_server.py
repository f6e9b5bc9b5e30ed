#!/usr/bin/env python3
"""A local HTTP server that replays recorded exchanges, for the LLM client's tests (no network).

    replay_server.py EXCHANGES.json [--log LOG.jsonl]

Binds 127.0.0.1 on a free port and prints the port on stdout (one line). Serves the recorded
exchanges in order, one per request, then answers 410. Exits when its stdin closes (the test
that started it ended) or on SIGTERM. Python standard library only.

EXCHANGES.json is a list; each entry:
    {"note": "...",                                  # free text
     "expect": {"method": "POST",                    # optional checks of the request
                "path": "/v1/chat/completions",
                "headers": {"Authorization": "Bearer k", "X-Absent": null},  # null: absent
                "json": {"model": "m"},              # top-level keys equal in the JSON body
                "body_contains": ["text", ...]},     # substrings of the raw body
     "response": {"status": 200,
                  "headers": {"Retry-After": "1"},
                  "body": {...} | "raw text",        # objects and lists are sent as JSON
                  "delay_seconds": 0,                # wait before answering (client timeouts)
                  "close": false}}                   # true: drop the connection, no answer
A request that fails a check is answered 400 with an OpenAI-style error naming the check, so
the client reports it (4xx other than 429 is not retried). Every request is appended to the
log as one JSON line: index, method, path, headers, body, mismatch.
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Replay:
    def __init__(self, exchanges, log_path):
        self.exchanges = exchanges
        self.next = 0
        self.lock = threading.Lock()
        self.log_path = log_path

    def take(self):
        with self.lock:
            index = self.next
            self.next += 1
        return index, (self.exchanges[index] if index < len(self.exchanges) else None)

    def log(self, record):
        if not self.log_path:
            return
        with self.lock, open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def mismatch(expect, method, path, headers, body):
    """The first failed check, or None."""
    if "method" in expect and expect["method"] != method:
        return f"method {method}, expected {expect['method']}"
    if "path" in expect and expect["path"] != path:
        return f"path {path}, expected {expect['path']}"
    lowered = {k.lower(): v for k, v in headers.items()}
    for name, value in expect.get("headers", {}).items():
        got = lowered.get(name.lower())
        if value is None and got is not None:
            return f"header {name} present, expected it absent"
        if value is not None and got != value:
            return f"header {name} is {got!r}, expected {value!r}"
    if "json" in expect:
        try:
            data = json.loads(body)
        except ValueError as e:
            return f"the body is not JSON: {e}"
        for key, value in expect["json"].items():
            if data.get(key) != value:
                return f"body.{key} is {data.get(key)!r}, expected {value!r}"
    for text in expect.get("body_contains", []):
        if text not in body:
            return f"the body does not contain {text!r}"
    return None


def make_handler(replay):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the test's output is the client's
            pass

        def do_POST(self):
            self.serve()

        def do_GET(self):
            self.serve()

        def serve(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
            path = self.path
            headers = {k: v for k, v in self.headers.items()}
            index, exchange = replay.take()
            record = {"index": index, "method": self.command, "path": path,
                      "headers": headers, "body": body, "mismatch": None}
            if exchange is None:
                record["mismatch"] = "no recorded exchange left"
                replay.log(record)
                self.answer(410, {}, {"error": {"message": (
                    f"replay: request {index} but only {len(replay.exchanges)} exchanges are "
                    "recorded")}})
                return
            problem = mismatch(exchange.get("expect", {}), self.command, path, headers, body)
            record["mismatch"] = problem
            replay.log(record)
            if problem:
                self.answer(400, {}, {"error": {"message": f"replay: request {index}: {problem}"}})
                return
            response = exchange.get("response", {})
            delay = float(response.get("delay_seconds", 0))
            if delay:
                time.sleep(delay)
            if response.get("close"):
                self.close_connection = True
                return
            self.answer(int(response.get("status", 200)), response.get("headers", {}),
                        response.get("body", ""))

        def answer(self, status, headers, body):
            data = body if isinstance(body, str) else json.dumps(body)
            raw = data.encode("utf-8")
            try:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, str(v))
                if not any(k.lower() == "content-type" for k in headers):
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): expected in the timeout tests

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exchanges")
    parser.add_argument("--log", default="")
    args = parser.parse_args()
    with open(args.exchanges, encoding="utf-8") as f:
        exchanges = json.load(f)
    if not isinstance(exchanges, list):
        sys.exit(f"{args.exchanges}: expected a JSON list of exchanges")
    replay = Replay(exchanges, args.log)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(replay))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)

    def watch_stdin():
        sys.stdin.read()
        server.shutdown()

    threading.Thread(target=watch_stdin, daemon=True).start()
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()

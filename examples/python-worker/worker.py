#!/usr/bin/env python3
"""A render worker for renderqueue in Python, standard library only.

It claims the most overdue rows from the shards of one RenderQueue, renders each (here: an HTTP
GET of the row's key, where a prerender fleet would drive a browser), and completes it on the
shard that leased it, or releases it when the render fails so that it is handed out again at
once. SIGTERM stops it gracefully: it claims no more, finishes what it holds and completes it.
The shard API is pkg/shardapi/openapi.yaml; this follows its rules: back off on an empty claim
and on 503 (after Retry-After), send every complete and release to the shard that leased the
row, and follow "movedTo" once when a lease moved with its slot during a rebalance.

Configuration, from the environment:
  RENDERQUEUE_SHARDS      comma-separated shard base URLs (http://10.244.0.7:8080)
  RENDERQUEUE_TOKEN_FILE  the Secret <name>-api-token mounted (key "token")
  RENDERQUEUE_CA_FILE     with spec.tls: the ConfigMap <name>-shard-ca mounted (key ca.crt); the
                          shards' certificate names no IP address, so list the shards by their
                          DNS names, which it covers: https://<name>-shard-0.<name>-shards.<ns>.svc:8080
  CONCURRENCY             rows rendered at once (default 4)
"""

import json
import os
import random
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request

BATCH = 10


class Shard:
    def __init__(self, url, token, ctx):
        self.url = url.rstrip("/")
        self.token = token
        self.ctx = ctx
        self.not_before = 0.0
        self.backoff = 0.1

    def post(self, path, body):
        """POST body as JSON; returns (status, reply, retry_after)."""
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer " + self.token},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ctx) as resp:
                return resp.status, json.load(resp), 0
        except urllib.error.HTTPError as e:
            retry = float(e.headers.get("Retry-After") or 0)
            try:
                reply = json.load(e)
            except ValueError:
                reply = {"error": e.reason}
            return e.code, reply, retry

    def rest(self, seconds=None):
        """Leave the shard alone for a while: an empty claim or a 503."""
        if seconds is None:
            seconds = self.backoff * (1 + random.random() / 2)
            self.backoff = min(self.backoff * 2, 5.0)
        self.not_before = time.monotonic() + seconds


class Worker:
    def __init__(self, shards, concurrency, render):
        self.shards = shards
        self.concurrency = concurrency
        self.render = render
        self.stopping = threading.Event()
        self.slots = threading.Semaphore(concurrency)
        self.threads = []

    def claim(self, n):
        """Claim up to n rows from a shard that is not resting; returns (shard, items)."""
        ready = [s for s in self.shards if s.not_before <= time.monotonic()]
        random.shuffle(ready)
        for shard in ready:
            status, reply, retry = shard.post("/v1/claim", {"n": n})
            if status == 200 and reply["items"]:
                shard.backoff = 0.1
                return shard, reply["items"]
            if status == 200 or status == 503:
                shard.rest(retry or None)
                continue
            raise RuntimeError("claim on %s: HTTP %d: %s" % (shard.url, status, reply.get("error")))
        return None, []

    def finish(self, shard, item, ok):
        """Complete (ok) or release the item on the shard that leased it, following movedTo once."""
        path = "/v1/complete" if ok else "/v1/release"
        body = {"items": [{"key": item["key"], "lease": item["lease"]}]}
        for attempt in range(5):
            status, reply, retry = shard.post(path, body)
            if status == 200:
                result = reply["results"][0]
                moved = result.get("movedTo")
                if "error" in result and moved and attempt == 0:
                    shard = Shard(moved, shard.token, shard.ctx)
                    continue
                if "error" in result:
                    print("%s %s: %s" % (path, item["key"], result["error"]), file=sys.stderr)
                return
            if status in (408, 503) or status >= 500:
                time.sleep(retry or 0.2 * (attempt + 1))
                continue
            print("%s %s: HTTP %d: %s" % (path, item["key"], status, reply.get("error")), file=sys.stderr)
            return

    def handle(self, shard, item):
        try:
            try:
                self.render(item["key"])
                ok = True
            except Exception as e:  # a failed render is released, to be tried again
                print("render %s: %s" % (item["key"], e), file=sys.stderr)
                ok = False
            self.finish(shard, item, ok)
        finally:
            self.slots.release()

    def run(self):
        while not self.stopping.is_set():
            self.slots.acquire()
            free = 1
            while free < min(self.concurrency, BATCH) and self.slots.acquire(blocking=False):
                free += 1
            shard, items = self.claim(free)
            for _ in range(free - len(items)):
                self.slots.release()
            if not items:
                rest = min((s.not_before for s in self.shards), default=0) - time.monotonic()
                self.stopping.wait(max(rest, 0.05))
                continue
            for item in items:
                t = threading.Thread(target=self.handle, args=(shard, item))
                t.start()
                self.threads.append(t)
            self.threads = [t for t in self.threads if t.is_alive()]
        for t in self.threads:
            t.join()


def render(key):
    """Stand-in for the real render: fetch the page; a 5xx fails the render."""
    with urllib.request.urlopen(key, timeout=30) as resp:
        resp.read()


def main():
    urls = [u for u in os.environ.get("RENDERQUEUE_SHARDS", "").split(",") if u]
    if not urls:
        sys.exit("set RENDERQUEUE_SHARDS: comma-separated shard base URLs")
    token_file = os.environ.get("RENDERQUEUE_TOKEN_FILE")
    if not token_file:
        sys.exit("set RENDERQUEUE_TOKEN_FILE: the Secret <name>-api-token, key token, mounted")
    with open(token_file) as f:
        token = f.read().strip()
    ctx = None
    if os.environ.get("RENDERQUEUE_CA_FILE"):
        ctx = ssl.create_default_context(cafile=os.environ["RENDERQUEUE_CA_FILE"])
    worker = Worker([Shard(u, token, ctx) for u in urls], int(os.environ.get("CONCURRENCY", "4")), render)
    signal.signal(signal.SIGTERM, lambda *_: worker.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: worker.stopping.set())
    print("worker started: %d shard(s)" % len(urls), file=sys.stderr, flush=True)
    worker.run()
    print("worker stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

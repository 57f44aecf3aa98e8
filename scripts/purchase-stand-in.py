#!/usr/bin/env python3
"""A stand-in for the purchase API behind vq's gate, for scripts/dev.sh: answers every
request on 127.0.0.1:PORT with 200 and a small JSON body, so a purchase that passes the gate
succeeds (and consumes its token) without a real backend. Not for production."""
import http.server
import sys


class StandIn(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                self.rfile.read(size + 2)
                if size == 0:
                    return
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)

    def answer(self):
        self.read_body()
        body = b'{"ok":true,"from":"the purchase API stand-in of scripts/dev.sh"}\n'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = answer

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), StandIn).serve_forever()

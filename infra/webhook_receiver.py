"""A webhook receiver for the tests: verifies every delivery with the
`standardwebhooks` package (the Standard Webhooks reference library, not
the service's own code) and records what it saw.

    python webhook_receiver.py    # prints "listening <port>", then serves

POST /hooks/<name>   a delivery; verified with the secrets configured for
                     <name>; answers the configured status (after the
                     configured delay) when it verifies, 401 when not
PUT  /config/<name>  {"secrets": ["whsec_..."], "status": 200, "delay": 0}
GET  /received       every delivery so far, in arrival order: name, headers,
                     body, and which configured secrets verified it
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook

lock = threading.Lock()
configs = {}
received = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body=b"{}"):
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        return self.rfile.read(int(self.headers.get("content-length", "0")))

    def do_PUT(self):
        name = self.path.removeprefix("/config/")
        with lock:
            configs[name] = json.loads(self.body())
        self.reply(200)

    def do_GET(self):
        with lock:
            snapshot = json.dumps(received).encode()
        self.reply(200, snapshot)

    def do_POST(self):
        name = self.path.removeprefix("/hooks/")
        body = self.body()
        headers = {key.lower(): value for key, value in self.headers.items()}
        with lock:
            config = dict(configs.get(name, {}))
        verified_by = []
        for index, secret in enumerate(config.get("secrets", [])):
            try:
                Webhook(secret).verify(body, headers)
                verified_by.append(index)
            except Exception:
                pass
        with lock:
            received.append(
                {
                    "name": name,
                    "headers": {key: headers.get(key) for key in ("webhook-id", "webhook-timestamp", "webhook-signature", "content-type")},
                    "body": body.decode("utf-8", "replace"),
                    "verified_by": verified_by,
                    "at": time.time(),
                }
            )
        if not verified_by:
            self.reply(401, b'{"error": "signature not verified"}')
            return
        time.sleep(config.get("delay", 0))
        status = config.get("status", 200)
        if status in (301, 302, 307, 308):
            self.send_response(status)
            self.send_header("location", config.get("location", "/hooks/redirected"))
            self.send_header("content-length", "0")
            self.end_headers()
            return
        self.reply(status)


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # A sender killed mid-request (the kill -9 test) is expected.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main():
    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())

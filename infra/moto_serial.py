"""moto's server, answering one DynamoDB request at a time.

DynamoDB runs each TransactWriteItems as one serializable step. moto applies
a transaction item by item and, when one fails, restores a copy of the table
taken when it began, on threads that serve other requests meanwhile: two
transactions on one item can then both pass their conditions, and a
rollback can erase a write another request already reported done. One
DynamoDB request at a time is what the real service promises for these
calls. Other services go on in parallel (an SQS long poll holds its request
for up to 20 seconds).

Usage: python infra/moto_serial.py PORT
"""

import os
import sys
import threading

# As moto's own server does: queue URLs and the like carry the port.
os.environ.setdefault("MOTO_PORT", sys.argv[1] if len(sys.argv) > 1 else "5000")

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

app = DomainDispatcherApplication(create_backend_app)
app.debug = True
one_at_a_time = threading.Lock()


def serial(environ, start_response):
    if not environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB"):
        return app(environ, start_response)
    with one_at_a_time:
        # The body is produced inside the lock as well.
        return list(app(environ, start_response))


if __name__ == "__main__":
    run_simple("127.0.0.1", int(sys.argv[1]), serial, threaded=True, request_handler=MotoRequestHandler)

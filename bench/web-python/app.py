"""Baseline of the published Python designs of the matrix service (Flask).

Same API as `leantier web serve` (POST /matrix, the published JSON) so the same load driver
measures both. Two modes, as in the study:

* ``single``: one process, one request at a time (Flask's server with threading off);
* ``multiprocessing``: a threaded Flask server that hands each HTTP request to a pool of worker
  processes (one per CPU), i.e. multiprocessing per request.

The multiplication is the straightforward pure-Python one (rows of A against columns of B).
Started by scripts/bench-web from a virtual environment with requirements.txt installed.
"""

import argparse
import json
import logging
import multiprocessing
import os

from flask import Flask, Response, request

SHAPE_MESSAGE = "Invalid number of columns and rows for multiplication"


def failure(request_id, code, message, status):
    body = {"requestId": request_id, "errorCode": code, "errorMessage": message}
    return status, json.dumps(body)


def parse_matrix(matrix):
    columns = matrix["columnCount"]
    rows = [[int(cell) for cell in row["value"].split(",")] for row in matrix["rows"]]
    return columns, rows


def handle(body):
    """Parse, validate, multiply and render one request: (HTTP status, JSON text)."""
    try:
        req = json.loads(body)
    except ValueError:
        return failure(None, "002", "Malformed JSON", 400)
    request_id = req.get("requestId") if isinstance(req, dict) else None
    try:
        columns_one, one = parse_matrix(req["matrixOne"])
        columns_two, two = parse_matrix(req["matrixTwo"])
    except (KeyError, TypeError):
        return failure(request_id, "003", "Missing field", 400)
    except ValueError:
        return failure(request_id, "004", "Non-numeric cell", 400)
    if columns_one != len(two):
        return failure(request_id, "001", SHAPE_MESSAGE, 422)
    if any(len(row) != columns_one for row in one) or any(len(row) != columns_two for row in two):
        return failure(request_id, "005", "Row length mismatch", 400)
    columns = list(zip(*two))
    product = [[sum(a * b for a, b in zip(row, column)) for column in columns] for row in one]
    return 200, json.dumps({"requestId": str(request_id), "rows": product})


def make_app(run):
    app = Flask(__name__)

    @app.post("/matrix")
    def matrix():
        status, text = run(request.get_data())
        return Response(text, status=status, mimetype="application/json")

    return app


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["single", "multiprocessing"], default="single")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args()
    # Per-request access logs would dominate the cost of small requests.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    if args.mode == "single":
        make_app(handle).run(host="127.0.0.1", port=args.port, threaded=False)
    else:
        pool = multiprocessing.get_context("fork").Pool(os.cpu_count())
        make_app(lambda body: pool.apply(handle, (body,))).run(
            host="127.0.0.1", port=args.port, threaded=True
        )


if __name__ == "__main__":
    main()

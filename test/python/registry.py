"""A small schema registry for the tests: the part of Confluent Schema Registry's REST API that
Confluent's serializers (confluent-kafka) and streaming_etl use. No registry server can be
installed on these machines (Apicurio and Confluent's come from Maven, which is out of reach),
so this one stands in. Schemas are kept in memory; the same schema (text, type, references)
under any subject gets the same id, as in Confluent's.

    python registry.py --port 8081 [--user name:secret]

Endpoints: POST /subjects/{s}/versions, POST /subjects/{s} (lookup), GET /schemas/ids/{id},
GET /subjects/{s}/versions/{v|latest}, GET /subjects, GET /schemas/ids/{id}/versions.
"""

import argparse
import base64
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class Store:
    def __init__(self):
        self.lock = threading.Lock()
        self.schemas = []  # id - 1 -> (type, text, references)
        self.subjects = {}  # subject -> [id, ...] (version - 1 -> id)

    def register(self, subject, body):
        key = (body.get("schemaType", "AVRO"), body["schema"], json.dumps(body.get("references", []), sort_keys=True))
        with self.lock:
            if key in self.schemas:
                sid = self.schemas.index(key) + 1
            else:
                self.schemas.append(key)
                sid = len(self.schemas)
            versions = self.subjects.setdefault(subject, [])
            if sid not in versions:
                versions.append(sid)
            return sid, versions.index(sid) + 1

    def answer(self, sid):
        kind, text, refs = self.schemas[sid - 1]
        out = {"schema": text, "references": json.loads(refs)}
        if kind != "AVRO":
            out["schemaType"] = kind
        return out


class Handler(BaseHTTPRequestHandler):
    store = None
    user = None
    requests = None

    def log_message(self, *args):
        pass

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self):
        if self.user is None:
            return True
        want = "Basic " + base64.b64encode(self.user.encode()).decode()
        if self.headers.get("Authorization") == want:
            return True
        self.reply(401, {"error_code": 40101, "message": "Unauthorized"})
        return False

    def parts(self):
        url = urlparse(self.path)
        return [unquote(p) for p in url.path.strip("/").split("/")]

    def do_GET(self):
        self.requests.append(("GET", self.path))
        if not self.authorized():
            return
        p = self.parts()
        s = self.store
        try:
            if p[:2] == ["schemas", "ids"] and len(p) == 3:
                sid = int(p[2])
                if not 1 <= sid <= len(s.schemas):
                    return self.reply(404, {"error_code": 40403, "message": "Schema not found"})
                return self.reply(200, s.answer(sid))
            if p[:2] == ["schemas", "ids"] and len(p) == 4 and p[3] == "versions":
                sid = int(p[2])
                out = [{"subject": k, "version": v.index(sid) + 1} for k, v in s.subjects.items() if sid in v]
                return self.reply(200, out)
            if p == ["subjects"]:
                return self.reply(200, sorted(s.subjects))
            if len(p) == 4 and p[0] == "subjects" and p[2] == "versions":
                versions = s.subjects.get(p[1])
                if not versions:
                    return self.reply(404, {"error_code": 40401, "message": "Subject not found"})
                v = len(versions) if p[3] == "latest" else int(p[3])
                if not 1 <= v <= len(versions):
                    return self.reply(404, {"error_code": 40402, "message": "Version not found"})
                sid = versions[v - 1]
                return self.reply(200, {"subject": p[1], "version": v, "id": sid, **s.answer(sid)})
        except ValueError:
            pass
        self.reply(404, {"error_code": 404, "message": f"not served here: {self.path}"})

    def do_POST(self):
        self.requests.append(("POST", self.path))
        if not self.authorized():
            return
        n = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(n) or b"{}")
        p = self.parts()
        s = self.store
        if len(p) == 3 and p[0] == "subjects" and p[2] == "versions":
            sid, _ = s.register(p[1], body)
            return self.reply(200, {"id": sid})
        if len(p) == 2 and p[0] == "subjects":
            sid, version = s.register(p[1], body)
            return self.reply(200, {"subject": p[1], "version": version, "id": sid, **s.answer(sid)})
        self.reply(404, {"error_code": 404, "message": f"not served here: {self.path}"})


def serve(port, user=None, cert=None, key=None):
    """Starts a registry on 127.0.0.1:port in a thread of this process (HTTPS with cert and
    key); returns the server."""
    handler = type("H", (Handler,), {"store": Store(), "user": user, "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    if cert:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--user", help="name:secret: require HTTP basic authentication")
    a = ap.parse_args()
    server = serve(a.port, a.user)
    print(f"schema registry on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()

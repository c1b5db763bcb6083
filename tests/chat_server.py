"""A chat-completions server on 127.0.0.1 that answers from a script, for the LLM client and the
operators that call one."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatServer:
    """Answers POST /v1/chat/completions from a script of steps: ("ok", text), ("status", code) or
    ("sleep", seconds). The last step repeats. Records every request body."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body})
                kind, arg = server.script.pop(0) if len(server.script) > 1 else server.script[0]
                if kind == "sleep":
                    time.sleep(arg)
                    kind, arg = "ok", "late"
                if kind == "status":
                    self._send(arg, {"error": {"message": f"status {arg}", "type": "server_error"}})
                    return
                self._send(200, {
                    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": arg}}],
                    "usage": {"prompt_tokens": 21, "completion_tokens": 4, "total_tokens": 25},
                })

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
